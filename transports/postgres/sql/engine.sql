-- The statements of the delivery engine (engine.go): fetching (lanes, then
-- rows), settling, reconciling and extending leases, and the lane sweep.
--
-- The SQL of each block is byte for byte the text queries.go built before the
-- statements moved here; see sql.go for the placeholders ({T}, {L} and the
-- consumer-group conditions that only an inbox table has).

-- name: LeaseLanes
-- The fetch is two statements in one short transaction (engine.fetch):
--
-- leaseLanes takes up to $1 ready lanes (keys), oldest ready first. For
-- each it takes the lane's advisory lock exclusively, with a try: every
-- writer of a key holds that lock shared from before its rows get their
-- ids until it commits (the lane trigger, migration 0004), so a lane with a
-- writer in flight is skipped, and no row of a key is handed out while a
-- row with a smaller id may still commit (DESIGN §4.3 rule 6). The lock is
-- held until the fetch commits, so pick, a later statement with a later
-- snapshot, sees every row of those keys that will ever have a smaller id
-- than the rows it hands out.
--
-- The candidates (twice the batch, for lanes a writer holds) are chosen and
-- row-locked first, in a materialised CTE, and only they are tried, until
-- the batch is full: a try in the scan's own filter would be evaluated for
-- every ready lane whenever the planner sorts instead of reading the
-- ready_at index, taking every bucket's lock for the length of the fetch
-- and holding every writer back (seen with stale statistics on a table of
-- 66,000 lanes: two relays delivered 90 events/s).
WITH c AS MATERIALIZED (
    SELECT c.consumer_group, c.topic, c.partition_key, c.floor_id, c.run_by, c.run_end, c.run_at, c.locked_until
    FROM {L} c
    WHERE c.ready_at <= statement_timestamp()
      AND (c.locked_until IS NULL OR c.locked_until < statement_timestamp())
      AND ($2::text IS NULL OR c.topic = $2)
      AND c.consumer_group = $3 -- outbox lanes all belong to the group ''
    ORDER BY c.ready_at
    LIMIT 2 * $1
    FOR UPDATE SKIP LOCKED
), taken AS (
    SELECT c.*
    FROM c
    WHERE pg_try_advisory_xact_lock({LANE_LOCK_C})
    LIMIT $1
), {LOST_RUN}
{LEASE_TAKEN}

-- fragment: LeaseTaken
-- The end of LeaseLanes and LeaseLane ({LEASE_TAKEN}): the lanes taken are
-- returned with their floors, row-locked until the fetch commits. They are
-- not written here: Pick, the next statement of the fetch's transaction,
-- leases them to this worker and notes their runs in one write of each lane
-- (a lease written here and a run written there were two versions of every
-- lane a fetch took, each with its WAL record). Nobody else can lease them
-- meanwhile: leasing takes the same row lock.
SELECT c.consumer_group, c.topic, c.partition_key, c.floor_id FROM taken c

-- fragment: LostRun
-- A fragment of LeaseLanes and LeaseLane ({LOST_RUN}): the CTE lost, over
-- the lanes being leased (taken, with their values before the lease). A
-- lane that still has a run (run_by, run_end: migration 0010) lost its last
-- lease without a give-back: the relay holding it died or lost the lease
-- while it handled the run. Each row of that run still pending gets what a
-- row lease of that relay would have left: the delivery counted (attempts
-- + 1) and the lease, expired, in locked_by and locked_until. Pick, the
-- next statement, then treats those rows as left over from an expired lease
-- (one at a time; failed once their attempts are spent), as it did when
-- every row was leased on its own. Rows of the run the relay settled are not
-- pending (acked), or were taken out of the run by their settlement (a
-- failure or a release lowers run_end: Settle). A row a relay leased on its
-- own (locked_by set) is already what this makes. A row that was not due
-- when the first run was handed out (run_at) is left alone: it may not
-- have been handed out (a delayed row is not in line and a run passes it),
-- and counting it, or making it look left over, would make a delayed row
-- hold its key back. So a row written with a delivery time between two
-- runs of one lease goes uncounted once if that lease is lost; the next
-- lease that hands it out counts it when it is lost.
lost AS (
    UPDATE {T} t
    SET locked_by = k.run_by, locked_until = COALESCE(k.locked_until, statement_timestamp()), attempts = t.attempts + 1
    FROM taken k
    {LOST_ROWS}
)

-- fragment: LostRows
-- {LOST_ROWS} of LostRun and ReleaseExpiredLanes: the rows t of the run of
-- lane k that its lost lease handed out and nobody settled (see LostRun).
WHERE k.run_by IS NOT NULL
  AND t.topic = k.topic{G_TK}
  AND t.status = 'pending' AND t.locked_by IS NULL
  AND (t.partition_key, t.id) >= (k.partition_key, k.floor_id)
  AND (t.partition_key, t.id) <= (k.partition_key, k.run_end)
  AND t.scheduled_at <= k.run_at

