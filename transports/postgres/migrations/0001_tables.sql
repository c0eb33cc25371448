-- {{.Table}}: {{if .Inbox}}inbox{{else}}outbox{{end}} rows, one per event.{{if .Partitioned}}
-- The partitioned layout (outbox/inbox.partition_interval): the table is
-- range-partitioned on created_at, so retention drops whole partitions
-- instead of deleting rows (docs/operations.md, "Partitions").{{end}}
CREATE TABLE IF NOT EXISTS {{.Table}} (
    id            bigint GENERATED ALWAYS AS IDENTITY{{if not .Partitioned}} PRIMARY KEY{{end}},
    event_id      uuid{{if not .Inbox}} NOT NULL{{end}},
    topic         text NOT NULL,
    partition_key text,
    event_type    text,
    payload       bytea NOT NULL,
    metadata      jsonb NOT NULL DEFAULT '{}'::jsonb,
    status        text NOT NULL DEFAULT 'pending'
                  CONSTRAINT {{.Ident "_status_check"}} CHECK (status IN ('pending', 'completed', 'failed')),
    attempts      integer NOT NULL DEFAULT 0,
    max_attempts  integer NOT NULL DEFAULT 6 CONSTRAINT {{.Ident "_max_attempts_check"}} CHECK (max_attempts > 0),
    last_error    text,
    scheduled_at  timestamptz NOT NULL DEFAULT now(),
    locked_by     text,
    locked_until  timestamptz,
    created_at    timestamptz NOT NULL DEFAULT now(),
    completed_at  timestamptz{{if .Inbox}},
    consumer_group text NOT NULL,
    message_id     text NOT NULL{{end}}{{if .Partitioned}},
    -- A unique index of a partitioned table must hold its partition column.
    PRIMARY KEY (id, created_at){{end}}
){{if .Partitioned}}
PARTITION BY RANGE (created_at);{{else}}
-- Leasing and settling update rows in place; free space in each page lets
-- those updates be HOT (no index maintenance).
WITH (fillfactor = 70);{{end}}
{{if .Partitioned}}
-- Rows whose time has no partition of its own (none was created ahead for
-- it yet) land here, so a writer never fails for want of a partition. The
-- partitions themselves are created ahead and dropped by the relays
-- (partitions.go); each gets the storage settings of a single table.
CREATE TABLE IF NOT EXISTS {{.Qualified "_default"}} PARTITION OF {{.Table}} DEFAULT
WITH ({{.PartitionStorage}});

-- The partition width, read by the relays that create and drop partitions.
CREATE OR REPLACE FUNCTION {{.Qualified "_interval_fn"}}() RETURNS interval
LANGUAGE sql IMMUTABLE AS $fn$ SELECT {{.PartitionIntervalLiteral}} $fn$;

-- Uniqueness that spans partitions: a unique index of the partitioned table
-- would have to include created_at and so would hold only within one
-- partition. {{.Dedup}} holds the {{if .Inbox}}(message_id, consumer_group){{else}}(event_id, topic){{end}} of every row
-- for the retention (the relays delete older entries with the partitions
-- they drop); a BEFORE trigger skips a row whose key it already holds, as
-- ON CONFLICT DO NOTHING does on the single table, and waits, as a unique
-- index does, for a transaction that inserted the same key to end.
CREATE TABLE IF NOT EXISTS {{.Dedup}} (
{{if .Inbox}}    message_id     text NOT NULL,
    consumer_group text NOT NULL,{{else}}    event_id       uuid NOT NULL,
    topic          text NOT NULL,{{end}}
    created_at     timestamptz NOT NULL,
    PRIMARY KEY ({{if .Inbox}}message_id, consumer_group{{else}}event_id, topic{{end}})
);
CREATE INDEX IF NOT EXISTS {{.Ident "_dedup_at_idx"}} ON {{.Dedup}} (created_at);
CREATE OR REPLACE FUNCTION {{.Qualified "_dedup_fn"}}() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    IF TG_OP = 'DELETE' THEN
        DELETE FROM {{.Dedup}} d WHERE {{if .Inbox}}d.message_id = OLD.message_id AND d.consumer_group = OLD.consumer_group{{else}}d.event_id = OLD.event_id AND d.topic = OLD.topic{{end}};
        RETURN NULL;
    END IF;
    INSERT INTO {{.Dedup}} VALUES ({{if .Inbox}}NEW.message_id, NEW.consumer_group{{else}}NEW.event_id, NEW.topic{{end}}, NEW.created_at)
    ON CONFLICT DO NOTHING;
    IF NOT FOUND THEN
        RETURN NULL; -- a duplicate: skip the row
    END IF;
    RETURN NEW;
END
$fn$;
-- Named to fire before the lane trigger (triggers fire in name order): a
-- duplicate takes no lane lock.
DROP TRIGGER IF EXISTS {{.Ident "_dedup_trg"}} ON {{.Table}};
CREATE TRIGGER {{.Ident "_dedup_trg"}} BEFORE INSERT ON {{.Table}}
    FOR EACH ROW EXECUTE FUNCTION {{.Qualified "_dedup_fn"}}();
-- A deleted row (Inbox.Remove, admin delete) is forgotten, as on the single
-- table; a dropped partition fires no trigger, its entries age out.
DROP TRIGGER IF EXISTS {{.Ident "_dedup_del_trg"}} ON {{.Table}};
CREATE TRIGGER {{.Ident "_dedup_del_trg"}} AFTER DELETE ON {{.Table}}
    FOR EACH ROW EXECUTE FUNCTION {{.Qualified "_dedup_fn"}}();
