// Package postgres is omnibus's PostgreSQL transport: the outbox and inbox
// tables and their migrations, the Outbox writer that inserts events in the
// caller's transaction, the head-of-key Subscriber that delivers rows in order
// per (topic, partition key), and Admin for operators.
//
//	if err := postgres.Migrate(ctx, pool, postgres.OutboxTable("")); err != nil { ... }
//	outbox, _ := postgres.NewOutbox(postgres.OutboxConfig{})
//	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
//		// ... the business change ...
//		return outbox.Enqueue(ctx, tx, "orders", msg) // commits with tx
//	})
//
//	sub, _ := postgres.NewSubscriber(pool, postgres.SubscriberConfig{}, logger)
//	msgs, _ := sub.Subscribe(ctx, postgres.AllTopics)
//
// # Ordering
//
// For every (topic, partition key) rows are delivered in id (insert) order,
// and a row that failed holds its key back until it is delivered or fails for
// good. A pending row is "in line" when it is due, leased, or was tried and
// waits for its retry; a row is handed out only when no earlier row of its key
// is in line. A delayed row that was never tried does not hold its key, and a
// failed row does not either (unless FailedBlock). Up to RunLength rows of a
// key are fetched at once and emitted one at a time, each after the previous
// was acked; different keys go out concurrently.
//
// Order needs no writer discipline: writers of one key may overlap, commit in
// any order or roll back. A writer locks its key's lane before its row gets
// its id, until it commits, and relays skip such keys, so no row is handed out
// while a row of its key with a smaller id may still commit; an open
// transaction that wrote a key holds that key (only) back. A relay whose
// lease on a key ran out, or was taken over, stops that key's run before its
// next row (LeaseObserver). See docs/ordering.md.
//
// # Cost
//
// Each key with pending rows has a row in the "<table>_lanes" table, kept by
// a trigger on insert. Relays lease lanes, not rows, so a fetch costs the same
// however many rows wait behind a key's head. A fetch leases lanes and rows in
// one short transaction of two statements; acks and nacks are written in
// batches.
//
// # SQL
//
// Every statement the package runs is a named block ("-- name: Pick") of a
// file in sql/, embedded in the binary and reviewed as a set: engine.sql
// (fetch, settle, lanes), write.sql (Outbox and Inbox writers), admin.sql and
// console.sql (Admin), schema.sql (Migrate, Drop), connection.sql. Table names
// are the only values that come from outside; they are validated and quoted
// before they are spliced in. The versioned migrations are in migrations/.
package postgres