-- name: TakeNotes
-- The first statement of every fetch: it turns the notes writers left (a
-- key without a lane, or whose lane sleeps past the writer's row) into
-- lanes, oldest first, at most 1,000 at a time. A lane is created ready at
-- its note's time, or woken to it; a blocked lane (FailedBlock) stays
-- asleep. Notes are only ever inserted by writers and deleted here, so
-- writers never wait for this statement, nor it for them; it takes the lane
-- rows in key order, so two relays taking notes wait for each other at
-- most.
--
-- The notes are chosen into an array, not joined: the notes table's
-- statistics swing between empty and thousands of rows, and a plan made
-- while it looked empty (a nested loop re-reading the table for each note)
-- took up to 11 s per fetch once thousands had piled up (seen after a
-- vacuum in make soak-horizon). id = ANY(array) is read from the primary
-- key, or hashed in a scan, whatever the estimate.
--
-- A lane made from notes starts its floor at the smallest row id of its
-- notes (migration 0008), and a note with a smaller id than a lane's floor
-- (a writer that committed after the lane was made from the others, or a
-- lane a requeue made) moves the floor down to it.
WITH n AS (
    DELETE FROM {N} n
    WHERE n.id = ANY(ARRAY(SELECT x.id FROM {N} x ORDER BY x.id LIMIT 1000 FOR UPDATE SKIP LOCKED))
    RETURNING n.consumer_group, n.topic, n.partition_key, n.ready_at, n.row_id
)
INSERT INTO {L} AS l (consumer_group, topic, partition_key, ready_at, floor_id)
SELECT n.consumer_group, n.topic, n.partition_key, min(n.ready_at), min(n.row_id)
FROM n
GROUP BY 1, 2, 3
ORDER BY 1, 2, 3
ON CONFLICT (consumer_group, topic, partition_key)
DO UPDATE SET ready_at = CASE WHEN l.ready_at > EXCLUDED.ready_at AND NOT l.blocked THEN EXCLUDED.ready_at ELSE l.ready_at END,
              floor_id = LEAST(l.floor_id, EXCLUDED.floor_id)
WHERE (l.ready_at > EXCLUDED.ready_at AND NOT l.blocked) OR l.floor_id > EXCLUDED.floor_id

-- name: Pick
-- Both statements compare with statement_timestamp(), not now(): now()
-- is the start of the fetch's transaction, and a writer whose transaction
-- started after it but committed before our lane lock has a scheduled_at
-- (its own now()) later than that. Its row would look delayed, never
-- tried, and not hold its key back: the rows behind it would go first.
--
-- pick leases to this worker ($1) the lanes leaseLanes, LeaseLane or
-- KeepLane returned and holds locked ($3..$5; for KeepLane only while the
-- lane is still this worker's), and chooses the rows of those lanes and up
-- to $7 unkeyed rows:
--  line:  for each lane, the first $6 rows that are "in line" (due, leased,
--         or tried and waiting), in id order. Delayed rows never tried are
--         not in line and hold nothing back. With the Block policy ($10)
--         a failed row holds back every later row of its key.
--  run:   the longest prefix of those rows that is deliverable now (due and
--         not leased): the key's head and the run behind it. It ends at
--         the first row left over from a lease that expired without a
--         settlement (locked_by still set): the process holding it may
--         have died on it, and every row of a run is counted when it is
--         leased, so rows behind a message that kills the process are not
--         leased with it again and again. After a crash the key goes one
--         such row at a time; only the message that kills the process
--         spends its attempts. With $12 (engine.next, which takes a
--         key's next run before the acks of the last one are surely
--         written) such a row does not start a run either: the key is
--         given back, its acks are written, and a fetch takes the row.
--  loose: up to $7 due unkeyed rows, locked FOR UPDATE SKIP LOCKED.
-- picked leases them, re-checking at lock time that each row is still
-- pending, due and free (a relay whose lease expired may settle a row
-- between our snapshot and our lock). A run row that fails the re-check
-- ends its run: ok is false for it and every row behind it, and the
-- caller releases those it leased.
--
-- A delivery is counted when it is leased (attempts + 1, as River does),
-- so a message whose handling kills the process still spends its
-- attempt; the settlement then takes back what it should not have cost
-- (a transient failure, a row released unhandled). A row still leased
-- (locked_by set, its lease expired) lost its last lease without a
-- settlement; when its attempts are all spent, picked fails it instead,
-- saying so (spent), and does not hand it out again: like any row picked
-- does not lease, it ends its run. One UPDATE does both, so each row is
-- found once (a second UPDATE for the spent rows probed the primary key for
-- every row of the batch again, to find none: a fifth of the statement's
-- time in BenchmarkRelayDrain). A leased row's status is given its own
-- value back, which keeps the lease a HOT update. RETURNING gives attempts
-- spent before this delivery, which is what bus.Delivery reports.
--
-- picked addresses its rows by (id, created_at), the primary
-- key of both layouts' rows (on the single table id alone is): by id alone
-- on a partition, whose primary key is (id, created_at), the planner
-- expected several rows per id and read each through the key index with
-- only id to go by, a scan of that whole index per row (90-130 ms per fetch
-- in the partitioned layout's BenchmarkWALPerEvent, with the writers of
-- the fetched keys waiting for it); with created_at it finds each row by
-- one probe of one partition. Its status re-check is written
-- "(status = 'pending') IS TRUE", the same condition in a form no partial
-- index's predicate matches, so no index but the primary key can serve them
-- whatever the statistics (a generic plan made while a partition ahead was
-- empty would otherwise keep reading it through the key index by id once it
-- fills).
--
-- A lane's rows are read from its floor, or from the smallest row id of the
-- key's notes not yet taken when that is lower: a writer that committed
-- after this fetch took the notes (a lane made from notes starts at their
-- smallest id, TakeNotes) but before it leased the lane has a note and
-- may have a row below the floor. Not so for a key's next run ($12): its
-- start ($11) is one past the last row its relay handed out, and every row
-- below that was in the snapshot of the pick that handed it out.
WITH lane AS (
    SELECT k.consumer_group, k.topic, k.partition_key,
           CASE WHEN $12::boolean THEN k.floor_id
                ELSE LEAST(k.floor_id, (SELECT min(n.row_id) FROM {N} n
                                        WHERE n.consumer_group = k.consumer_group AND n.topic = k.topic
                                          AND n.partition_key = k.partition_key)) END AS floor_id
    FROM unnest($3::text[], $4::text[], $5::text[], $11::bigint[]) AS k(consumer_group, topic, partition_key, floor_id)
    JOIN {L} l ON l.consumer_group = k.consumer_group AND l.topic = k.topic AND l.partition_key = k.partition_key
    -- A fetch's lanes are the ones LeaseLanes (or LeaseLane) took and holds
    -- locked; a key's next run ($12) is taken only while the lane is still
    -- this worker's (KeepLane found no row otherwise).
    WHERE NOT $12::boolean OR l.locked_by = $1
), run AS (
    -- line and run are made for each lane inside its lateral subquery: the
    -- key's rows come out of the key index in id order, so their windows
    -- need no sort. (Computed over all lanes' rows, with their payloads,
    -- they sorted every row a fetch hands out: a tenth of Pick's time in
    -- BenchmarkRelayDrain.)
    SELECT lane.topic, lane.partition_key, r.*
    FROM lane CROSS JOIN LATERAL (
        SELECT x.id, x.created_at, x.leftover,
               x.event_id, x.event_type, x.payload, x.metadata, x.attempts, x.max_attempts
        FROM (
            SELECT line.*,
                   bool_and(line.deliverable) OVER w AS ok,
                   COALESCE(bool_or(line.leftover) OVER (w ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), false) AS after_leftover
            FROM (
                SELECT t.partition_key AS pkey, t.id, t.created_at,
                       (t.scheduled_at <= statement_timestamp() AND (t.locked_until IS NULL OR t.locked_until < statement_timestamp())) AS deliverable,
                       t.locked_by IS NOT NULL AS leftover,
                       t.event_id, t.event_type, t.payload, t.metadata, t.attempts, t.max_attempts
                FROM {T} t
                WHERE t.topic = lane.topic{G_T}
                  -- The key and its floor as a range of row comparisons on
                  -- (partition_key, id), the key index's last columns: the
                  -- primary key cannot serve them, so even a generic plan
                  -- (engine.next) reads the key index from the floor,
                  -- instead of scanning the primary key from the floor over
                  -- every key's rows. (Written as an equality on
                  -- partition_key and id >= floor, the index scan would start
                  -- at the key's first entry and visit the dead entry of
                  -- every row of the key completed since its last vacuum.)
                  AND t.status = 'pending'
                  AND (t.partition_key, t.id) >= (lane.partition_key, lane.floor_id)
                  AND (t.partition_key, t.id) <= (lane.partition_key, 9223372036854775807)
                  AND (t.scheduled_at <= statement_timestamp() OR t.locked_until IS NOT NULL OR t.last_error IS NOT NULL)
                  AND NOT ($10::boolean AND EXISTS (
                      SELECT 1 FROM {T} f
                      WHERE f.topic = lane.topic AND f.partition_key = lane.partition_key{G_F}
                        AND f.status = 'failed' AND f.id < t.id))
                ORDER BY t.partition_key, t.id -- one key: the order of ids, and of the key index
                LIMIT $6
            ) line
            WINDOW w AS (ORDER BY line.pkey, line.id)
        ) x
        WHERE x.ok AND NOT x.after_leftover AND NOT (x.leftover AND $12::boolean)
    ) r
), ran AS (
    -- Every lane is leased to this worker ($1, for $2), and its run noted
    -- in the same write: the lane's lease covers the rows of the run that
    -- are not left over; they are not written to. A fetch's lane starts a
    -- new run (none when the lane has nothing to hand out: it is leased
    -- idle, and given back); a key's next run ($12) extends the lane's run.
    UPDATE {L} l
    SET locked_by = $1, locked_until = statement_timestamp() + $2::interval,
        run_by = CASE WHEN r.last IS NOT NULL THEN $1 WHEN $12::boolean THEN l.run_by END,
        run_end = CASE WHEN $12::boolean THEN GREATEST(l.run_end, r.last) ELSE r.last END,
        run_at = CASE WHEN $12::boolean AND l.run_at IS NOT NULL THEN l.run_at
                      WHEN r.last IS NOT NULL THEN statement_timestamp() END
    FROM lane k
    LEFT JOIN (SELECT topic, partition_key, max(id) AS last FROM run WHERE NOT leftover GROUP BY 1, 2) r
      ON r.topic = k.topic AND r.partition_key = k.partition_key
    WHERE l.consumer_group = k.consumer_group AND l.topic = k.topic AND l.partition_key = k.partition_key
), loose AS (
    SELECT t.id, t.created_at
    FROM {T} t
    WHERE t.status = 'pending' AND t.partition_key IS NULL AND t.scheduled_at <= statement_timestamp()
      AND (t.locked_until IS NULL OR t.locked_until < statement_timestamp())
      AND ($8::text IS NULL OR t.topic = $8){GP_T}
    ORDER BY t.scheduled_at, t.id
    LIMIT $7
    FOR UPDATE SKIP LOCKED
), picked AS (
    UPDATE {T} t
    SET status       = CASE WHEN t.locked_by IS NOT NULL AND t.attempts >= t.max_attempts THEN 'failed' ELSE t.status END,
        last_error   = CASE WHEN t.locked_by IS NOT NULL AND t.attempts >= t.max_attempts
                            THEN format('omnibus: gave up after %s attempts: the last delivery''s lease expired without a settlement '
                                        '(the process handling it died or lost its lease: a panic past the Recoverer, os.Exit, OOM)', t.attempts)
                                 || COALESCE('; the error before: ' || t.last_error, '')
                            ELSE t.last_error END,
        locked_by    = CASE WHEN t.locked_by IS NOT NULL AND t.attempts >= t.max_attempts THEN NULL ELSE $1 END,
        locked_until = CASE WHEN t.locked_by IS NOT NULL AND t.attempts >= t.max_attempts THEN NULL
                            ELSE statement_timestamp() + $2::interval END,
        attempts     = CASE WHEN t.locked_by IS NOT NULL AND t.attempts >= t.max_attempts THEN t.attempts ELSE t.attempts + 1 END
    WHERE (t.id, t.created_at) IN (SELECT id, created_at FROM run WHERE leftover UNION ALL SELECT id, created_at FROM loose)
      AND (t.status = 'pending') IS TRUE AND t.scheduled_at <= statement_timestamp()
      AND (t.locked_until IS NULL OR t.locked_until < statement_timestamp())
    RETURNING t.status = 'failed' AS spent, t.id, t.event_id::text, t.topic, t.partition_key, t.event_type, t.payload, t.metadata,
              t.attempts - 1 AS attempts, t.max_attempts, t.created_at
), handed AS (
    SELECT id, bool_and(got) OVER (PARTITION BY topic, partition_key ORDER BY id) AS ok
    FROM (SELECT r.id, r.topic, r.partition_key, NOT r.leftover OR r.id IN (SELECT id FROM picked WHERE NOT spent) AS got
          FROM run r
          -- Only a row left over can be missing from picked; without one,
          -- every row of every run is handed out, and nothing is sorted.
          WHERE EXISTS (SELECT 1 FROM run x WHERE x.leftover)) r
)
-- The joins with picked are written as IN over an uncorrelated subquery
-- (a hashed SubPlan), not as joins: the planner cannot estimate how many
-- rows the CTEs hold, and a nested loop over two of them was quadratic
-- (a fetch of 1,000 rows took 300 ms).
SELECT NOT (p.id IN (SELECT id FROM handed WHERE NOT ok)) AS ok, true AS own, p.id, p.event_id, p.topic, p.partition_key,
       p.event_type, p.payload, p.metadata, p.attempts, p.max_attempts, p.created_at
FROM picked p
WHERE NOT p.spent
UNION ALL
SELECT NOT (r.id IN (SELECT id FROM handed WHERE NOT ok)), false, r.id, r.event_id::text, r.topic, r.partition_key,
       r.event_type, r.payload, r.metadata, r.attempts, r.max_attempts, r.created_at
FROM run r
WHERE NOT r.leftover

-- name: LaneLock
-- A relay waits its turn on a lane that writers never leave free (a hot key
-- with overlapping writers, where a try would fail forever): it waits, with
-- a lock timeout, for the lane's advisory lock. PostgreSQL queues the
-- writers that arrive after it behind its request, so it waits only for the
-- writers that came before. Then it leases the lane as leaseLanes does.
SELECT pg_advisory_xact_lock({LANE_LOCK})

-- name: LeaseLane
WITH taken AS (
    SELECT c.consumer_group, c.topic, c.partition_key, c.floor_id, c.run_by, c.run_end, c.run_at, c.locked_until
    FROM {L} c
    WHERE c.consumer_group = $1 AND c.topic = $2 AND c.partition_key = $3
      AND c.ready_at <= statement_timestamp()
      AND (c.locked_until IS NULL OR c.locked_until < statement_timestamp())
    FOR UPDATE
), {LOST_RUN}
{LEASE_TAKEN}

-- name: Bookkeeping
-- Bookkeeping is the first statement of every transaction of the engine
-- (engine.go says why): they change only its own state, and commit without
-- waiting for the WAL flush. They also run without sequential scans: every
-- statement of the engine reads its rows through an index, and pgx prepares
-- them, so PostgreSQL keeps a plan per connection until the tables'
-- statistics change. Planned on a table analysed while empty (a freshly
-- migrated one), the fetch scanned the whole table for each lane and each
-- picked row, at every fetch, for as long as the connection lived
-- (BenchmarkNotifyLatency: commit→delivery p50 1.5–2.4 ms with sequential
-- scans off, 2.9–4.0 ms with them on).
--
-- And without JIT compilation: every statement of the engine is short, and
-- its costs, inflated by the disabled sequential scans and the per-row
-- lookups of lanes in the settlement's guard (a plan cost of 4 million on a
-- partitioned outbox), are past jit_above_cost, so PostgreSQL compiled each
-- settlement: 630 ms of a statement that runs in 10 (the partitioned layout's
-- pinned stand stalled at 400 events/s on it).
SELECT set_config('synchronous_commit', 'off', true), set_config('enable_seqscan', 'off', true),
       set_config('jit', 'off', true)

