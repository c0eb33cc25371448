package postgres

import "strings"

// adminQueries holds the statements of Admin for one table, built once from
// its validated, quoted name. They take named arguments (pgx.NamedArgs):
// @group appears only when the Admin is restricted to one consumer group.
type adminQueries struct {
	stats         string
	listFailed    string
	failedCeiling string
	requeueOne    string
	requeueBatch  string
	releaseRows   string
	releaseLanes  string
	cleanupCutoff string
	cleanup       string
}

// adminTemplate fills the templated parts of the admin and console
// statements. {T} / {L}: the table and its lanes, quoted. {G_T} / {G_L}:
// restrict rows (alias t) or lanes (alias l) to @group. {GL_T}: tie a row to
// its lane's group (inbox rows carry a group, outbox lanes all belong to the
// group ""). {GCOL}: a row's group as a column.
func adminTemplate(t tableName, inbox, byGroup bool) *strings.Replacer {
	var gt, gl, glt, gcol string
	gcol = "''::text"
	if inbox {
		glt = " AND t.consumer_group = l.consumer_group"
		gcol = "t.consumer_group"
		if byGroup {
			gt = " AND t.consumer_group = @group"
			gl = " AND l.consumer_group = @group"
		}
	}
	return strings.NewReplacer(
		"{T}", t.quoted(),
		"{L}", t.derived("_lanes").quoted(),
		"{G_T}", gt,
		"{G_L}", gl,
		"{GL_T}", glt,
		"{GCOL}", gcol,
	)
}

func newAdminQueries(t tableName, inbox, byGroup bool) adminQueries {
	r := adminTemplate(t, inbox, byGroup)
	var q adminQueries

	// One statement, so every figure comes from the same snapshot and the
	// same now(). "In line" and "due" use the definitions of the fetch: an
	// expired lease is no lease. The held-keys count looks at each lane's
	// first in-line row (the key's head) through the per-key index.
	q.stats = r.Replace(`
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
    WHERE true{G_T}
), k AS (
    SELECT count(*) AS lanes,
           count(*) FILTER (WHERE l.blocked) AS blocked,
           count(*) FILTER (WHERE h.held) AS held
    FROM {L} l
    LEFT JOIN LATERAL (
        SELECT t.last_error IS NOT NULL AND t.scheduled_at > now() AS held
        FROM {T} t
        WHERE t.topic = l.topic AND t.partition_key = l.partition_key{GL_T}
          AND t.status = 'pending'
          AND (t.scheduled_at <= now() OR t.locked_until IS NOT NULL OR t.last_error IS NOT NULL)
        ORDER BY t.id
        LIMIT 1
    ) h ON true
    WHERE true{G_L}
)
SELECT r.pending, r.due, r.leased, r.expired, r.failed, r.completed, r.oldest, now(),
       k.lanes, k.blocked, k.held
FROM r, k`)

	q.listFailed = r.Replace(`
SELECT t.id, COALESCE(t.event_id::text, ''), {GCOL}, t.topic, COALESCE(t.partition_key, ''),
       COALESCE(t.event_type, ''), t.attempts, t.max_attempts, COALESCE(t.last_error, ''), t.created_at
FROM {T} t
WHERE t.status = 'failed' AND t.id > @after{G_T}
ORDER BY t.id
LIMIT @limit`)

	// RequeueAllFailed works up to the highest failed id it saw when it
	// started, so rows that fail again while it runs are not requeued twice
	// and the loop ends.
	q.failedCeiling = r.Replace(`
SELECT max(t.id) FROM {T} t WHERE t.status = 'failed'{G_T}`)

	// Requeue: failed rows become pending with a fresh budget, due now, and
	// their lanes are upserted in the same statement (an UPDATE does not fire
	// the insert trigger that creates lanes). The lane upsert is the trigger's
	// (never delays a lane) and also lifts a Block-policy freeze; a relay that
	// finds another failed row ahead re-blocks the lane when it reconciles.
	// last_error is kept: it is the record of why the row failed, and a row
	// due now is in line with or without it.
	requeue := func(candidates string) string {
		return r.Replace(`
WITH c AS (` + candidates + `
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
SELECT (SELECT count(*) FROM r), (SELECT max(id) FROM c)`)
	}
	q.requeueOne = requeue(`
    SELECT t.id FROM {T} t WHERE t.id = @id{G_T}`)
	q.requeueBatch = requeue(`
    SELECT t.id FROM {T} t
    WHERE t.status = 'failed' AND t.id > @after AND t.id <= @upto{G_T}
    ORDER BY t.id
    LIMIT @batch`)

	// Releasing expired leases skips rows and lanes someone is locking right
	// now (a relay taking them over, a writer upserting a lane): they are
	// being dealt with, and waiting for them could deadlock with a fetch.
	q.releaseRows = r.Replace(`
UPDATE {T} t SET locked_by = NULL, locked_until = NULL
WHERE t.id IN (
    SELECT t.id FROM {T} t
    WHERE t.status = 'pending' AND t.locked_until < now(){G_T}
    FOR UPDATE SKIP LOCKED)`)
	q.releaseLanes = r.Replace(`
UPDATE {L} l SET locked_by = NULL, locked_until = NULL
FROM (
    SELECT l.consumer_group, l.topic, l.partition_key FROM {L} l
    WHERE l.locked_until < now(){G_L}
    FOR UPDATE SKIP LOCKED) x
WHERE l.consumer_group = x.consumer_group AND l.topic = x.topic AND l.partition_key = x.partition_key`)

	// Cleanup fixes its cutoff once, then deletes in batches through the
	// partial index on completed_at.
	q.cleanupCutoff = `SELECT now() - @older::interval`
	q.cleanup = r.Replace(`
DELETE FROM {T}
WHERE id IN (
    SELECT t.id FROM {T} t
    WHERE t.status = 'completed' AND t.completed_at < @cutoff{G_T}
    LIMIT @batch
    FOR UPDATE SKIP LOCKED)`)
	return q
}

