package postgres

import (
	"strings"
)

// queries holds every statement of one outbox or inbox table, built once
// from its validated, quoted name. All SQL of the transport lives here.
type queries struct {
	table   tableName
	inbox   bool
	channel string

	insertOutbox string
	insertInbox  string
	fetch        string
	settle       string
	lockLanes    string
	ownedLanes   string
	reconcile    string
	lockEmpty    string
	deleteEmpty  string
	readyLanes   string
	extendRows   string
	extendLanes  string
	sweep        string
}

// rowColumns are the columns fetch returns, in scan order.
const rowColumns = `id, event_id::text, topic, partition_key, event_type, payload, metadata, attempts, max_attempts, created_at`

func newQueries(t tableName, inbox bool) *queries {
	q := &queries{table: t, inbox: inbox, channel: t.channel()}
	r := strings.NewReplacer(
		"{T}", t.quoted(),
		"{L}", t.derived("_lanes").quoted(),
		"{COLS}", rowColumns,
	)
	// {G} restricts a row alias to the lane's consumer group (inbox only);
	// {GP} restricts to the group parameter $7.
	g := func(alias, lane string) string {
		if !inbox {
			return ""
		}
		return " AND " + alias + ".consumer_group = " + lane + ".consumer_group"
	}
	gp := func(alias string) string {
		if !inbox {
			return ""
		}
		return " AND " + alias + ".consumer_group = $7"
	}
	build := func(s string, kv ...string) string {
		for i := 0; i+1 < len(kv); i += 2 {
			s = strings.ReplaceAll(s, kv[i], kv[i+1])
		}
		return r.Replace(s)
	}

	q.insertOutbox = build(`
INSERT INTO {T} (event_id, topic, partition_key, event_type, payload, metadata, max_attempts, scheduled_at)
SELECT u.event_id, $1, u.partition_key, u.event_type, u.payload, u.metadata, u.max_attempts, COALESCE(u.scheduled_at, now())
FROM unnest($2::uuid[], $3::text[], $4::text[], $5::bytea[], $6::jsonb[], $7::int[], $8::timestamptz[])
     WITH ORDINALITY AS u(event_id, partition_key, event_type, payload, metadata, max_attempts, scheduled_at, ord)
ORDER BY u.ord
ON CONFLICT (event_id, topic) DO NOTHING`)

	q.insertInbox = build(`
INSERT INTO {T} (message_id, consumer_group, event_id, topic, partition_key, event_type, payload, metadata, max_attempts)
SELECT u.message_id, $1, u.event_id, u.topic, u.partition_key, u.event_type, u.payload, u.metadata, u.max_attempts
FROM unnest($2::text[], $3::uuid[], $4::text[], $5::text[], $6::text[], $7::bytea[], $8::jsonb[], $9::int[])
     WITH ORDINALITY AS u(message_id, event_id, topic, partition_key, event_type, payload, metadata, max_attempts, ord)
ORDER BY u.ord
ON CONFLICT (message_id, consumer_group) DO NOTHING
RETURNING message_id`)

	// The fetch. One autocommit statement:
	//  lane:  lease up to $3 ready lanes (keys), oldest ready first, skipping
	//         lanes another relay is locking.
	//  line:  for each lane, the first $4 rows that are "in line" (due, leased,
	//         or tried and waiting), in id order. Delayed rows never tried are
	//         not in line and hold nothing back. With the Block policy ($8)
	//         a failed row holds back every later row of its key.
	//  run:   the longest prefix of those rows that is deliverable now (due and
	//         not leased): the key's head and the run behind it.
	//  loose: up to $5 due unkeyed rows, straight from the table.
	// Rows of runs and loose rows are leased to $1 for $2; so are the lanes,
	// including lanes that yielded nothing, which the caller reconciles.
	q.fetch = build(`
WITH lane AS (
    SELECT l.ctid AS lane_ctid, l.consumer_group, l.topic, l.partition_key
    FROM {L} l
    WHERE l.ready_at <= now()
      AND (l.locked_until IS NULL OR l.locked_until < now())
      AND ($6::text IS NULL OR l.topic = $6)
      AND l.consumer_group = $7 -- outbox lanes all belong to the group ''
    ORDER BY l.ready_at
    LIMIT $3
    FOR NO KEY UPDATE SKIP LOCKED
), line AS (
    SELECT lane.topic, lane.partition_key, r.id, r.deliverable
    FROM lane CROSS JOIN LATERAL (
        SELECT t.id,
               (t.scheduled_at <= now() AND (t.locked_until IS NULL OR t.locked_until < now())) AS deliverable
        FROM {T} t
        WHERE t.topic = lane.topic AND t.partition_key = lane.partition_key{G_T}
          AND t.status = 'pending'
          AND (t.scheduled_at <= now() OR t.locked_until IS NOT NULL OR t.last_error IS NOT NULL)
          AND NOT ($8::boolean AND EXISTS (
              SELECT 1 FROM {T} f
              WHERE f.topic = lane.topic AND f.partition_key = lane.partition_key{G_F}
                AND f.status = 'failed' AND f.id < t.id))
        ORDER BY t.id
        LIMIT $4
    ) r
), run AS (
    SELECT id FROM (
        SELECT id, bool_and(deliverable) OVER (PARTITION BY topic, partition_key ORDER BY id) AS ok
        FROM line
    ) x
    WHERE ok
), loose AS (
    SELECT t.id
    FROM {T} t
    WHERE t.status = 'pending' AND t.partition_key IS NULL AND t.scheduled_at <= now()
      AND (t.locked_until IS NULL OR t.locked_until < now())
      AND ($6::text IS NULL OR t.topic = $6){GP_T}
    ORDER BY t.scheduled_at, t.id
    LIMIT $5
    FOR UPDATE SKIP LOCKED
), picked AS (
    UPDATE {T} t
    SET locked_by = $1, locked_until = now() + $2::interval
    WHERE t.id IN (SELECT id FROM run UNION ALL SELECT id FROM loose)
    RETURNING t.id, t.event_id::text, t.topic, t.partition_key, t.event_type, t.payload, t.metadata,
              t.attempts, t.max_attempts, t.created_at
), leased AS (
    UPDATE {L} l
    SET locked_by = $1, locked_until = now() + $2::interval
    WHERE l.ctid = ANY(ARRAY(SELECT lane_ctid FROM lane))
    RETURNING l.consumer_group, l.topic, l.partition_key
)
SELECT false AS is_lane, id, event_id, topic, partition_key, event_type, payload, metadata,
       attempts, max_attempts, created_at, NULL::text AS consumer_group
FROM picked
UNION ALL
SELECT true, NULL, NULL, topic, partition_key, NULL, NULL, NULL, NULL, NULL, NULL, consumer_group
FROM leased`,
		"{G_T}", g("t", "lane"),
		"{G_F}", g("f", "lane"),
		"{GP_T}", gp("t"),
	)

	// Settlement of many rows in one statement, guarded by the lease so a
	// worker whose lease was taken over never clobbers the new holder's row.
	// Acks ($2) and releases ($3, rows given back untouched) are addressed
	// by id = ANY(...), which the planner always serves from the primary key;
	// failures ($4..$9, few) carry their own values: op n = nack (may fail
	// the row), p = plain nack (counts an attempt, keeps the row pending: a
	// Nack without a settlement means "deliver again", as everywhere in
	// Watermill).
	q.settle = build(`
WITH acked AS (
    UPDATE {T} t
    SET status = 'completed', completed_at = now(), locked_by = NULL, locked_until = NULL
    WHERE t.id = ANY($2::bigint[]) AND t.locked_by = $1
    RETURNING 1
), released AS (
    UPDATE {T} t
    SET locked_by = NULL, locked_until = NULL
    WHERE t.id = ANY($3::bigint[]) AND t.locked_by = $1
    RETURNING 1
), failed AS (
    UPDATE {T} t SET
        status = CASE
            WHEN u.op = 'n' AND (u.give_up OR t.attempts + u.inc >= t.max_attempts) THEN 'failed'
            ELSE t.status END,
        attempts     = t.attempts + u.inc,
        last_error   = u.err,
        scheduled_at = COALESCE(u.retry_at, t.scheduled_at),
        locked_by    = NULL,
        locked_until = NULL
    FROM unnest($4::bigint[], $5::text[], $6::int[], $7::boolean[], $8::timestamptz[], $9::text[])
         AS u(id, op, inc, give_up, retry_at, err)
    WHERE t.id = u.id AND t.id = ANY($4::bigint[]) AND t.locked_by = $1
    RETURNING 1
)
SELECT (SELECT count(*) FROM acked) + (SELECT count(*) FROM released) + (SELECT count(*) FROM failed)`)

	// Reconciling lanes is two statements in one transaction: lock the lanes
	// we hold, then (in a later statement, so with a snapshot that sees every
	// writer that held a lane lock before us) compute each lane's next ready
	// time from its rows, and delete the lanes that have no pending rows.
	q.lockLanes = build(`
SELECT l.consumer_group, l.topic, l.partition_key
FROM {L} l
JOIN unnest($2::text[], $3::text[], $4::text[]) AS k(g, topic, pkey)
  ON l.consumer_group = k.g AND l.topic = k.topic AND l.partition_key = k.pkey
WHERE l.locked_by = $1
FOR NO KEY UPDATE OF l SKIP LOCKED`)

	q.ownedLanes = build(`
SELECT l.consumer_group, l.topic, l.partition_key
FROM {L} l
JOIN unnest($2::text[], $3::text[], $4::text[]) AS k(g, topic, pkey)
  ON l.consumer_group = k.g AND l.topic = k.topic AND l.partition_key = k.pkey
WHERE l.locked_by = $1`)

	q.reconcile = build(`
WITH k AS (
    SELECT * FROM unnest($1::text[], $2::text[], $3::text[]) AS k(consumer_group, topic, partition_key)
), state AS (
    SELECT k.consumer_group, k.topic, k.partition_key, h.id AS head_id, h.ready AS head_ready,
           d.min_sched AS delayed_min, b.blocked,
           -- Asleep: nothing in line, only delayed rows; the lane would sleep
           -- until the first is due. See engine.reconcile for why that needs
           -- a stronger lock.
           (h.id IS NULL AND d.min_sched > now() AND NOT b.blocked) AS asleep
    FROM k
    LEFT JOIN LATERAL (
        SELECT t.id, CASE WHEN t.locked_until > now() THEN t.locked_until ELSE t.scheduled_at END AS ready
        FROM {T} t
        WHERE t.topic = k.topic AND t.partition_key = k.partition_key{G_TK}
          AND t.status = 'pending'
          AND (t.scheduled_at <= now() OR t.locked_until IS NOT NULL OR t.last_error IS NOT NULL)
        ORDER BY t.id
        LIMIT 1
    ) h ON true
    LEFT JOIN LATERAL (
        SELECT min(t.scheduled_at) AS min_sched
        FROM {T} t
        WHERE t.topic = k.topic AND t.partition_key = k.partition_key{G_TK}
          -- Written as a range (not "h.id IS NULL OR t.id < h.id") so the
          -- key index stops at the head instead of reading the whole backlog.
          AND t.status = 'pending' AND t.id < COALESCE(h.id, 9223372036854775807)
    ) d ON true
    LEFT JOIN LATERAL (
        SELECT $4::boolean AND EXISTS (
            SELECT 1 FROM {T} f
            WHERE f.topic = k.topic AND f.partition_key = k.partition_key{G_FK}
              AND f.status = 'failed' AND f.id < COALESCE(h.id, 9223372036854775807)) AS blocked
    ) b ON true
), kept AS (
    UPDATE {L} l
    SET locked_by = NULL, locked_until = NULL, blocked = s.blocked,
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
SELECT 'ready', NULL, NULL, NULL FROM kept WHERE ready_at <= now()`,
		"{G_TK}", g("t", "k"),
		"{G_FK}", g("f", "k"),
	)

	// Lanes found empty or asleep are settled only under a FOR UPDATE lock,
	// which a writer's KEY SHARE lock keeps us from taking while its row is
	// not yet committed (and which makes a writer arriving later wait for us
	// and then see what we wrote).
	q.lockEmpty = build(`
SELECT l.consumer_group, l.topic, l.partition_key
FROM {L} l
JOIN unnest($2::text[], $3::text[], $4::text[]) AS k(g, topic, pkey)
  ON l.consumer_group = k.g AND l.topic = k.topic AND l.partition_key = k.pkey
WHERE l.locked_by = $1
FOR UPDATE OF l SKIP LOCKED`)

	q.deleteEmpty = build(`
DELETE FROM {L} l
USING unnest($1::text[], $2::text[], $3::text[]) AS k(g, topic, pkey)
WHERE l.consumer_group = k.g AND l.topic = k.topic AND l.partition_key = k.pkey
  AND NOT EXISTS (
      SELECT 1 FROM {T} t
      WHERE t.topic = k.topic AND t.partition_key = k.pkey{G_TKG}
        AND t.status = 'pending')
RETURNING l.consumer_group, l.topic, l.partition_key`,
		"{G_TKG}", gk(inbox),
	)

	// Lanes that could not be deleted (a writer is adding a row, or a row
	// arrived) are given back ready, to be looked at again.
	q.readyLanes = build(`
UPDATE {L} l SET locked_by = NULL, locked_until = NULL, ready_at = now()
FROM unnest($2::text[], $3::text[], $4::text[]) AS k(g, topic, pkey)
WHERE l.consumer_group = k.g AND l.topic = k.topic AND l.partition_key = k.pkey
  AND l.locked_by = $1`)

	q.extendRows = build(`
UPDATE {T} SET locked_until = now() + $2::interval
WHERE id = ANY($3::bigint[]) AND locked_by = $1`)

	// Lanes a writer is holding are skipped, not waited for.
	q.extendLanes = build(`
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
WHERE l.consumer_group = mine.consumer_group AND l.topic = mine.topic AND l.partition_key = mine.partition_key`)

	// The sweep recreates a lane for every keyed pending row that lacks one
	// (rows inserted with the trigger disabled, lanes deleted by hand).
	q.sweep = build(`
INSERT INTO {L} (consumer_group, topic, partition_key, ready_at)
SELECT DISTINCT {SWEEPGROUP}, t.topic, t.partition_key, now()
FROM {T} t
WHERE t.status = 'pending' AND t.partition_key IS NOT NULL
  AND NOT EXISTS (
      SELECT 1 FROM {L} l
      WHERE l.consumer_group = {SWEEPGROUP} AND l.topic = t.topic AND l.partition_key = t.partition_key)
ON CONFLICT DO NOTHING`,
		"{SWEEPGROUP}", sweepGroup(inbox),
	)

	return q
}

// gk restricts rows aliased t to the group of the lanes aliased k (inbox only).
func gk(inbox bool) string {
	if !inbox {
		return ""
	}
	return " AND t.consumer_group = k.g"
}

func sweepGroup(inbox bool) string {
	if inbox {
		return "t.consumer_group"
	}
	return "''"
}