-- name: SettlePlans
-- SettlePlans comes right before Settle (and ExtendRows) in its
-- transaction: no nested loops, so its joins of arrays with rows are hashed
-- (see Settle), and no
-- sequential scans, so its rows are read through the primary key whatever
-- the table's statistics say: a generic plan made while the table (or a
-- partition created ahead) was empty scanned all of it, and kept doing so
-- for every settlement as it grew, until something analysed it (with
-- autovacuum off, never). It keeps the two settings' values first (in
-- settings of its own, local to the transaction), and PlanJoins puts them
-- back for the statements after it.
SELECT set_config('enable_nestloop', 'off', true), set_config('enable_seqscan', 'off', true)
FROM (SELECT set_config('omnibus.saved_enable_nestloop', current_setting('enable_nestloop'), true),
             set_config('omnibus.saved_enable_seqscan', current_setting('enable_seqscan'), true)) saved

-- name: PlanJoins
-- Reading them back from pg_settings instead (which builds a row for every
-- setting of the server) took about 1 ms, paid by every next run of a key
-- that carried acks (BenchmarkSingleKeyDrain: 9,100 → 7,100 events/s).
SELECT set_config('enable_nestloop', current_setting('omnibus.saved_enable_nestloop'), true),
       set_config('enable_seqscan', current_setting('omnibus.saved_enable_seqscan'), true)

