-- {{.Lanes}}: a lane's lease covers the rows its relay hands out (issues 26
-- and 27). A relay no longer updates each keyed row it hands out (the row
-- lease: locked_by, locked_until, attempts + 1); it writes on the lane which
-- rows it handed out, run_by and run_end: the worker and the highest row id
-- of the lane's runs not yet given back. A row is then written once in its
-- life after its insert, by its settlement, instead of twice: behind a pinned
-- xmin horizon, where no version is pruned, half of those leases found no
-- room on their page and wrote an entry into every index of the row.
-- run_at is when the first run since the lane was leased was handed out:
-- every row of the lane from its floor to run_end that was due then is one
-- the runs handed out (a run is every row in line up to its end, and rows
-- with smaller ids cannot commit later); a row due only later (delayed,
-- never tried, or requeued) may not have been.
--
-- A lane given back (reconciled, deleted, or made ready again) has no run.
-- A lane leased while it still has one lost its last lease without a
-- give-back: the relay died, or lost the lease while handling. The lease
-- that takes it over first writes on each pending row of that run what the
-- row lease would have written (LeaseLanes, "lost"): the delivery is
-- counted, and the row is left over from an expired lease, so the rules of
-- crash accounting (one row at a time, attempts spent) apply as before.
ALTER TABLE {{.Lanes}} ADD COLUMN IF NOT EXISTS run_by text;
ALTER TABLE {{.Lanes}} ADD COLUMN IF NOT EXISTS run_end bigint;
ALTER TABLE {{.Lanes}} ADD COLUMN IF NOT EXISTS run_at timestamptz;
