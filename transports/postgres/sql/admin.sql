-- The statements of Admin (admin.go), the operator's API behind the
-- `omnibus outbox|inbox` commands. They take named arguments (pgx.NamedArgs);
-- @group appears only in an Admin restricted to one consumer group, through
-- {GROUP_T} and {GROUP_L} (see sql.go).

-- name: Stats
-- One statement, so every figure comes from the same snapshot and the same
-- now(). "In line" and "due" use the definitions of the fetch: an expired
-- lease is no lease. The key counts are the KeyCounts fragment; the rows a
-- lane's lease covers (migration 0010), the LaneRuns fragment.
WITH r AS (
    SELECT count(*) FILTER (WHERE t.status = 'pending') AS pending,
           count(*) FILTER (WHERE t.status = 'pending' AND t.scheduled_at <= now()
                              AND (t.locked_until IS NULL OR t.locked_until < now())) AS due,
           count(*) FILTER (WHERE t.status = 'pending' AND t.locked_until >= now()) AS leased,
           count(*) FILTER (WHERE t.status = 'pending' AND t.locked_until < now()) AS expired,
           count(*) FILTER (WHERE t.status = 'failed') AS failed,
           count(*) FILTER (WHERE t.status = 'completed') AS completed,
           min(t.created_at) FILTER (WHERE t.status = 'pending') AS oldest
    FROM {T} t
    WHERE true{GROUP_T}
), c AS (
    {LANE_RUNS}
), k AS (
    {KEY_COUNTS}
)
SELECT r.pending, r.due - c.due, r.leased + c.leased, r.expired + c.expired, r.failed, r.completed, r.oldest, now(),
       k.lanes, k.blocked, k.held
FROM r, c, k

-- name: Health
-- Admin.Health: what long-running operation needs watched. The dead share
-- of each of the table's three relations, as PostgreSQL's statistics count
-- them (0 when they count nothing), and the age of the oldest transaction of
-- the database that holds back the xmin horizon (a session with a snapshot,
-- or a prepared transaction), this session excepted: while it is open,
-- vacuum cannot remove the versions the relay and the writers leave behind.
-- A partitioned table counts the versions of all its partitions.
WITH dead AS (
    SELECT r.root AS relid, sum(s.n_dead_tup)::float8 / NULLIF(sum(s.n_live_tup + s.n_dead_tup), 0) AS ratio
    FROM (VALUES (to_regclass(@t)), (to_regclass(@l)), (to_regclass(@n))) AS r(root)
    CROSS JOIN LATERAL (SELECT r.root UNION SELECT t.relid FROM pg_partition_tree(r.root) t) p(relid)
    JOIN pg_stat_user_tables s ON s.relid = p.relid
    GROUP BY r.root
)
SELECT COALESCE((SELECT ratio FROM dead WHERE relid = to_regclass(@t)), 0),
       COALESCE((SELECT ratio FROM dead WHERE relid = to_regclass(@l)), 0),
       COALESCE((SELECT ratio FROM dead WHERE relid = to_regclass(@n)), 0),
       GREATEST(
           (SELECT max(now() - a.xact_start) FROM pg_stat_activity a
            WHERE a.backend_xmin IS NOT NULL AND a.pid <> pg_backend_pid() AND a.datname = current_database()),
           (SELECT max(now() - p.prepared) FROM pg_prepared_xacts p WHERE p.database = current_database()),
           interval '0')

-- fragment: LaneRuns
-- {LANE_RUNS} of Stats and Overview: the pending rows that a lane's run
-- covers (migration 0010: a keyed row handed out is not written to; its
-- lane notes the run). They are leased while the lane's lease lives, and
-- expired after; the rows' own columns count them as due, which they are
-- not.
SELECT count(*) FILTER (WHERE l.locked_until >= now()) AS leased,
       count(*) FILTER (WHERE l.locked_until IS NULL OR l.locked_until < now()) AS expired,
       count(*) FILTER (WHERE x.scheduled_at <= now()) AS due
{RUN_ROWS}