-- name: IndexPlans
-- IndexPlans is the first statement of the engine's transactions that do
-- not start with Bookkeeping because they must commit synchronously (lease
-- renewal: a relay trusts a renewed lease until its deadline) or are not
-- bookkeeping (the starved-lane lookup, the lane sweep): no sequential
-- scans, for the reason Bookkeeping gives. Planned on an empty lanes table,
-- the renewal of a relay's lanes scanned the whole lanes table at every
-- renewal (48 ms and 11,494 buffers per renewal after four minutes of the
-- pinned-horizon stand, whose lanes table holds every version since the pin).
SELECT set_config('enable_seqscan', 'off', true), set_config('jit', 'off', true)

-- name: GenericPlans
-- GenericPlans makes the rest of a fetch's transaction (engine.inTx) and of
-- engine.next's use generic plans: they are planned once per connection
-- instead of at every fetch and every run of a key (planning Pick cost more
-- than running it for one key; left to choose, PostgreSQL planned every
-- fetch's Pick anew, 5 % of the server's CPU in BenchmarkRelayDrain). Their
-- plans do not depend on the values of the parameters: Pick reaches a key's
-- rows only through the key index (see its floor condition), LeaseLanes its
-- candidates through the ready_at index, and Bookkeeping turned sequential
-- scans off before either is planned.
SELECT set_config('plan_cache_mode', 'force_generic_plan', true)

