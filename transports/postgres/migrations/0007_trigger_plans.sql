-- {{.Table}}: the writer's triggers read through indexes whatever the
-- statistics say.
--
-- PL/pgSQL keeps a plan per connection for each statement of a trigger,
-- and after a few calls a generic one, kept until the table's statistics
-- change. Made on a freshly migrated table (empty, or vacuumed while empty:
-- every new table and every table on a server that runs autovacuum rarely
-- or not at all) that plan was a sequential scan: the dedup check, and the
-- lookups of the key's lane and notes, then read the whole table for every
-- row the connection inserted, longer as it grew (BenchmarkInboxIngest:
-- 0.55 ms per row by 90,000 rows, the ingest at 27 % of its floor). Each
-- lookup has an index that answers it; with sequential scans off inside the
-- functions the planner takes it in every plan. The setting holds only
-- while the function runs.
ALTER FUNCTION {{.Qualified "_lane_fn"}}() SET enable_seqscan = off;{{if .Partitioned}}
ALTER FUNCTION {{.Qualified "_dedup_fn"}}() SET enable_seqscan = off;{{end}}