-- A row never moves between partitions: moving is a delete and an insert,
-- and the insert would run the dedup and lane triggers again (the row would
-- be skipped as a duplicate of itself).
CREATE OR REPLACE FUNCTION {{.Qualified "_created_fn"}}() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    RAISE EXCEPTION 'omnibus: created_at of a row of {{.Table}} cannot change (it chooses the row''s partition)'
        USING ERRCODE = 'feature_not_supported';
END
$fn$;
DROP TRIGGER IF EXISTS {{.Ident "_created_trg"}} ON {{.Table}};
CREATE TRIGGER {{.Ident "_created_trg"}} BEFORE UPDATE OF created_at ON {{.Table}}
    FOR EACH ROW WHEN (OLD.created_at IS DISTINCT FROM NEW.created_at) EXECUTE FUNCTION {{.Qualified "_created_fn"}}();
{{if .Inbox}}
CREATE INDEX IF NOT EXISTS {{.Ident "_message_idx"}} ON {{.Table}} (message_id, consumer_group);
{{else}}
CREATE INDEX IF NOT EXISTS {{.Ident "_event_idx"}} ON {{.Table}} (event_id, topic);
{{end}}{{else}}{{if .Inbox}}
CREATE UNIQUE INDEX IF NOT EXISTS {{.Ident "_message_uidx"}} ON {{.Table}} (message_id, consumer_group);
{{else}}
-- The same event enqueued twice for one topic is stored once; the same event
-- fanned out to two topics is two rows.
CREATE UNIQUE INDEX IF NOT EXISTS {{.Ident "_event_uidx"}} ON {{.Table}} (event_id, topic);
{{end}}{{end}}
-- Fetch of unkeyed rows: due pending rows without a partition key, oldest first.
CREATE INDEX IF NOT EXISTS {{.Ident "_fetch_idx"}} ON {{.Table}} ({{if .Inbox}}consumer_group, {{end}}scheduled_at, id)
    WHERE status = 'pending' AND partition_key IS NULL;
-- Per key: the pending rows of a (topic, partition_key) in delivery order.
CREATE INDEX IF NOT EXISTS {{.Ident "_key_idx"}} ON {{.Table}} ({{if .Inbox}}consumer_group, {{end}}topic, partition_key, id)
    WHERE status = 'pending';
-- Per key: failed rows, for the Block policy and for listing failures.
CREATE INDEX IF NOT EXISTS {{.Ident "_failed_idx"}} ON {{.Table}} ({{if .Inbox}}consumer_group, {{end}}topic, partition_key, id)
    WHERE status = 'failed';
-- Cleanup of completed rows by age.
CREATE INDEX IF NOT EXISTS {{.Ident "_completed_idx"}} ON {{.Table}} (completed_at)
    WHERE status = 'completed';

-- {{.Lanes}}: one row per key that has pending rows. Relays lease lanes, not
-- rows, so the cost of a fetch does not grow with the rows behind a head.
CREATE TABLE IF NOT EXISTS {{.Lanes}} (
    consumer_group text NOT NULL DEFAULT '',
    topic          text NOT NULL,
    partition_key  text NOT NULL,
    ready_at       timestamptz NOT NULL,
    blocked        boolean NOT NULL DEFAULT false,
    locked_by      text,
    locked_until   timestamptz,
    PRIMARY KEY (consumer_group, topic, partition_key)
)
WITH (fillfactor = 50);
CREATE INDEX IF NOT EXISTS {{.Ident "_lanes_ready_idx"}} ON {{.Lanes}} (ready_at);

-- Writers make sure the lane of every keyed row they insert exists, in their
-- own transaction. On an existing lane they take only a KEY SHARE lock: it
-- does not conflict with relays leasing or updating the lane (FOR NO KEY
-- UPDATE), so writers never hold a relay back, but it does keep a relay from
-- deleting the lane until the writer's row is committed and visible.
CREATE OR REPLACE FUNCTION {{.Qualified "_lane_fn"}}() RETURNS trigger
LANGUAGE plpgsql AS $fn$
DECLARE
    lane_ready timestamptz;
    lane_group text := {{if .Inbox}}NEW.consumer_group{{else}}''{{end}};
BEGIN
    IF NEW.status <> 'pending' OR NEW.partition_key IS NULL THEN
        RETURN NULL;
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
            RETURN NULL;
        END IF;
        INSERT INTO {{.Lanes}} (consumer_group, topic, partition_key, ready_at)
        VALUES (lane_group, NEW.topic, NEW.partition_key, NEW.scheduled_at)
        ON CONFLICT DO NOTHING;
        IF FOUND THEN
            RETURN NULL;
        END IF;
        -- Another writer created it meanwhile: take the shared lock on theirs.
    END LOOP;
END
$fn$;
DROP TRIGGER IF EXISTS {{.Ident "_lane_trg"}} ON {{.Table}};
CREATE TRIGGER {{.Ident "_lane_trg"}} AFTER INSERT ON {{.Table}}
    FOR EACH ROW EXECUTE FUNCTION {{.Qualified "_lane_fn"}}();

-- One notification per inserting statement; PostgreSQL delivers it only if
-- the transaction commits, and folds duplicates within a transaction.
CREATE OR REPLACE FUNCTION {{.Qualified "_notify_fn"}}() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    PERFORM pg_notify({{.ChannelLiteral}}, '');
    RETURN NULL;
END
$fn$;
DROP TRIGGER IF EXISTS {{.Ident "_notify_trg"}} ON {{.Table}};
CREATE TRIGGER {{.Ident "_notify_trg"}} AFTER INSERT ON {{.Table}}
    FOR EACH STATEMENT EXECUTE FUNCTION {{.Qualified "_notify_fn"}}();