-- name: KeepLane
-- KeepLane keeps a lane this worker holds for its next run (engine.next):
-- it locks the lane's row and takes the lane's advisory lock with a try
-- ({LANE_LOCK_FN}, migration 0005), which fails the batch at once
-- (lock_not_available) while a writer of the key is in flight, so that
-- Pick, the next statement of the same transaction, sees every row that
-- will ever have a smaller id than the rows it hands out, as after
-- LeaseLanes. Pick renews the lease, in the write that notes the run. No row
-- when the lease is no longer ours.
SELECT c.floor_id
FROM {L} c
WHERE c.consumer_group = $2 AND c.topic = $3 AND c.partition_key = $4 AND c.locked_by = $1
  AND {LANE_LOCK_FN}(c.consumer_group, c.topic, c.partition_key)
FOR NO KEY UPDATE NOWAIT

-- name: StarvedLanes
-- starved lists lanes that have been ready and free for $1 without any
-- relay leasing them: writers are holding them.
SELECT l.consumer_group, l.topic, l.partition_key
FROM {L} l
WHERE l.ready_at <= now() - $1::interval
  AND (l.locked_until IS NULL OR l.locked_until < now())
  AND ($2::text IS NULL OR l.topic = $2)
  AND l.consumer_group = $3
ORDER BY l.ready_at
LIMIT $4

-- name: Settle
-- Settlement of many rows in one statement, guarded by the lease so a
-- worker whose lease was taken over never clobbers the new holder's row.
-- Acks ($2, with $12 the attempts their lease set) are addressed by
-- id = ANY(...), which the planner always serves from the primary key, and
-- matched with their leases by a join that must not be a nested loop (the
-- SettlePlans statement before it turns nested loops off): a nested loop
-- re-reads the whole unnested array for each row, a join filter quadratic
-- in the batch (157 ms for 1,000 acks instead of 14, the relay's bottleneck
-- in BenchmarkRelayDrain), and its generic plan, which PostgreSQL switches
-- prepared statements to, estimates the arrays at 10 elements and picks one.
-- An ack completes the row even from an older lease (it was delivered) and
-- takes back its lease's count when it is the current one, so a completed
-- row's attempts are its counted failures. Releases ($3, rows given back unhandled,
-- with $10 the attempts their lease set) and failures ($4..$9, few)
-- carry the attempts value of the lease they settle: the lease counted
-- the delivery, a release takes it back, a failure keeps it (inc 1) or
-- takes it back (inc 0, transient), and a settlement from an older lease
-- of the same row (re-leased after its lease expired, even by the same
-- worker) changes nothing, so attempts equal the counted failures
-- exactly. op n = nack (may fail the row), p = plain nack (counts an
-- attempt, retries after TransientDelay, keeps the row pending: a Nack
-- without a settlement means "deliver again", as everywhere in
-- Watermill).
--
-- A row of a run the lane's lease covers (migration 0010) was not written to
-- when it was handed out: it is pending with locked_by NULL and the
-- attempts it had (one less than its lease value). Its guard is the lane's
-- run: run_by is this worker and run_end is at or above the row. An ack
-- names its row's run ($16, an index into the keys $13, $14 of the runs
-- the acks belong to; 0 for a row with a lease of its own), and each run
-- is looked up once, by the lanes' primary key (runs), not once per row: a
-- probe per acked row cost the relay 5-8 % of its drain. A failure, rare,
-- looks its run up itself. An ack completes the row; a failure counts from
-- there (attempts + inc); a release has nothing to undo. A failure or a release takes the row out of its lane's run
-- (run_end below it; cut), so that a lease taking the lane over does not
-- count a delivery of it again. When the lane's lease was taken over meanwhile,
-- that lease wrote the row as left over from ours (LostRun): locked_by is
-- ours again and the row lease's rules apply.
WITH runs AS (
    SELECT k.i::int AS i, k.topic, k.partition_key,
           (SELECT l.run_end FROM {L} l
            WHERE l.consumer_group = $15 AND l.topic = k.topic AND l.partition_key = k.partition_key
              AND l.run_by = $1) AS run_end
    FROM unnest($13::text[], $14::text[]) WITH ORDINALITY AS k(topic, partition_key, i)
), acks AS MATERIALIZED (
    -- Each ack with its run's key and end, joined before the rows are:
    -- the rows are then matched with one hash of the acks (joining the
    -- runs last hashed the acks with their rows, all of their columns, a
    -- second time).
    SELECT u.id, u.lease, r.topic, r.partition_key, r.run_end
    FROM unnest($2::bigint[], $12::int[], $16::int[]) AS u(id, lease, run)
    LEFT JOIN runs r ON r.i = u.run
), acked AS (
    UPDATE {T} t
    SET status = 'completed', completed_at = now(), locked_by = NULL, locked_until = NULL,
        attempts = t.attempts - (t.attempts = u.lease)::int
    FROM acks u
    WHERE t.id = u.id AND t.id = ANY($2::bigint[])
      AND (t.locked_by = $1
           OR (t.locked_by IS NULL AND t.status = 'pending'
               AND t.topic = u.topic AND t.partition_key = u.partition_key AND t.id <= u.run_end))
    RETURNING 1
), released AS (
    UPDATE {T} t
    SET locked_by = NULL, locked_until = NULL, attempts = t.attempts - 1
    FROM unnest($3::bigint[], $10::int[]) AS u(id, lease)
    WHERE t.id = u.id AND t.id = ANY($3::bigint[]) AND t.locked_by = $1 AND t.attempts = u.lease
    RETURNING 1
), failed AS (
    UPDATE {T} t SET
        status = CASE
            WHEN u.op = 'n' AND (u.give_up OR t.attempts + u.inc - (t.locked_by IS NOT NULL)::int >= t.max_attempts) THEN 'failed'
            ELSE t.status END,
        attempts     = t.attempts + u.inc - (t.locked_by IS NOT NULL)::int,
        last_error   = u.err,
        scheduled_at = COALESCE(u.retry_at, t.scheduled_at),
        locked_by    = NULL,
        locked_until = NULL
    FROM unnest($4::bigint[], $5::text[], $6::int[], $7::boolean[], $8::timestamptz[], $9::text[], $11::int[])
         AS u(id, op, inc, give_up, retry_at, err, lease)
    WHERE t.id = u.id AND t.id = ANY($4::bigint[])
      AND ((t.locked_by = $1 AND t.attempts = u.lease)
           OR (t.locked_by IS NULL AND t.status = 'pending' AND t.attempts = u.lease - 1 AND t.id <= (
               SELECT l.run_end FROM {L} l
               WHERE l.consumer_group = {SWEEPGROUP} AND l.topic = t.topic AND l.partition_key = t.partition_key AND l.run_by = $1)))
    RETURNING 1
), cutrows AS (
    SELECT {SWEEPGROUP} AS g, t.topic, t.partition_key, min(t.id) AS id
    FROM {T} t
    WHERE t.id = ANY($3::bigint[] || $4::bigint[]) AND t.locked_by IS NULL AND t.partition_key IS NOT NULL
    GROUP BY 1, 2, 3
), cutlanes AS (
    -- Each lane found by its primary key (a subquery per key, not a join:
    -- with nested loops off, SettlePlans, a join read every lane at every
    -- settlement), then updated by its ctid.
    SELECT (SELECT l.ctid FROM {L} l
            WHERE l.consumer_group = c.g AND l.topic = c.topic AND l.partition_key = c.partition_key
              AND l.run_by = $1 AND l.run_end >= c.id) AS lane, c.id
    FROM cutrows c
), cut AS (
    UPDATE {L} l
    SET run_end = x.id - 1
    FROM cutlanes x
    WHERE l.ctid = x.lane AND l.ctid = ANY(ARRAY(SELECT lane FROM cutlanes WHERE lane IS NOT NULL))
      AND l.run_by = $1 AND l.run_end >= x.id
)
SELECT (SELECT count(*) FROM acked) + (SELECT count(*) FROM released) + (SELECT count(*) FROM failed)

