-- {{.Notes}}: a note carries the id of the row it was left for, and a lane
-- made from notes starts its floor at the smallest of them.
--
-- A key's lane is deleted when the key drains, and made again from the
-- notes of the key's next writers. Made with floor 0, every lookup of the
-- new lane's rows (the fetch, the give-back, the check that it is empty)
-- started at the key's first entry in the key index: one entry for every
-- row the key ever completed since the table was last vacuumed, and behind
-- a pinned xmin horizon a visit to the table for each (in make
-- soak-horizon the give-back read 300 buffers per lane after 4 minutes).
--
-- Every pending row of a key that has no lane has a note with an id no
-- larger than its own: its writer left one, or found one already committed
-- with a smaller id. So the smallest id of the key's notes is a floor.
-- Notes of writers that commit after a fetch took the others lower the
-- lane's floor when they are taken, and the fetch's pick starts at the
-- smallest id of the key's notes it sees (engine.sql, Pick). Notes left
-- before this migration carry 0, which is always a floor.
ALTER TABLE {{.Notes}} ADD COLUMN IF NOT EXISTS row_id bigint NOT NULL DEFAULT 0;

DO $do$
BEGIN
EXECUTE format($fmt$
CREATE OR REPLACE FUNCTION {{.Qualified "_lane_fn"}}() RETURNS trigger
LANGUAGE plpgsql
SET enable_seqscan = off -- migration 0007
AS $fn$
DECLARE
    lane_ready   timestamptz;
    lane_blocked boolean;
    lane_group   text := {{if .Inbox}}NEW.consumer_group{{else}}''{{end}};
    rc           boolean;
BEGIN
    IF NEW.status <> 'pending' OR NEW.partition_key IS NULL THEN
        RETURN NEW;
    END IF;
{{if not .Partitioned}}    -- A duplicate (ON CONFLICT DO NOTHING will skip it) takes no lock.
    IF EXISTS (SELECT 1 FROM {{.Table}} d WHERE {{if .Inbox}}d.message_id = NEW.message_id AND d.consumer_group = NEW.consumer_group{{else}}d.event_id = NEW.event_id AND d.topic = NEW.topic{{end}}) THEN
        RETURN NEW;
    END IF;
{{end}}    PERFORM pg_advisory_xact_lock_shared({{.LaneLock "lane_group" "NEW.topic" "NEW.partition_key"}});
    -- The id is taken after the lock (DESIGN §4.3 rule 6) and before the
    -- note, which carries it.
    NEW.id := nextval(%L::regclass);
    rc := current_setting('transaction_isolation') = 'read committed';
    SELECT l.ready_at, l.blocked INTO lane_ready, lane_blocked FROM {{.Lanes}} l
    WHERE l.consumer_group = lane_group AND l.topic = NEW.topic AND l.partition_key = NEW.partition_key;
    -- A blocked lane (FailedBlock) stays asleep: a new row cannot unblock it.
    IF NOT rc OR NOT FOUND OR (lane_ready > NEW.scheduled_at AND NOT lane_blocked) THEN
        IF NOT rc OR NOT EXISTS (
            SELECT 1 FROM {{.Notes}} n
            WHERE n.consumer_group = lane_group AND n.topic = NEW.topic AND n.partition_key = NEW.partition_key
              AND n.ready_at <= NEW.scheduled_at AND n.row_id <= NEW.id) THEN
            INSERT INTO {{.Notes}} (consumer_group, topic, partition_key, ready_at, row_id)
            VALUES (lane_group, NEW.topic, NEW.partition_key, NEW.scheduled_at, NEW.id);
        END IF;
    END IF;
    RETURN NEW;
END
$fn$
$fmt$, pg_get_serial_sequence({{.TableLiteral}}, 'id'));
END
$do$;
