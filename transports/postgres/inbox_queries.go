package postgres

// The statements of the inbox writer and of completing a row inside a
// caller's transaction. The inbox insert itself is queries.insertInbox; the
// statements here are built the same way, from a validated, quoted name.

// inboxQueries holds the inbox statements that queries.go does not.
type inboxQueries struct {
	// insertCompleted is insertInbox for rows that were handled in the
	// inserting transaction (inline consumers): they are written completed,
	// so the lane trigger skips them and no subscriber ever fetches them.
	insertCompleted string
	// remove deletes the rows of some message ids of one group (an inline
	// consumer undoing its insert in the same transaction).
	remove string
}

func newInboxQueries(t tableName) *inboxQueries {
	return &inboxQueries{
		insertCompleted: `
INSERT INTO ` + t.quoted() + ` (message_id, consumer_group, event_id, topic, partition_key, event_type, payload, metadata, max_attempts, status, completed_at)
SELECT u.message_id, $1, u.event_id, u.topic, u.partition_key, u.event_type, u.payload, u.metadata, u.max_attempts, 'completed', now()
FROM unnest($2::text[], $3::uuid[], $4::text[], $5::text[], $6::text[], $7::bytea[], $8::jsonb[], $9::int[])
     WITH ORDINALITY AS u(message_id, event_id, topic, partition_key, event_type, payload, metadata, max_attempts, ord)
ORDER BY u.ord
ON CONFLICT (message_id, consumer_group) DO NOTHING
RETURNING message_id`,
		remove: `
DELETE FROM ` + t.quoted() + `
WHERE consumer_group = $1 AND message_id = ANY($2::text[])`,
	}
}

// completeRowSQL completes one leased row in the caller's transaction. The
// lease guard makes it a no-op (0 rows) when another worker took the row
// over; the caller must then roll back. Clearing locked_by also turns the
// subscriber's later batched ack of the row into a no-op.
func completeRowSQL(t tableName) string {
	return `
UPDATE ` + t.quoted() + `
SET status = 'completed', completed_at = now(), locked_by = NULL, locked_until = NULL, attempts = attempts - 1
WHERE id = $1 AND locked_by = $2 AND status = 'pending' AND attempts = $3`
}
