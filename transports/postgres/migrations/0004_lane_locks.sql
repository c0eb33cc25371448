-- {{.Table}}: writers take no lock that can deadlock with another writer
-- (issue 25), and do not write to the lanes table.
--
-- A writer of a key holds the key's advisory lock SHARED, from before its
-- row gets an id until it commits or rolls back. Shared locks never conflict
-- with each other, so two business transactions that enqueue the same keys
-- in opposite orders never wait for each other. A relay takes the lock
-- EXCLUSIVELY, and only with a try (or a lock timeout, when it waits its turn
-- on a hot key), before it reads a key's rows: while any writer of a key is
-- in flight, no relay reads that key, so no row is handed out while a row
-- with a smaller id may still commit (DESIGN §4.3 rule 6). A relay never
-- waits for a writer while holding such a lock, and a writer waits only for
-- a relay's short fetch, so no cycle can form.
--
-- The lock is one of {{.LaneLockBuckets}} per table, chosen by a hash of the lane:
-- a transaction holds at most that many whatever number of keys it writes,
-- and two keys that share one only wait a moment longer for each other's
-- relay.
--
-- A writer does not create or wake its key's lane itself (that would be a
-- row lock another writer may wait for). When the lane is missing, or
-- asleep until after the new row is due, it leaves a note in {{.Notes}} (an
-- insert, which waits for nobody); relays turn notes into lanes at the start
-- of each fetch. A writer whose transaction is not READ COMMITTED cannot
-- trust what its snapshot says of the lane, so it always leaves a note.
CREATE TABLE IF NOT EXISTS {{.Notes}} (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    consumer_group text NOT NULL DEFAULT '',
    topic          text NOT NULL,
    partition_key  text NOT NULL,
    ready_at       timestamptz NOT NULL
);
CREATE INDEX IF NOT EXISTS {{.Ident "_notes_key_idx"}} ON {{.Notes}} (consumer_group, topic, partition_key);

DO $do$
BEGIN
EXECUTE format($fmt$
CREATE OR REPLACE FUNCTION {{.Qualified "_lane_fn"}}() RETURNS trigger
LANGUAGE plpgsql AS $fn$
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
    rc := current_setting('transaction_isolation') = 'read committed';
    SELECT l.ready_at, l.blocked INTO lane_ready, lane_blocked FROM {{.Lanes}} l
    WHERE l.consumer_group = lane_group AND l.topic = NEW.topic AND l.partition_key = NEW.partition_key;
    -- A blocked lane (FailedBlock) stays asleep: a new row cannot unblock it.
    IF NOT rc OR NOT FOUND OR (lane_ready > NEW.scheduled_at AND NOT lane_blocked) THEN
        IF NOT rc OR NOT EXISTS (
            SELECT 1 FROM {{.Notes}} n
            WHERE n.consumer_group = lane_group AND n.topic = NEW.topic AND n.partition_key = NEW.partition_key
              AND n.ready_at <= NEW.scheduled_at) THEN
            INSERT INTO {{.Notes}} (consumer_group, topic, partition_key, ready_at)
            VALUES (lane_group, NEW.topic, NEW.partition_key, NEW.scheduled_at);
        END IF;
    END IF;
    NEW.id := nextval(%L::regclass);
    RETURN NEW;
END
$fn$
$fmt$, pg_get_serial_sequence({{.TableLiteral}}, 'id'));
END
$do$;

-- The gate of the earlier design is gone: a relay that waits for the
-- exclusive advisory lock queues new writers behind it by itself.
ALTER TABLE {{.Lanes}} DROP COLUMN IF EXISTS gated;
