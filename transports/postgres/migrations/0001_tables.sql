-- {{.Table}}: {{if .Inbox}}inbox{{else}}outbox{{end}} rows, one per event.
CREATE TABLE IF NOT EXISTS {{.Table}} (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
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
    message_id     text NOT NULL{{end}}
)
-- Leasing and settling update rows in place; free space in each page lets
-- those updates be HOT (no index maintenance).
WITH (fillfactor = 70);
{{if .Inbox}}
CREATE UNIQUE INDEX IF NOT EXISTS {{.Ident "_message_uidx"}} ON {{.Table}} (message_id, consumer_group);
{{else}}
-- The same event enqueued twice for one topic is stored once; the same event
-- fanned out to two topics is two rows.
CREATE UNIQUE INDEX IF NOT EXISTS {{.Ident "_event_uidx"}} ON {{.Table}} (event_id, topic);
{{end}}
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
