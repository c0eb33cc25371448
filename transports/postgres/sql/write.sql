-- The writers' statements: Outbox.Enqueue and Inbox.Store / Inbox.Remove.
-- Each takes its rows as arrays (one round trip however many messages) and
-- keeps their order through WITH ORDINALITY, so ids follow the caller's order.

-- name: InsertOutbox
-- Outbox.Enqueue: the same event enqueued twice for one topic is stored once.
-- ON CONFLICT without a target: the unique index of the single table, or the
-- dedup trigger of the partitioned layout (migration 0001), whichever the
-- table has.
INSERT INTO {T} (event_id, topic, partition_key, event_type, payload, metadata, max_attempts, scheduled_at)
SELECT u.event_id, $1, u.partition_key, u.event_type, u.payload, u.metadata, u.max_attempts, COALESCE(u.scheduled_at, now())
FROM unnest($2::uuid[], $3::text[], $4::text[], $5::bytea[], $6::jsonb[], $7::int[], $8::timestamptz[])
     WITH ORDINALITY AS u(event_id, partition_key, event_type, payload, metadata, max_attempts, scheduled_at, ord)
ORDER BY u.ord
ON CONFLICT DO NOTHING

-- name: InsertInbox
-- Inbox.Store: returns the message ids that were new for the group. With $10
-- the rows were handled in the inserting transaction (inline consumers): they
-- are written completed, so the lane trigger skips them and no subscriber
-- ever fetches them.
INSERT INTO {T} (message_id, consumer_group, event_id, topic, partition_key, event_type, payload, metadata, max_attempts, status, completed_at)
SELECT u.message_id, $1, u.event_id, u.topic, u.partition_key, u.event_type, u.payload, u.metadata, u.max_attempts,
       CASE WHEN $10::boolean THEN 'completed' ELSE 'pending' END, CASE WHEN $10::boolean THEN now() END
FROM unnest($2::text[], $3::uuid[], $4::text[], $5::text[], $6::text[], $7::bytea[], $8::jsonb[], $9::int[])
     WITH ORDINALITY AS u(message_id, event_id, topic, partition_key, event_type, payload, metadata, max_attempts, ord)
ORDER BY u.ord
ON CONFLICT DO NOTHING
RETURNING message_id

-- name: RemoveInbox
-- Inbox.Remove: deletes the rows of some message ids of one group (an inline
-- consumer undoing its insert in the same transaction).
DELETE FROM {T}
WHERE consumer_group = $1 AND message_id = ANY($2::text[])