// schemaObjectsQuery tells whether a table, its lanes table and the
// bookkeeping table of its schema exist (Admin.SchemaState). It takes their
// quoted names as text: to_regclass answers NULL for a missing relation or
// schema instead of failing.
const schemaObjectsQuery = `
SELECT to_regclass($1) IS NOT NULL AND to_regclass($2) IS NOT NULL, to_regclass($3) IS NOT NULL`

// schemaVersionQuery reads the highest migration recorded for table t in the
// bookkeeping table of its schema (Admin.SchemaState); $1 is the bare name.
func schemaVersionQuery(t tableName) string {
	return `SELECT COALESCE(max(version), 0) FROM ` + migrationsBook(t) + ` WHERE table_name = $1`
}

// migrationsBook is the quoted bookkeeping table of t's schema, the one
// Migrate records applied versions in.
func migrationsBook(t tableName) string {
	return tableName{schema: t.schema, name: "omnibus_schema_migrations"}.quoted()
}

// rowQuery selects every column of the row @id (Admin.Row); with byGroup the
// row must also belong to @group. The columns the outbox does not have are
// empty strings there.
func rowQuery(t tableName, inbox, byGroup bool) string {
	group, messageID, filter := "''::text", "''::text", ""
	if inbox {
		group, messageID = "t.consumer_group", "t.message_id"
		if byGroup {
			filter = " AND t.consumer_group = @group"
		}
	}
	return `
SELECT t.id, COALESCE(t.event_id::text, ''), ` + group + `, ` + messageID + `, t.topic,
       COALESCE(t.partition_key, ''), COALESCE(t.event_type, ''), t.payload, t.metadata, t.status,
       t.attempts, t.max_attempts, COALESCE(t.last_error, ''), t.scheduled_at, COALESCE(t.locked_by, ''),
       t.locked_until, t.created_at, t.completed_at
FROM ` + t.quoted() + ` t
WHERE t.id = @id` + filter
}

// consoleQueries holds the read statements of the admin console (Overview,
// HeldKeys, Leases, Throughput, ListFailedMatching, ConsumerGroups) and
// Discard, built like adminQueries. None of them counts completed rows
// without a bound: the console must stay fast on a table of millions of
// delivered rows.
type consoleQueries struct {
	overview   string
	heldKeys   string
	leases     string
	throughput string
	failedCols string
	failedFrom string
	groups     string
	lane       string
	discard    string
}