-- fragment: RunRows
-- {RUN_ROWS} of LaneRuns and Leases: the lanes l that have a run, each with
-- the pending rows x of its run (x.scheduled_at), read per lane through
-- the key index, from the lane's floor to the run's end.
FROM {L} l
CROSS JOIN LATERAL (
    SELECT t.scheduled_at FROM {T} t
    WHERE t.topic = l.topic{GL_T} AND t.status = 'pending' AND t.locked_by IS NULL
      AND (t.partition_key, t.id) >= (l.partition_key, l.floor_id)
      AND (t.partition_key, t.id) <= (l.partition_key, l.run_end)
      AND t.scheduled_at <= l.run_at
) x
WHERE l.run_by IS NOT NULL{GROUP_L}

-- fragment: KeyCounts
-- {KEY_COUNTS} of Stats and Overview: the keys with pending rows (lanes,
-- and keys whose writers left a note no relay has turned into a lane yet),
-- those frozen by the Block policy, and those held: the key's first in-line
-- row (its head, read through the per-key index) was tried and waits for its
-- retry.
SELECT count(*) AS lanes,
       count(*) FILTER (WHERE l.blocked) AS blocked,
       count(*) FILTER (WHERE h.held) AS held
FROM (
    SELECT l.consumer_group, l.topic, l.partition_key, l.blocked
    FROM {L} l
    WHERE true{GROUP_L}
    UNION
    SELECT l.consumer_group, l.topic, l.partition_key, false
    FROM {N} l
    WHERE NOT EXISTS (SELECT 1 FROM {L} x
                      WHERE x.consumer_group = l.consumer_group AND x.topic = l.topic AND x.partition_key = l.partition_key){GROUP_L}
) l
LEFT JOIN LATERAL (
    SELECT t.last_error IS NOT NULL AND t.scheduled_at > now() AS held
    FROM {T} t
    WHERE t.topic = l.topic AND t.partition_key = l.partition_key{GL_T}
      AND t.status = 'pending'
      AND (t.scheduled_at <= now() OR t.locked_until IS NOT NULL OR t.last_error IS NOT NULL)
    ORDER BY t.id
    LIMIT 1
) h ON true

-- name: ListFailed
-- ListFailed and ListFailedMatching: the failed rows after @after, @limit at
-- most. {FILTER} is where the conditions of a FailedFilter go (the Filter*
-- fragments of console.sql), added as the filter asks rather than written as
-- "@x = '' OR ...", so that the plan of each shape of filter fits it, cached
-- generic plans included.
SELECT t.id, COALESCE(t.event_id::text, ''), {GCOL}, t.topic, COALESCE(t.partition_key, ''),
       COALESCE(t.event_type, ''), t.attempts, t.max_attempts, COALESCE(t.last_error, ''), t.created_at
FROM {T} t
WHERE t.status = 'failed'{GROUP_T}{FILTER}
  AND t.id > @after
ORDER BY t.id
LIMIT @limit

-- name: FailedCeiling
-- RequeueAllFailed works up to the highest failed id it saw when it started,
-- so rows that fail again while it runs are not requeued twice and the loop
-- ends.
SELECT max(t.id) FROM {T} t WHERE t.status = 'failed'{GROUP_T}

-- name: RequeueFailed
-- Requeue (@after = id - 1, @upto = id, @batch = 1) and RequeueAllFailed:
-- the failed rows with ids in (@after, @upto], @batch at most, become pending
-- with a fresh budget, due now, and their lanes are upserted in the same
-- statement (an UPDATE does not fire the insert trigger that creates lanes).
-- The lane upsert is the trigger's (never delays a lane) and also lifts a
-- Block-policy freeze; a relay that finds another failed row ahead re-blocks
-- the lane when it reconciles. last_error is kept: it is the record of why
-- the row failed, and a row due now is in line with or without it. Returns
-- the rows requeued and the highest id looked at (NULL when none).
WITH c AS (
    SELECT t.id FROM {T} t
    WHERE t.status = 'failed' AND t.id > @after AND t.id <= @upto{GROUP_T}
    ORDER BY t.id
    LIMIT @batch
), r AS (
    UPDATE {T} t
    SET status = 'pending', attempts = 0, scheduled_at = now(), completed_at = NULL,
        locked_by = NULL, locked_until = NULL
    FROM c
    WHERE t.id = c.id AND t.status = 'failed'
    RETURNING {GCOL} AS consumer_group, t.topic, t.partition_key, t.id
), lane AS (
    -- The requeued row is below the lane's floor: move the floor down.
    INSERT INTO {L} AS l (consumer_group, topic, partition_key, ready_at, floor_id)
    SELECT r.consumer_group, r.topic, r.partition_key, now(), min(r.id)
    FROM r
    WHERE r.partition_key IS NOT NULL
    GROUP BY 1, 2, 3
    ORDER BY 1, 2, 3
    ON CONFLICT (consumer_group, topic, partition_key)
    DO UPDATE SET ready_at = LEAST(l.ready_at, EXCLUDED.ready_at), blocked = false,
                  floor_id = LEAST(l.floor_id, EXCLUDED.floor_id)
)
SELECT (SELECT count(*) FROM r), (SELECT max(id) FROM c)

