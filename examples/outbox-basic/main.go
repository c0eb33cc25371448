// Command outbox-basic shows the transactional outbox end to end: a service
// writes an order and its events in one PostgreSQL transaction, an outbox
// relay delivers the events in order per order id to a broker (here
// Watermill's in-memory Pub/Sub), and the program prints what arrived.
//
//	go run ./examples/outbox-basic [-keep]
//
// PostgreSQL comes from OMNIBUS_POSTGRES_URL (default
// postgres://postgres@127.0.0.1:5432/postgres). It drops its tables when
// done, unless -keep.
package main

import (
	"context"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/jackc/pgx/v5"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/examples/internal/example"
	"github.com/omnibus-go/omnibus/processors"
	"github.com/omnibus-go/omnibus/transports/postgres"
)

const (
	outboxTable = "omnibus_example_outbox"
	topic       = "orders"
)

func main() { example.Main("outbox-basic", 60*time.Second, run) }

func run(ctx context.Context) error {
	pool, err := example.Postgres(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()

	// A clean slate each run, so the output is the same every time, and
	// nothing left behind when done (unless -keep).
	done, err := example.Tidy(ctx, "the example's tables "+outboxTable+" and example_orders", func(ctx context.Context) error {
		return example.DropTables(ctx, pool, []string{outboxTable}, "example_orders")
	})
	if err != nil {
		return err
	}
	defer done()
	if err := postgres.Migrate(ctx, pool, postgres.OutboxTable(outboxTable)); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE example_orders (id text PRIMARY KEY, status text NOT NULL)`); err != nil {
		return err
	}
	outbox, err := postgres.NewOutbox(postgres.OutboxConfig{Table: outboxTable})
	if err != nil {
		return err
	}

	// The service: each business change and its events commit together.
	orders := []string{"order-1", "order-2", "order-3"}
	for _, id := range orders {
		for _, step := range []string{"created", "paid", "shipped"} {
			if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, `INSERT INTO example_orders (id, status) VALUES ($1, $2)
					ON CONFLICT (id) DO UPDATE SET status = EXCLUDED.status`, id, step); err != nil {
					return err
				}
				msg := message.NewMessage(watermill.NewUUID(), []byte(fmt.Sprintf(`{"order":%q,"status":%q}`, id, step)))
				bus.SetPartitionKey(msg, id)
				bus.SetEventType(msg, "order."+step)
				return outbox.Enqueue(ctx, tx, topic, msg)
			}); err != nil {
				return fmt.Errorf("write %s %s: %w", id, step, err)
			}
		}
	}
	fmt.Printf("wrote %d orders and %d events in %d transactions\n", len(orders), 3*len(orders), 3*len(orders))

	// The broker: in-memory here; Kafka or Redis in production. GoChannel
	// hands each message to its subscribers on a goroutine of its own unless
	// Publish waits for the subscriber's ack, so without that setting two
	// events of one order could overtake each other inside the broker.
	broker := gochannel.NewGoChannel(gochannel.Config{BlockPublishUntilSubscriberAck: true}, watermill.NopLogger{})
	defer broker.Close()
	delivered, err := broker.Subscribe(ctx, topic)
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

	last := map[string]string{}
	next := map[string]string{"": "created", "created": "paid", "paid": "shipped"}
	for i := 0; i < 3*len(orders); i++ {
		select {
		case msg := <-delivered:
			key, typ := bus.PartitionKey(msg), bus.EventType(msg)
			step := typ[len("order."):]
			if next[last[key]] != step {
				return fmt.Errorf("%s: got %s after %q: out of order", key, step, last[key])
			}
			last[key] = step
			fmt.Printf("delivered %-8s %-14s %s\n", key, typ, msg.Payload)
			msg.Ack()
		case <-ctx.Done():
			return fmt.Errorf("only %d of %d events delivered: %w", i, 3*len(orders), ctx.Err())
		}
	}
	if err := running.Stop(); err != nil {
		return err
	}
	var pending int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+outboxTable+` WHERE status <> 'completed'`).Scan(&pending); err != nil {
		return err
	}
	fmt.Printf("all %d events delivered in order per order id; %d left pending\n", 3*len(orders), pending)
	return nil
}
