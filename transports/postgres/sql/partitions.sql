-- The partitioned layout (partitions.go): reading the layout, creating
-- partitions ahead, dropping old ones and forgetting old dedup entries.
-- {P} is one partition's quoted name and the bounds are timestamps Go
-- formats, spliced per call: DDL takes no parameters.

-- name: Layout
-- The table's partition interval: NULL for the single table (no interval
-- function), and for a table that does not exist.
SELECT CASE WHEN to_regprocedure($1 || '()') IS NULL THEN NULL
            ELSE (SELECT c.relkind = 'p' FROM pg_class c WHERE c.oid = to_regclass($2)) END

-- name: PartitionInterval
SELECT extract(epoch FROM {PARTITION_INTERVAL_FN}())::bigint

-- name: Partitions
-- The names of the table's partitions but the default one.
SELECT c.relname
FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent = to_regclass($1) AND pg_get_expr(c.relpartbound, c.oid) <> 'DEFAULT'
ORDER BY c.relname

-- name: MaintenanceLock
-- One maintainer per table at a time; the others skip their turn. A session
-- lock on a connection of its own: it goes with the connection if the
-- process dies.
SELECT pg_try_advisory_lock($1)

-- name: MaintenanceUnlock
SELECT pg_advisory_unlock($1)

-- name: DDLTimeout
-- Attaching and detaching wait for the table's lock no longer than this: a
-- long transaction that read the table would otherwise hold the DDL, and
-- every writer queued behind it, for as long as it runs.
SELECT set_config('lock_timeout', $1, true)

-- name: CreatePartition
-- Created on its own, then attached: attaching takes a SHARE UPDATE
-- EXCLUSIVE lock on the table, which writers and relays do not wait for
-- (CREATE TABLE … PARTITION OF would take an ACCESS EXCLUSIVE one).
CREATE TABLE IF NOT EXISTS {P} (LIKE {T} INCLUDING DEFAULTS INCLUDING CONSTRAINTS) WITH ({STORAGE})

-- name: AttachPartition
ALTER TABLE {T} ATTACH PARTITION {P} FOR VALUES FROM ('{FROM}') TO ('{TO}')

-- name: PartitionBusy
-- Whether a partition holds a pending or a failed row (each read from its
-- partial index).
SELECT EXISTS (SELECT 1 FROM {P} t WHERE t.status = 'pending')
    OR EXISTS (SELECT 1 FROM {P} t WHERE t.status = 'failed')

-- name: DetachPartition
ALTER TABLE {T} DETACH PARTITION {P}

-- name: DropPartition
DROP TABLE {P}

-- name: DefaultOldest
-- The oldest row in the default partition (rows written while no partition
-- covered their time): their dedup entries stay while they do.
SELECT min(t.created_at) FROM {DEFAULT} t

-- name: ForgetDedup
-- Dedup entries older than $1, at most $2 at a time.
DELETE FROM {D} d
WHERE d.ctid = ANY(ARRAY(SELECT x.ctid FROM {D} x WHERE x.created_at < $1 LIMIT $2))