-- name: ReleaseExpiredRows
-- Releasing expired leases skips rows and lanes someone is locking right now
-- (a relay taking them over, a writer upserting a lane): they are being dealt
-- with, and waiting for them could deadlock with a fetch.
UPDATE {T} t SET locked_by = NULL, locked_until = NULL
WHERE t.id IN (
    SELECT t.id FROM {T} t
    WHERE t.status = 'pending' AND t.locked_until < now(){GROUP_T}
    FOR UPDATE SKIP LOCKED)

-- name: ReleaseExpiredLanes
-- A lane whose expired lease still has a run (migration 0010) handed out
-- rows it never settled: each of them still pending counts the delivery, as
-- the row's own lease did before it was released (ReleaseExpiredRows keeps
-- attempts), and the run is forgotten with the lease.
WITH x AS (
    SELECT l.consumer_group, l.topic, l.partition_key, l.floor_id, l.run_by, l.run_end, l.run_at FROM {L} l
    WHERE l.locked_until < now(){GROUP_L}
    FOR UPDATE SKIP LOCKED
), counted AS (
    UPDATE {T} t SET attempts = t.attempts + 1
    FROM x k
    {LOST_ROWS}
)
UPDATE {L} l SET locked_by = NULL, locked_until = NULL, run_by = NULL, run_end = NULL, run_at = NULL
FROM x
WHERE l.consumer_group = x.consumer_group AND l.topic = x.topic AND l.partition_key = x.partition_key

-- name: CleanupCutoff
-- Cleanup fixes its cutoff once, then deletes in batches through the partial
-- index on completed_at.
SELECT now() - @older::interval

-- name: Cleanup
-- The batch is chosen into an array, not joined (as TakeNotes, engine.sql):
-- planned as a nested loop on low estimates, "id IN (… LIMIT … FOR UPDATE
-- SKIP LOCKED)" runs its subquery again for every row and deletes far more
-- than a batch, in quadratic time.
DELETE FROM {T}
WHERE id = ANY(ARRAY(
    SELECT t.id FROM {T} t
    WHERE t.status = 'completed' AND t.completed_at < @cutoff{GROUP_T}
    LIMIT @batch
    FOR UPDATE SKIP LOCKED))

-- name: CountCompletedOlderThan
-- Admin.CountCompletedOlderThan: the rows Cleanup would delete now, through the same partial
-- index.
SELECT count(*) FROM {T} t
WHERE t.status = 'completed' AND t.completed_at < now() - @older::interval{GROUP_T}

-- name: Row
-- Admin.Row: every column of the row @id. The columns the outbox does not
-- have ({GCOL}, {MSGID}) are empty strings there.
SELECT t.id, COALESCE(t.event_id::text, ''), {GCOL}, {MSGID}, t.topic,
       COALESCE(t.partition_key, ''), COALESCE(t.event_type, ''), t.payload, t.metadata, t.status,
       t.attempts, t.max_attempts, COALESCE(t.last_error, ''), t.scheduled_at, COALESCE(t.locked_by, ''),
       t.locked_until, t.created_at, t.completed_at
FROM {T} t
WHERE t.id = @id{GROUP_T}
