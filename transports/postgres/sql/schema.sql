-- The statements of Migrate and Drop (schema.go) and of Admin.SchemaState.
-- The migrations themselves are the versioned files in migrations/; {M} is
-- the bookkeeping table (omnibus_schema_migrations) in the schema of {T}.

-- name: MigrationLock
-- Taken for the length of Migrate's or Drop's transaction, so that services
-- starting at once migrate one after the other.
SELECT pg_advisory_xact_lock($1)

-- name: CreateSchema
CREATE SCHEMA IF NOT EXISTS {SCHEMA}

-- name: CreateMigrationsTable
CREATE TABLE IF NOT EXISTS {M} (
    table_name text NOT NULL,
    version    integer NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (table_name, version))

-- name: AppliedVersion
-- The highest migration recorded for the table named $1 (bare name).
SELECT COALESCE(max(version), 0) FROM {M} WHERE table_name = $1

-- name: RecordVersion
INSERT INTO {M} (table_name, version) VALUES ($1, $2)

-- name: SchemaObjects
-- Whether a table and its lanes table exist, and whether the bookkeeping
-- table of its schema does. It takes their quoted names as text: to_regclass
-- answers NULL for a missing relation or schema instead of failing.
SELECT to_regclass($1) IS NOT NULL AND to_regclass($2) IS NOT NULL, to_regclass($3) IS NOT NULL

-- name: DropTables
-- Drop: the table, its lanes table and its lane notes table; their triggers
-- and indexes go with them.
DROP TABLE IF EXISTS {T}, {L}, {N}, {D} CASCADE

-- name: DropFunctions
-- Drop: the functions the migrations created for the table.
DROP FUNCTION IF EXISTS {LANE_FN}(), {NOTIFY_FN}(), {LANE_LOCK_FN}(text, text, text), {DEDUP_FN}(), {CREATED_FN}(), {PARTITION_INTERVAL_FN}()

-- name: ForgetMigrations
-- Drop: the table's migration records, so that Migrate starts over.
DELETE FROM {M} WHERE table_name = $1