-- name: LockLanes
-- Reconciling lanes is two statements in one transaction: lock the lanes
-- we hold, then (in a later statement, so with a snapshot that sees every
-- writer that held a lane lock before us) compute each lane's next ready
-- time from its rows, and delete the lanes that have no pending rows.
SELECT l.consumer_group, l.topic, l.partition_key
FROM {L} l
JOIN unnest($2::text[], $3::text[], $4::text[]) AS k(g, topic, pkey)
  ON l.consumer_group = k.g AND l.topic = k.topic AND l.partition_key = k.pkey
WHERE l.locked_by = $1
FOR NO KEY UPDATE OF l SKIP LOCKED

-- name: OwnedLanes
SELECT l.consumer_group, l.topic, l.partition_key
FROM {L} l
JOIN unnest($2::text[], $3::text[], $4::text[]) AS k(g, topic, pkey)
  ON l.consumer_group = k.g AND l.topic = k.topic AND l.partition_key = k.pkey
WHERE l.locked_by = $1

-- name: Reconcile
-- The lane's rows are looked at from its floor, or from the smallest row
-- id of the key's notes not yet taken when that is lower (see Pick).
WITH k AS (
    SELECT k.*, LEAST(l.floor_id, (SELECT min(n.row_id) FROM {N} n
                                   WHERE n.consumer_group = k.consumer_group AND n.topic = k.topic
                                     AND n.partition_key = k.partition_key)) AS floor_id
    FROM unnest($1::text[], $2::text[], $3::text[], $6::bigint[]) AS k(consumer_group, topic, partition_key, last_id)
    JOIN {L} l ON l.consumer_group = k.consumer_group AND l.topic = k.topic AND l.partition_key = k.partition_key
), state AS (
    SELECT k.consumer_group, k.topic, k.partition_key, h.id AS head_id, h.ready AS head_ready,
           d.min_sched AS delayed_min, b.blocked, k.floor_id,
           -- The next floor: the first pending row, at most one past the
           -- last row the fetch handed out (rows after it may belong to a
           -- writer that has not committed); unchanged without one.
           CASE WHEN k.last_id > 0 THEN GREATEST(k.floor_id, LEAST(
               COALESCE(d.min_id, 9223372036854775807), COALESCE(h.id, 9223372036854775807), k.last_id + 1))
           ELSE k.floor_id END AS next_floor,
           -- Asleep: nothing in line, only delayed rows; the lane would sleep
           -- until the first is due. See engine.reconcile for why that needs
           -- a stronger lock.
           (h.id IS NULL AND d.min_sched > now() AND NOT b.blocked) AS asleep
    FROM k
    LEFT JOIN LATERAL (
        SELECT t.id, CASE WHEN t.locked_until > now() THEN t.locked_until ELSE t.scheduled_at END AS ready
        FROM {T} t
        WHERE t.topic = k.topic AND t.partition_key = k.partition_key{G_TK}
          AND t.status = 'pending' AND t.id >= k.floor_id
          AND (t.scheduled_at <= now() OR t.locked_until IS NOT NULL OR t.last_error IS NOT NULL)
        ORDER BY t.id
        LIMIT 1
    ) h ON true
    LEFT JOIN LATERAL (
        SELECT min(t.scheduled_at) AS min_sched, min(t.id) AS min_id
        FROM {T} t
        WHERE t.topic = k.topic AND t.partition_key = k.partition_key{G_TK}
          -- Written as a range (not "h.id IS NULL OR t.id < h.id") so the
          -- key index stops at the head instead of reading the whole backlog.
          AND t.status = 'pending' AND t.id >= k.floor_id AND t.id < COALESCE(h.id, 9223372036854775807)
    ) d ON true
    LEFT JOIN LATERAL (
        SELECT $4::boolean AND EXISTS (
            SELECT 1 FROM {T} f
            WHERE f.topic = k.topic AND f.partition_key = k.partition_key{G_FK}
              AND f.status = 'failed' AND f.id < COALESCE(h.id, 9223372036854775807)) AS blocked
    ) b ON true
), kept AS (
    UPDATE {L} l
    SET locked_by = NULL, locked_until = NULL, run_by = NULL, run_end = NULL, run_at = NULL, blocked = s.blocked,
        -- A requeue that lowered the floor since our snapshot wins.
        floor_id = CASE WHEN l.floor_id < s.floor_id THEN l.floor_id ELSE s.next_floor END,
        ready_at = CASE WHEN s.blocked THEN 'infinity'::timestamptz
                        ELSE LEAST(COALESCE(s.head_ready, 'infinity'), COALESCE(s.delayed_min, 'infinity')) END
    FROM state s
    WHERE l.consumer_group = s.consumer_group AND l.topic = s.topic AND l.partition_key = s.partition_key
      AND NOT (s.head_id IS NULL AND s.delayed_min IS NULL)
      AND ($5::boolean OR NOT s.asleep)
    RETURNING l.ready_at
)
SELECT 'empty' AS kind, s.consumer_group, s.topic, s.partition_key
FROM state s WHERE s.head_id IS NULL AND s.delayed_min IS NULL
UNION ALL
SELECT 'asleep', s.consumer_group, s.topic, s.partition_key
FROM state s WHERE s.asleep AND NOT $5::boolean
UNION ALL
SELECT 'ready', NULL, NULL, NULL FROM kept WHERE ready_at <= now()