func newConsoleQueries(t tableName, inbox, byGroup bool) consoleQueries {
	r := adminTemplate(t, inbox, byGroup)
	var q consoleQueries

	// Pending rows are read through the partial per-key index (status =
	// 'pending'), failed rows through the partial failed index. Completed rows
	// are counted only up to @cap (LIMIT inside): past it the caller uses the
	// planner's estimate of the table (pg_class.reltuples), returned as well.
	completed := `(SELECT count(*) FROM (SELECT 1 FROM {T} t WHERE t.status = 'completed' LIMIT @cap) x)`
	if byGroup {
		// A group's completed rows have no index of their own: not counted.
		completed = `-1::bigint`
	}
	q.overview = r.Replace(`
WITH p AS (
    SELECT count(*) AS pending,
           count(*) FILTER (WHERE t.scheduled_at <= now()
                              AND (t.locked_until IS NULL OR t.locked_until < now())) AS due,
           count(*) FILTER (WHERE t.locked_until >= now()) AS leased,
           count(*) FILTER (WHERE t.locked_until < now()) AS expired,
           count(*) FILTER (WHERE t.scheduled_at > now() AND t.last_error IS NULL
                              AND (t.locked_until IS NULL OR t.locked_until < now())) AS delayed,
           count(*) FILTER (WHERE t.scheduled_at > now() AND t.last_error IS NOT NULL
                              AND (t.locked_until IS NULL OR t.locked_until < now())) AS retrying,
           min(t.created_at) AS oldest
    FROM {T} t
    WHERE t.status = 'pending'{G_T}
), f AS (
    SELECT count(*) AS failed FROM {T} t WHERE t.status = 'failed'{G_T}
), k AS (
    SELECT count(*) AS lanes,
           count(*) FILTER (WHERE l.blocked) AS blocked,
           count(*) FILTER (WHERE h.held) AS held
    FROM {L} l
    LEFT JOIN LATERAL (
        SELECT t.last_error IS NOT NULL AND t.scheduled_at > now() AS held
        FROM {T} t
        WHERE t.topic = l.topic AND t.partition_key = l.partition_key{GL_T}
          AND t.status = 'pending'
          AND (t.scheduled_at <= now() OR t.locked_until IS NOT NULL OR t.last_error IS NOT NULL)
        ORDER BY t.id
        LIMIT 1
    ) h ON true
    WHERE true{G_L}
)
SELECT p.pending, p.due, p.leased, p.expired, p.delayed, p.retrying, p.oldest, now(), f.failed,
       ` + completed + `,
       COALESCE((SELECT c.reltuples::bigint FROM pg_class c WHERE c.oid = to_regclass(@table)), -1),
       k.lanes, k.blocked, k.held
FROM p, f, k`)

	// The head of a key is its first in-line pending row, or, on a lane
	// frozen by the Block policy, its first failed row when that comes first.
	// A key is held when its head was tried and waits for its retry, or when
	// its lane is blocked.
	q.heldKeys = r.Replace(`
SELECT l.consumer_group, l.topic, l.partition_key, l.blocked, h.id, h.status, h.attempts, h.max_attempts,
       h.scheduled_at, COALESCE(h.last_error, ''), h.created_at
FROM {L} l
CROSS JOIN LATERAL (
    SELECT x.* FROM (
        (SELECT t.id, t.status, t.attempts, t.max_attempts, t.scheduled_at, t.last_error, t.created_at
         FROM {T} t
         WHERE l.blocked AND t.status = 'failed'
           AND t.topic = l.topic AND t.partition_key = l.partition_key{GL_T}
         ORDER BY t.id
         LIMIT 1)
        UNION ALL
        (SELECT t.id, t.status, t.attempts, t.max_attempts, t.scheduled_at, t.last_error, t.created_at
         FROM {T} t
         WHERE t.status = 'pending'
           AND t.topic = l.topic AND t.partition_key = l.partition_key{GL_T}
           AND (t.scheduled_at <= now() OR t.locked_until IS NOT NULL OR t.last_error IS NOT NULL)
         ORDER BY t.id
         LIMIT 1)
    ) x
    ORDER BY x.id
    LIMIT 1
) h
WHERE (l.blocked OR (h.status = 'pending' AND h.last_error IS NOT NULL AND h.scheduled_at > now()))
  AND (@topic::text = '' OR l.topic = @topic){G_L}
ORDER BY h.created_at, l.topic, l.partition_key
LIMIT @limit`)

	q.leases = r.Replace(`
SELECT x.locked_by, sum(x.nrows)::bigint, sum(x.nlanes)::bigint, min(x.first_until), max(x.last_until), now()
FROM (
    SELECT t.locked_by, count(*) AS nrows, 0 AS nlanes, min(t.locked_until) AS first_until,
           max(t.locked_until) AS last_until
    FROM {T} t
    WHERE t.status = 'pending' AND t.locked_by IS NOT NULL{G_T}
    GROUP BY t.locked_by
    UNION ALL
    SELECT l.locked_by, 0, count(*), min(l.locked_until), max(l.locked_until)
    FROM {L} l
    WHERE l.locked_by IS NOT NULL{G_L}
    GROUP BY l.locked_by
) x
GROUP BY x.locked_by
ORDER BY x.locked_by`)

	// Rows completed in the window, by bucket (0 = the latest), through the
	// partial index on completed_at.
	q.throughput = r.Replace(`
SELECT floor(extract(epoch FROM now() - t.completed_at) / @bucket)::int AS ago, count(*)
FROM {T} t
WHERE t.status = 'completed' AND t.completed_at > now() - make_interval(secs => @window){G_T}
GROUP BY 1`)

	// The filter's conditions are added as the filter asks (failedConditions)
	// rather than written as "@x = '' OR …", so that the plan of each shape
	// of filter fits it, cached generic plans included.
	q.failedCols = r.Replace(`
SELECT t.id, COALESCE(t.event_id::text, ''), {GCOL}, t.topic, COALESCE(t.partition_key, ''),
       COALESCE(t.event_type, ''), t.attempts, t.max_attempts, COALESCE(t.last_error, ''), t.created_at`)
	q.failedFrom = r.Replace(`
FROM {T} t
WHERE t.status = 'failed'{G_T}`)

	// Consumer groups with pending or failed rows, by skipping through the
	// lanes' primary key and the partial indexes that lead with the group
	// (one index probe per group, however many rows each has).
	if inbox {
		q.groups = r.Replace(`
WITH RECURSIVE lg AS (
    (SELECT l.consumer_group AS g FROM {L} l ORDER BY 1 LIMIT 1)
    UNION ALL
    SELECT (SELECT l.consumer_group FROM {L} l WHERE l.consumer_group > lg.g ORDER BY 1 LIMIT 1)
    FROM lg WHERE lg.g IS NOT NULL
), fg AS (
    (SELECT t.consumer_group AS g FROM {T} t WHERE t.status = 'failed' ORDER BY 1 LIMIT 1)
    UNION ALL
    SELECT (SELECT t.consumer_group FROM {T} t WHERE t.status = 'failed' AND t.consumer_group > fg.g
            ORDER BY 1 LIMIT 1)
    FROM fg WHERE fg.g IS NOT NULL
), ug AS (
    (SELECT t.consumer_group AS g FROM {T} t WHERE t.status = 'pending' AND t.partition_key IS NULL
     ORDER BY 1 LIMIT 1)
    UNION ALL
    SELECT (SELECT t.consumer_group FROM {T} t WHERE t.status = 'pending' AND t.partition_key IS NULL
            AND t.consumer_group > ug.g ORDER BY 1 LIMIT 1)
    FROM ug WHERE ug.g IS NOT NULL
)
SELECT g FROM lg WHERE g IS NOT NULL
UNION SELECT g FROM fg WHERE g IS NOT NULL
UNION SELECT g FROM ug WHERE g IS NOT NULL
ORDER BY 1`)
	}

	q.lane = r.Replace(`
SELECT l.blocked, NULLIF(l.ready_at, 'infinity'), COALESCE(l.locked_by, ''), l.locked_until
FROM {L} l
WHERE l.consumer_group = @lgroup AND l.topic = @topic AND l.partition_key = @key`)

	// Discard deletes one failed row. A lane frozen behind it by the Block
	// policy is woken: a relay that finds another failed row ahead blocks it
	// again when it reconciles, as after a requeue.
	q.discard = r.Replace(`
WITH d AS (
    DELETE FROM {T} t
    WHERE t.id = @id AND t.status = 'failed'{G_T}
    RETURNING {GCOL} AS consumer_group, t.topic, t.partition_key, COALESCE(t.event_id::text, '') AS event_id
), u AS (
    UPDATE {L} l SET blocked = false, ready_at = LEAST(l.ready_at, now())
    FROM d
    WHERE l.consumer_group = d.consumer_group AND l.topic = d.topic AND l.partition_key = d.partition_key
      AND l.blocked
)
SELECT count(*), COALESCE(max(d.event_id), '') FROM d`)
	return q
}

// failedConditions are the conditions of f, on the row alias t, with the
// named arguments FailedFilter.args sets.
func failedConditions(f FailedFilter) string {
	var b strings.Builder
	if f.Topic != "" {
		b.WriteString(" AND t.topic = @topic")
	}
	if f.PartitionKey != "" {
		b.WriteString(" AND t.partition_key = @key")
	}
	if f.ErrorContains != "" {
		b.WriteString(" AND strpos(lower(COALESCE(t.last_error, '')), lower(@err)) > 0")
	}
	if !f.CreatedFrom.IsZero() {
		b.WriteString(" AND t.created_at >= @from")
	}
	if !f.CreatedBefore.IsZero() {
		b.WriteString(" AND t.created_at < @to")
	}
	return b.String()
}

// failedMatching lists the failed rows f selects after @after, @limit at most.
func (q consoleQueries) failedMatching(f FailedFilter) string {
	return q.failedCols + q.failedFrom + failedConditions(f) + `
  AND t.id > @after
ORDER BY t.id
LIMIT @limit`
}

// countMatching counts the failed rows f selects.
func (q consoleQueries) countMatching(f FailedFilter) string {
	return `SELECT count(*)` + q.failedFrom + failedConditions(f)
}
