-- {{.Table}}: autovacuum settings for a queue (issue 27, docs/operations.md,
-- "Vacuum").
--
-- The lanes and notes tables hold a few rows per key, and every lease,
-- give-back and new key leaves a dead version: a busy relay makes thousands
-- a second, and every writer's lookup and every fetch walks those not yet
-- vacuumed. PostgreSQL's default waits until 20 % of a table is dead and
-- then vacuums with a cost delay; these tables are vacuumed as soon as
-- autovacuum finds 1,000 dead versions in them (it looks once per
-- autovacuum_naptime), without delay (a vacuum of them reads a few pages).
-- Subscribers also vacuum them every few seconds themselves
-- (SubscriberConfig.VacuumInterval), which works when autovacuum is off or
-- between its visits.
-- vacuum_truncate = false: giving empty pages at the end of a table back
-- to the file system takes an ACCESS EXCLUSIVE lock, which stops every
-- writer's lookup and every fetch while it lasts; the next lanes and notes
-- reuse the pages instead.
ALTER TABLE {{.Lanes}} SET (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000,
                            autovacuum_vacuum_cost_delay = 0, vacuum_truncate = false);
ALTER TABLE {{.Notes}} SET (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000,
                            autovacuum_vacuum_cost_delay = 0, vacuum_truncate = false);
-- The table itself: each delivered event leaves two dead versions (its
-- lease and its completion). Vacuum at 5 % dead instead of 20 %, so the
-- space of the versions is reused by the next ones before the table grows.{{if .Partitioned}}
-- (A partitioned table has no storage of its own: each partition is created
-- with these settings.){{else}}
ALTER TABLE {{.Table}} SET (autovacuum_vacuum_scale_factor = 0.05, autovacuum_vacuum_threshold = 10000);{{end}}
