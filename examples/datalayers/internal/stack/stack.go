// Package stack is what the data-layer examples share: the tables, the two
// business transactions (one committed, one rolled back), the relay to an
// in-memory broker and the check of what arrived. Each example supplies
// only its stack's transaction — the part a user copies.
package stack

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/examples/internal/example"
	"github.com/omnibus-go/omnibus/processors"
	"github.com/omnibus-go/omnibus/transports/postgres"
)

// Topic is where the examples' events go.
const Topic = "orders"

// Order is the business row each example writes.
type Order struct {
	ID     string
	Amount int
}

// Write is one stack's business transaction: it inserts order into the
// table named orders (schema.orders, the schema being the run's own) and
// enqueues event with outbox in the same transaction, then commits — or
// rolls back when rollback is set.
type Write func(ctx context.Context, outbox *postgres.Outbox, orders string, order Order, event *message.Message, rollback bool) error

// URL is the PostgreSQL the examples use (OMNIBUS_POSTGRES_URL).
func URL() string {
	if u := os.Getenv("OMNIBUS_POSTGRES_URL"); u != "" {
		return u
	}
	return bus.DefaultPostgresURL
}

// Main runs the example name: open connects the stack and returns its
// Write and what closes it.
func Main(name string, open func(ctx context.Context) (Write, func() error, error)) {
	example.Main(name, 60*time.Second, func(ctx context.Context) error { return run(ctx, name, open) })
}

func run(ctx context.Context, name string, open func(ctx context.Context) (Write, func() error, error)) error {
	pool, err := example.Postgres(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	// The orders table lives in a schema of the run's own, as "orders".
	outboxTable := example.Unique("omnibus_datalayer_outbox_")
	schema := example.Unique("datalayer_")
	orders := schema + ".orders"
	done, err := example.Tidy(ctx, "the example's outbox "+outboxTable+" and schema "+schema, func(ctx context.Context) error {
		return errors.Join(example.DropTables(ctx, pool, []string{outboxTable}), example.DropSchema(ctx, pool, schema))
	})
	if err != nil {
		return err
	}
	defer done()
	if err := postgres.Migrate(ctx, pool, postgres.OutboxTable(outboxTable)); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, `CREATE SCHEMA `+schema+`; CREATE TABLE `+orders+` (id text PRIMARY KEY, amount bigint NOT NULL)`); err != nil {
		return err
	}
	outbox, err := postgres.NewOutbox(postgres.OutboxConfig{Table: outboxTable})
	if err != nil {
		return err
	}

	write, closeStack, err := open(ctx)
	if err != nil {
		return fmt.Errorf("open %s: %w", name, err)
	}
	defer func() { _ = closeStack() }()

	placed := func(o Order) *message.Message {
		msg := message.NewMessage(watermill.NewUUID(), fmt.Appendf(nil, `{"order":%q,"amount":%d}`, o.ID, o.Amount))
		bus.SetPartitionKey(msg, o.ID)
		bus.SetEventType(msg, "order.placed")
		return msg
	}
	kept, dropped := Order{ID: "order-1", Amount: 4200}, Order{ID: "order-2", Amount: 99}
	if err := write(ctx, outbox, orders, kept, placed(kept), false); err != nil {
		return fmt.Errorf("write %s: %w", kept.ID, err)
	}
	if err := write(ctx, outbox, orders, dropped, placed(dropped), true); err != nil {
		return fmt.Errorf("write %s and roll back: %w", dropped.ID, err)
	}
	var nOrders, nEvents int
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM `+orders+`), (SELECT count(*) FROM `+outboxTable+`)`).Scan(&nOrders, &nEvents); err != nil {
		return err
	}
	fmt.Printf("%s: committed %s with its event, rolled %s back: %d order and %d event stored\n", name, kept.ID, dropped.ID, nOrders, nEvents)
	if nOrders != 1 || nEvents != 1 {
		return fmt.Errorf("want 1 order and 1 event stored, found %d and %d", nOrders, nEvents)
	}

	broker := gochannel.NewGoChannel(gochannel.Config{BlockPublishUntilSubscriberAck: true}, watermill.NopLogger{})
	defer broker.Close()
	delivered, err := broker.Subscribe(ctx, Topic)
	if err != nil {
		return err
	}
	relay, err := processors.NewOutboxRelay(pool, processors.OutboxRelayConfig{
		Publisher:  broker,
		Subscriber: postgres.SubscriberConfig{Table: outboxTable},
	}, example.Logger())
	if err != nil {
		return err
	}
	running := example.Start(ctx, relay)
	defer running.Stop()
	select {
	case msg := <-delivered:
		fmt.Printf("%s: received %s %s %s\n", name, bus.PartitionKey(msg), bus.EventType(msg), msg.Payload)
		msg.Ack()
	case <-ctx.Done():
		return fmt.Errorf("the committed event was not delivered: %w", ctx.Err())
	}
	return running.Stop()
}

// SQLWrite is the Write of plain database/sql, whichever driver db uses:
// the business row and the event in one *sql.Tx.
func SQLWrite(db *sql.DB) Write {
	return func(ctx context.Context, outbox *postgres.Outbox, orders string, o Order, event *message.Message, rollback bool) error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback() }() // a no-op after Commit
		if _, err := tx.ExecContext(ctx, `INSERT INTO `+orders+` (id, amount) VALUES ($1, $2)`, o.ID, o.Amount); err != nil {
			return err
		}
		// The *sql.Tx is all EnqueueSQL needs; its arrays go as text, so
		// every driver takes them.
		if err := outbox.EnqueueSQL(ctx, tx, Topic, event); err != nil {
			return err
		}
		if rollback {
			return tx.Rollback()
		}
		return tx.Commit()
	}
}
