-- The read statements of the admin console (Admin.Overview, HeldKeys, Leases,
-- Throughput, CountFailedMatching, ConsumerGroups, Lane) and Admin.Discard.
-- None of them counts completed rows without a bound: the console must stay
-- fast on a table of millions of delivered rows.

-- name: Overview
-- Pending rows are read through the partial per-key index (status =
-- 'pending'), failed rows through the partial failed index. {COMPLETED} is
-- the CompletedCapped fragment, or CompletedNotCounted for an Admin of one
-- consumer group; past the cap the caller uses the planner's estimate of the
-- table, returned as well: its pg_class.reltuples or, partitioned, the sum
-- of its partitions' (a partitioned table's own is set only by an ANALYZE of
-- it, which autovacuum never runs).
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
    WHERE t.status = 'pending'{GROUP_T}
), f AS (
    SELECT count(*) AS failed FROM {T} t WHERE t.status = 'failed'{GROUP_T}
), c AS (
    {LANE_RUNS}
), k AS (
    {KEY_COUNTS}
)
SELECT p.pending, p.due - c.due, p.leased + c.leased, p.expired + c.expired, p.delayed, p.retrying, p.oldest, now(), f.failed,
       {COMPLETED},
       COALESCE((SELECT sum(GREATEST(c.reltuples, 0))::bigint
                 FROM (SELECT to_regclass(@table) UNION SELECT relid FROM pg_partition_tree(to_regclass(@table))) p(relid)
                 JOIN pg_class c ON c.oid = p.relid WHERE c.relkind = 'r'), -1),
       k.lanes, k.blocked, k.held
FROM p, f, c, k

-- fragment: CompletedCapped
-- Completed rows counted only up to @cap (LIMIT inside).
(SELECT count(*) FROM (SELECT 1 FROM {T} t WHERE t.status = 'completed' LIMIT @cap) x)

-- fragment: CompletedNotCounted
-- A group's completed rows have no index of their own: not counted.
-1::bigint

-- name: HeldKeys
-- The head of a key is its first in-line pending row, or, on a lane frozen by
-- the Block policy, its first failed row when that comes first. A key is held
-- when its head was tried and waits for its retry, or when its lane is
-- blocked.
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
  AND (@topic::text = '' OR l.topic = @topic){GROUP_L}
ORDER BY h.created_at, l.topic, l.partition_key
LIMIT @limit

-- name: Leases
SELECT x.locked_by, sum(x.nrows)::bigint, sum(x.nlanes)::bigint, min(x.first_until), max(x.last_until), now()
FROM (
    SELECT t.locked_by, count(*) AS nrows, 0 AS nlanes, min(t.locked_until) AS first_until,
           max(t.locked_until) AS last_until
    FROM {T} t
    WHERE t.status = 'pending' AND t.locked_by IS NOT NULL{GROUP_T}
    GROUP BY t.locked_by
    UNION ALL
    SELECT l.locked_by, 0, count(*), min(l.locked_until), max(l.locked_until)
    FROM {L} l
    WHERE l.locked_by IS NOT NULL{GROUP_L}
    GROUP BY l.locked_by
    UNION ALL
    -- The rows of lanes' runs (migration 0010), held by the run's worker.
    SELECT l.run_by, count(*), 0, min(l.locked_until), max(l.locked_until)
    {RUN_ROWS}
    GROUP BY l.run_by
) x
GROUP BY x.locked_by
ORDER BY x.locked_by

-- name: Throughput
-- Rows completed in the window, by bucket (0 = the latest), through the
-- partial index on completed_at.
SELECT floor(extract(epoch FROM now() - t.completed_at) / @bucket)::int AS ago, count(*)
FROM {T} t
WHERE t.status = 'completed' AND t.completed_at > now() - make_interval(secs => @window){GROUP_T}
GROUP BY 1

-- name: CountFailed
-- CountFailedMatching; {FILTER} as in ListFailed.
SELECT count(*)
FROM {T} t
WHERE t.status = 'failed'{GROUP_T}{FILTER}

-- The conditions of a FailedFilter, on the row alias t, each added only when
-- its field is set (FailedFilter.conditions).

-- fragment: FilterTopic
AND t.topic = @topic

-- fragment: FilterPartitionKey
AND t.partition_key = @key

-- fragment: FilterErrorContains
AND strpos(lower(COALESCE(t.last_error, '')), lower(@err)) > 0

-- fragment: FilterCreatedFrom
AND t.created_at >= @from

-- fragment: FilterCreatedBefore
AND t.created_at < @to

-- name: ConsumerGroups
-- Inbox only: the consumer groups with pending or failed rows, by skipping
-- through the lanes' primary key, the lane notes' key index and the partial
-- indexes that lead with the group (one index probe per group, however many
-- rows each has).
WITH RECURSIVE lg AS (
    (SELECT l.consumer_group AS g FROM {L} l ORDER BY 1 LIMIT 1)
    UNION ALL
    SELECT (SELECT l.consumer_group FROM {L} l WHERE l.consumer_group > lg.g ORDER BY 1 LIMIT 1)
    FROM lg WHERE lg.g IS NOT NULL
), ng AS (
    (SELECT n.consumer_group AS g FROM {N} n ORDER BY 1 LIMIT 1)
    UNION ALL
    SELECT (SELECT n.consumer_group FROM {N} n WHERE n.consumer_group > ng.g ORDER BY 1 LIMIT 1)
    FROM ng WHERE ng.g IS NOT NULL
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
UNION SELECT g FROM ng WHERE g IS NOT NULL
UNION SELECT g FROM fg WHERE g IS NOT NULL
UNION SELECT g FROM ug WHERE g IS NOT NULL
ORDER BY 1

-- name: Lane
SELECT l.blocked, NULLIF(l.ready_at, 'infinity'), COALESCE(l.locked_by, ''), l.locked_until
FROM {L} l
WHERE l.consumer_group = @lgroup AND l.topic = @topic AND l.partition_key = @key

-- name: Discard
-- Discard deletes one failed row. A lane frozen behind it by the Block policy
-- is woken: a relay that finds another failed row ahead blocks it again when
-- it reconciles, as after a requeue.
WITH d AS (
    DELETE FROM {T} t
    WHERE t.id = @id AND t.status = 'failed'{GROUP_T}
    RETURNING {GCOL} AS consumer_group, t.topic, t.partition_key, COALESCE(t.event_id::text, '') AS event_id
), u AS (
    UPDATE {L} l SET blocked = false, ready_at = LEAST(l.ready_at, now())
    FROM d
    WHERE l.consumer_group = d.consumer_group AND l.topic = d.topic AND l.partition_key = d.partition_key
      AND l.blocked
)
SELECT count(*), COALESCE(max(d.event_id), '') FROM d