-- name: LockEmptyLanes
-- Lanes found empty or asleep are settled only while this worker holds
-- their advisory lock exclusively, which no writer of the key can hold at
-- the same time: a lane with a writer in flight is skipped (and given back
-- ready), and a writer arriving later waits for our commit, then sees the
-- lane deleted or asleep and leaves a note. The lane rows are locked too,
-- in a transaction of their own (engine.settleCareful). The lanes are
-- found first (a materialised CTE), so the try is made for them alone,
-- whatever plan reads the lanes table.
WITH k AS MATERIALIZED (
    SELECT l.consumer_group, l.topic, l.partition_key
    FROM {L} l
    JOIN unnest($2::text[], $3::text[], $4::text[]) AS k(g, topic, pkey)
      ON l.consumer_group = k.g AND l.topic = k.topic AND l.partition_key = k.pkey
    WHERE l.locked_by = $1
)
SELECT l.consumer_group, l.topic, l.partition_key
FROM {L} l
JOIN k ON l.consumer_group = k.consumer_group AND l.topic = k.topic AND l.partition_key = k.partition_key
WHERE l.locked_by = $1 AND pg_try_advisory_xact_lock({LANE_LOCK_K})
FOR UPDATE OF l SKIP LOCKED

-- name: DeleteEmptyLanes
-- A lane's pending rows are looked for from its floor (no row below it is
-- pending), as a range of (partition_key, id) as in Pick: the key index
-- still holds an entry for every row of the key completed since the table
-- was last vacuumed, and behind a pinned horizon each of them is a visit to
-- the table (from the key's first entry, the lookup read more with every
-- minute of make soak-horizon). OFFSET 0 keeps the lookup a subquery run
-- for each lane with the lane's values as the bounds of its index scan:
-- turned into an anti join, the partitioned layout's plan read every entry
-- of the key's partitions and applied the bounds as a join filter.
DELETE FROM {L} l
USING unnest($1::text[], $2::text[], $3::text[]) AS k(g, topic, pkey)
WHERE l.consumer_group = k.g AND l.topic = k.topic AND l.partition_key = k.pkey
  AND NOT EXISTS (
      SELECT 1 FROM {T} t
      WHERE t.topic = k.topic{G_TKG}
        AND t.status = 'pending'
        AND (t.partition_key, t.id) >= (k.pkey, l.floor_id)
        AND (t.partition_key, t.id) <= (k.pkey, 9223372036854775807)
      OFFSET 0)
RETURNING l.consumer_group, l.topic, l.partition_key

-- name: ReadyLanes
-- Lanes that could not be deleted (a writer is adding a row, or a row
-- arrived) are given back ready, to be looked at again.
UPDATE {L} l SET locked_by = NULL, locked_until = NULL, run_by = NULL, run_end = NULL, run_at = NULL, ready_at = now()
FROM unnest($2::text[], $3::text[], $4::text[]) AS k(g, topic, pkey)
WHERE l.consumer_group = k.g AND l.topic = k.topic AND l.partition_key = k.pkey
  AND l.locked_by = $1

