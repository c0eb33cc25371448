{{if and .Partitioned (not .Inbox)}}-- {{.Table}}: the partitioned outbox no longer keeps an index of its rows'
-- (event_id, topic). Its dedup table's primary key is what recognises an
-- event enqueued twice (migration 0001), and no statement of omnibus looks
-- a row up by its event id, so the index was written and never read. It
-- was the costliest of the partition's indexes to keep: event ids are
-- random, so every insert and every update that is not HOT (the completion
-- always) wrote to a page anywhere in it, and behind a pinned xmin horizon,
-- where no version is ever pruned, it grew by two or three entries per
-- event, past the server's buffer cache within minutes (make soak-horizon,
-- docs/benchmarks.md). Dropping the partitioned index drops it from every
-- partition.
DROP INDEX IF EXISTS {{.Qualified "_event_idx"}};
{{else}}-- {{.Table}}: nothing to do (migration 0009 concerns the partitioned outbox).
SELECT 1;
{{end}}
