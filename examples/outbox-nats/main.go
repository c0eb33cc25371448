// Command outbox-nats shows the transactional outbox relayed to NATS
// JetStream with per-key order kept with two consumers: orders and their
// events are written in PostgreSQL transactions, an outbox relay publishes
// the events (each acknowledged by JetStream, deduplicated by message ID)
// to a topic of 4 shard subjects, and two subscribers of one consumer group
// share the shards, each shard read by the holder of its lease.
//
//	go run ./examples/outbox-nats [-keep]
//
// PostgreSQL comes from OMNIBUS_POSTGRES_URL, NATS from OMNIBUS_NATS_URL
// (default nats://127.0.0.1:4222, JetStream enabled); `make services`
// starts both. It drops its tables and deletes its streams and leases when
// done, unless -keep.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/examples/internal/example"
	"github.com/omnibus-go/omnibus/transports/nats"
	"github.com/omnibus-go/omnibus/transports/postgres"
)

const (
	outboxTable = "omnibus_example_nats_outbox"
	ordersTable = "example_nats_orders"
	prefix      = "omnibus_example."
	topic       = "orders"
	group       = "order-printer"
	shards      = 4
)

func main() { example.Main("outbox-nats", 60*time.Second, run) }

func run(ctx context.Context) error {
	logger := example.Logger()
	pool, err := example.Postgres(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	url := os.Getenv("OMNIBUS_NATS_URL")
	if url == "" {
		url = nats.DefaultURL
	}
	conn := nats.ConnectionConfig{URL: url, SubjectPrefix: prefix, Shards: shards}

	done, err := example.Tidy(ctx, "the example's tables "+outboxTable+" and "+ordersTable+" and stream of "+prefix+topic,
		func(ctx context.Context) error {
			err := nats.DeleteTopic(ctx, conn, topic, group)
			return errors.Join(example.DropTables(ctx, pool, []string{outboxTable}, ordersTable), err)
		})
	if err != nil {
		return err
	}
	defer done()
	if err := postgres.Migrate(ctx, pool, postgres.OutboxTable(outboxTable)); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE `+ordersTable+` (id text PRIMARY KEY, status text NOT NULL)`); err != nil {
		return err
	}
	outbox, err := postgres.NewOutbox(postgres.OutboxConfig{Table: outboxTable})
	if err != nil {
		return err
	}

	// The service: 8 orders, each created, paid and shipped, each step and
	// its event in one transaction.
	var orders []string
	for i := 1; i <= 8; i++ {
		orders = append(orders, fmt.Sprintf("order-%d", i))
	}
	steps := []string{"created", "paid", "shipped"}
	total, err := example.WriteOrders(ctx, pool, outbox, ordersTable, topic, orders, steps)
	if err != nil {
		return err
	}
	fmt.Printf("wrote %d orders and %d events\n", len(orders), total)

	// Two consumers of the group share the 4 shards.
	arrived := make(chan example.Arrival, total)
	var subs []*nats.Subscriber
	for c := range 2 {
		sub, err := nats.NewSubscriber(nats.SubscriberConfig{ConnectionConfig: conn, ConsumerGroup: group, Consumer: fmt.Sprintf("printer-%d", c+1)}, logger)
		if err != nil {
			return err
		}
		defer sub.Close()
		msgs, err := sub.Subscribe(ctx, topic)
		if err != nil {
			return err
		}
		subs = append(subs, sub)
		go func() {
			for msg := range msgs {
				arrived <- example.Arrival{Consumer: sub.Consumer(), Key: bus.PartitionKey(msg), Step: bus.EventType(msg)[len("order."):]}
				msg.Ack()
			}
		}()
	}

	// The relay: outbox rows → the shard subject of each order id, stored
	// and acknowledged by JetStream.
	pub, err := nats.NewPublisher(nats.PublisherConfig{ConnectionConfig: conn}, logger)
	if err != nil {
		return err
	}
	defer pub.Close()
	perConsumer, err := example.RelayInOrder(ctx, pool, pub, outboxTable, logger, arrived, total, steps)
	if err != nil {
		return err
	}
	for _, s := range subs {
		if err := s.Close(); err != nil {
			return err
		}
	}
	fmt.Printf("all %d events delivered through %d shard subjects in order per order id\n", total, shards)
	for _, s := range subs {
		fmt.Printf("  %s handled %d\n", s.Consumer(), perConsumer[s.Consumer()])
	}
	return nil
}