-- name: ExtendRows
-- Rows another statement holds are skipped, not waited for: a settlement
-- or a next run of this worker that holds them is about to end their lease
-- anyway, and waiting would make a cycle with it (the rows of a batch are
-- locked in another order there: seen as deadlocks under load, and a failed
-- renewal stalls every key in flight until the next one). A skipped row is
-- renewed by the next renewal if it still needs one. The outer rows are
-- addressed by id = ANY(...) too, and SettlePlans comes first: joined by id
-- alone, on a partition nobody had analysed, the planner hashed the join
-- over a scan of the whole partition (300 ms at 450,000 rows in the
-- partitioned layout's soak, at every renewal).
UPDATE {T} t SET locked_until = now() + $2::interval
FROM (
    SELECT c.id FROM {T} c
    WHERE c.id = ANY($3::bigint[]) AND c.locked_by = $1
    FOR NO KEY UPDATE SKIP LOCKED
) c
WHERE t.id = c.id AND t.id = ANY($3::bigint[])

-- name: ExtendLanes
-- Lanes a writer is holding are skipped, not waited for.
WITH mine AS (
    SELECT l.consumer_group, l.topic, l.partition_key
    FROM {L} l
    JOIN unnest($3::text[], $4::text[], $5::text[]) AS k(g, topic, pkey)
      ON l.consumer_group = k.g AND l.topic = k.topic AND l.partition_key = k.pkey
    WHERE l.locked_by = $1
    FOR NO KEY UPDATE OF l SKIP LOCKED
)
UPDATE {L} l SET locked_until = now() + $2::interval
FROM mine
WHERE l.consumer_group = mine.consumer_group AND l.topic = mine.topic AND l.partition_key = mine.partition_key
RETURNING l.consumer_group, l.topic, l.partition_key

-- name: SweepLanes
-- The sweep recreates a lane for every keyed pending row that lacks one
-- (rows inserted with the trigger disabled, lanes deleted by hand). A key
-- with a note waiting is not missing its lane: the next fetch makes it
-- from the note (TakeNotes takes at most 1,000 at a time, so the sweep's
-- own take may leave some).
INSERT INTO {L} (consumer_group, topic, partition_key, ready_at)
SELECT DISTINCT {SWEEPGROUP}, t.topic, t.partition_key, now()
FROM {T} t
WHERE t.status = 'pending' AND t.partition_key IS NOT NULL
  AND NOT EXISTS (
      SELECT 1 FROM {L} l
      WHERE l.consumer_group = {SWEEPGROUP} AND l.topic = t.topic AND l.partition_key = t.partition_key)
  AND NOT EXISTS (
      SELECT 1 FROM {N} n
      WHERE n.consumer_group = {SWEEPGROUP} AND n.topic = t.topic AND n.partition_key = t.partition_key)
ON CONFLICT DO NOTHING

-- name: DeadVersions
-- The dead versions in a table ($1, its quoted name) that the last vacuum
-- could not remove (or that came since), its live rows, its size in bytes
-- and its file (the counts lag, by a second or, under load, more; the size
-- and the file do not).
SELECT coalesce(max(s.n_dead_tup), 0), coalesce(max(s.n_live_tup), 0),
       pg_relation_size($1::regclass), pg_relation_filenode($1::regclass)
FROM pg_stat_user_tables s
WHERE s.relid = $1::regclass

-- name: CompactLanes
-- Compaction of the lanes table behind a pinned xmin horizon (engine.compact).
-- A long transaction anywhere in the database (a report, a session idle in
-- transaction, a logical slot) keeps every version the engine leaves in the
-- lanes table, and VACUUM cannot remove them: every lookup of a lane walks
-- all its versions since the pin, and the relay's transactions, and the
-- writers waiting for their key's advisory lock, slow down minute by minute
-- (make soak-horizon). TRUNCATE frees them whatever the horizon, so the
-- live lanes are copied out, the table truncated and the lanes put back, in
-- one transaction under an ACCESS EXCLUSIVE lock: nobody sees the table
-- between the two. The lock is waited for at most 100 ms (lock_timeout);
-- writers and fetches that arrive meanwhile queue behind the request, so
-- that is the longest they wait for it, and a compaction that cannot have
-- the table at once is tried again at the next interval. A transaction
-- whose snapshot is older than the compaction sees the table empty
-- (TRUNCATE is not MVCC-safe); no statement of omnibus reads the lanes
-- with such a snapshot (writers in REPEATABLE READ or SERIALIZABLE
-- transactions do not trust what theirs says of a lane, and leave a note).
DO $do$
DECLARE
    kept {L}[];
BEGIN
    SET LOCAL lock_timeout = '100ms';
    LOCK TABLE {L} IN ACCESS EXCLUSIVE MODE;
    kept := ARRAY(SELECT l FROM {L} l);
    TRUNCATE {L};
    INSERT INTO {L} SELECT * FROM unnest(kept);
END
$do$

-- name: CompactNotes
-- The same for the notes table (CompactLanes): writers insert notes and
-- fetches delete them, so behind a pinned horizon each fetch's first
-- statement walks every note ever taken. The notes keep their ids.
DO $do$
DECLARE
    kept {N}[];
BEGIN
    SET LOCAL lock_timeout = '100ms';
    LOCK TABLE {N} IN ACCESS EXCLUSIVE MODE;
    kept := ARRAY(SELECT n FROM {N} n);
    TRUNCATE {N};
    INSERT INTO {N} OVERRIDING SYSTEM VALUE SELECT * FROM unnest(kept);
END
$do$

-- name: CompleteRow
-- Subscriber.CompleteInTx (was completeRowSQL in inbox_queries.go): completes
-- one leased row in the caller's transaction. The lease guard makes it a no-op
-- (0 rows) when another worker took the row over; the caller must then roll
-- back. A row its lane's lease covers (migration 0010; see Settle) is
-- guarded by the lane's run. Completing the row also turns the subscriber's
-- later batched ack of it into a no-op.
UPDATE {T} t
SET status = 'completed', completed_at = now(), locked_by = NULL, locked_until = NULL,
    attempts = t.attempts - (t.locked_by IS NOT NULL)::int
WHERE t.id = $1 AND t.status = 'pending'
  AND ((t.locked_by = $2 AND t.attempts = $3)
       OR (t.locked_by IS NULL AND t.attempts = $3 - 1 AND t.id <= (
           SELECT l.run_end FROM {L} l
           WHERE l.consumer_group = {SWEEPGROUP} AND l.topic = t.topic AND l.partition_key = t.partition_key AND l.run_by = $2)))

-- name: LanesVacuumedSince
-- Whether both the lanes and the notes table ($2, $3: their quoted names)
-- were vacuumed, by any process or by autovacuum, within the last $1: a
-- fleet of relays over one table then vacuums it about once per interval,
-- not once per relay.
SELECT count(*) = 2
FROM pg_stat_user_tables s
WHERE s.relid IN ($2::regclass, $3::regclass)
  AND greatest(s.last_vacuum, s.last_autovacuum) > now() - $1::interval

-- name: VacuumLanes
-- Subscriber.maintain vacuums the small tables every lease, give-back and
-- new key writes to (SubscriberConfig.VacuumInterval): a few pages each,
-- and without it their dead versions pile up whenever autovacuum is off,
-- busy elsewhere or waiting for its threshold, and every writer's lookup
-- and every fetch walks them (docs/operations.md, "Vacuum"). SKIP_LOCKED:
-- a table another vacuum holds is skipped, not waited for. TRUNCATE false:
-- giving empty pages at the end back to the file system takes an ACCESS
-- EXCLUSIVE lock, which would stop every writer and fetch for its length;
-- the pages are reused by the next lanes and notes instead.
VACUUM (SKIP_LOCKED, TRUNCATE false) {L}, {N}
