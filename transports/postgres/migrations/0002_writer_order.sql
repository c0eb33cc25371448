-- {{.Table}}: per-key order without writer discipline (DESIGN §4.3 rule 6).
--
-- A writer locks its key's lane (KEY SHARE) before its row gets an id, and
-- holds the lock until it commits or rolls back. Relays lease lanes FOR
-- UPDATE SKIP LOCKED, which conflicts: while any writer of a key is in
-- flight, no relay reads that key's rows, so no row is handed out while a
-- row with a smaller id may still commit. The id is therefore assigned by
-- this BEFORE trigger, after the lock, not by the column default (which
-- PostgreSQL evaluates before BEFORE triggers; that value is discarded).
--
-- A lane that writers never leave free (overlapping transactions on one
-- hot key) would be skipped forever; a relay that sees a lane starve closes
-- its gate (lanes.gated). Writers that find the gate closed first take the
-- lane's advisory lock shared, so they queue behind the relay, which holds
-- it exclusively while it waits for the writers that came before the gate.
ALTER TABLE {{.Lanes}} ADD COLUMN IF NOT EXISTS gated boolean NOT NULL DEFAULT false;

DO $do$
BEGIN
EXECUTE format($fmt$
CREATE OR REPLACE FUNCTION {{.Qualified "_lane_fn"}}() RETURNS trigger
LANGUAGE plpgsql AS $fn$
DECLARE
    lane_ready timestamptz;
    lane_gated boolean;
    lane_group text := {{if .Inbox}}NEW.consumer_group{{else}}''{{end}};
BEGIN
    IF NEW.status <> 'pending' OR NEW.partition_key IS NULL THEN
        RETURN NEW;
    END IF;
    -- A duplicate (ON CONFLICT DO NOTHING will skip it) makes no lane.
    IF EXISTS (SELECT 1 FROM {{.Table}} d WHERE {{if .Inbox}}d.message_id = NEW.message_id AND d.consumer_group = NEW.consumer_group{{else}}d.event_id = NEW.event_id AND d.topic = NEW.topic{{end}}) THEN
        RETURN NEW;
    END IF;
    SELECT l.gated INTO lane_gated FROM {{.Lanes}} l
    WHERE l.consumer_group = lane_group AND l.topic = NEW.topic AND l.partition_key = NEW.partition_key;
    IF lane_gated THEN
        PERFORM pg_advisory_xact_lock_shared({{.LaneLockKey "lane_group" "NEW.topic" "NEW.partition_key"}});
    END IF;
    LOOP
        SELECT l.ready_at INTO lane_ready FROM {{.Lanes}} l
        WHERE l.consumer_group = lane_group AND l.topic = NEW.topic AND l.partition_key = NEW.partition_key
        FOR KEY SHARE;
        IF FOUND THEN
            -- A blocked lane (FailedBlock) stays asleep: a new row cannot unblock it.
            IF lane_ready > NEW.scheduled_at THEN
                UPDATE {{.Lanes}} l SET ready_at = NEW.scheduled_at
                WHERE l.consumer_group = lane_group AND l.topic = NEW.topic AND l.partition_key = NEW.partition_key
                  AND l.ready_at > NEW.scheduled_at AND NOT l.blocked;
            END IF;
            EXIT;
        END IF;
        INSERT INTO {{.Lanes}} (consumer_group, topic, partition_key, ready_at)
        VALUES (lane_group, NEW.topic, NEW.partition_key, NEW.scheduled_at)
        ON CONFLICT DO NOTHING;
        EXIT WHEN FOUND;
        -- Another writer created it meanwhile: take the shared lock on theirs.
    END LOOP;
    NEW.id := nextval(%L::regclass);
    RETURN NEW;
END
$fn$
$fmt$, pg_get_serial_sequence({{.TableLiteral}}, 'id'));
END
$do$;
DROP TRIGGER IF EXISTS {{.Ident "_lane_trg"}} ON {{.Table}};
CREATE TRIGGER {{.Ident "_lane_trg"}} BEFORE INSERT ON {{.Table}}
    FOR EACH ROW EXECUTE FUNCTION {{.Qualified "_lane_fn"}}();
