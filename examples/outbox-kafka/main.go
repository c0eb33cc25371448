// Command outbox-kafka shows the transactional outbox relayed to Kafka: a
// service writes an order and its event in one PostgreSQL transaction, an
// outbox relay publishes the events to a Kafka topic keyed by order id (so
// each order's events share a partition, in order), and a consumer group
// reads the topic and prints what arrived.
//
//	go run ./examples/outbox-kafka [-keep]
//
// Kafka comes from OMNIBUS_KAFKA_BROKERS (comma-separated host:port); when
// it is not set, the program starts an in-process Kafka (kfake) and says so.
// PostgreSQL comes from OMNIBUS_POSTGRES_URL (default
// postgres://postgres@127.0.0.1:5432/postgres); `make services` starts it.
// It drops its tables and deletes its topic and consumer group when done,
// unless -keep.
package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/examples/internal/example"
	"github.com/omnibus-go/omnibus/processors"
	"github.com/omnibus-go/omnibus/transports/kafka"
	"github.com/omnibus-go/omnibus/transports/postgres"
)

const (
	outboxTable = "omnibus_example_kafka_outbox"
	ordersTable = "example_kafka_orders"
	topic       = "omnibus.example.orders"
	group       = "omnibus-example-order-printer"
	partitions  = 3
)

func main() { example.Main("outbox-kafka", 60*time.Second, run) }

func run(ctx context.Context) error {
	logger := example.Logger()
	pool, err := example.Postgres(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	brokers, stopKafka, err := example.Kafka()
	if err != nil {
		return err
	}
	defer stopKafka()

	// A clean slate each run, so the output is the same every time, and
	// nothing left behind when done (unless -keep).
	done, err := example.Tidy(ctx, "the example's tables "+outboxTable+" and "+ordersTable+", topic "+topic+" and consumer group "+group,
		func(ctx context.Context) error {
			return errors.Join(example.DropTables(ctx, pool, []string{outboxTable}, ordersTable),
				example.DropKafkaTopic(brokers, topic, group))
		})
	if err != nil {
		return err
	}
	defer done()
	if err := example.CreateKafkaTopic(ctx, brokers, topic, partitions); err != nil {
		return err
	}
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

	// The service: each business change and its event commit together.
	orders := []string{"order-1", "order-2", "order-3"}
	steps := []string{"created", "paid", "shipped"}
	for _, step := range steps {
		for _, id := range orders {
			if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, `INSERT INTO `+ordersTable+` (id, status) VALUES ($1, $2)
					ON CONFLICT (id) DO UPDATE SET status = EXCLUDED.status`, id, step); err != nil {
					return err
				}
				msg := message.NewMessage(watermill.NewUUID(), fmt.Appendf(nil, `{"order":%q,"status":%q}`, id, step))
				bus.SetPartitionKey(msg, id) // the Kafka record key: one partition per order
				bus.SetEventType(msg, "order."+step)
				return outbox.Enqueue(ctx, tx, topic, msg)
			}); err != nil {
				return fmt.Errorf("write %s %s: %w", id, step, err)
			}
		}
	}
	total := len(orders) * len(steps)
	fmt.Printf("wrote %d orders and %d events in %d transactions\n", len(orders), total, total)

	// The relay: outbox rows → Kafka topic, keyed by order id. While Kafka is
	// unreachable, publishing fails with transient errors and no row spends
	// an attempt.
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{ConnectionConfig: kafka.ConnectionConfig{Brokers: brokers}}, logger)
	if err != nil {
		return err
	}
	defer pub.Close()
	relay, err := processors.NewOutboxRelay(pool, processors.OutboxRelayConfig{
		Publisher:  pub,
		Subscriber: postgres.SubscriberConfig{Table: outboxTable},
	}, logger)
	if err != nil {
		return err
	}
	running := example.Start(ctx, relay)
	defer running.Stop()

	// The consumer: a consumer group on the topic. Different orders are
	// handled concurrently, the events of one order one after another.
	sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{
		ConnectionConfig: kafka.ConnectionConfig{Brokers: brokers},
		ConsumerGroup:    group,
	}, logger)
	if err != nil {
		return err
	}
	defer sub.Close()
	delivered, err := sub.Subscribe(ctx, topic)
	if err != nil {
		return err
	}

	last := map[string]string{}
	next := map[string]string{"": "created", "created": "paid", "paid": "shipped"}
	for i := 0; i < total; {
		select {
		case msg := <-delivered:
			key, typ := bus.PartitionKey(msg), bus.EventType(msg)
			step := strings.TrimPrefix(typ, "order.")
			d, _ := bus.DeliveryOf(msg)
			if step == last[key] {
				msg.Ack() // a redelivery (Kafka is at-least-once): already printed
				continue
			}
			if next[last[key]] != step {
				return fmt.Errorf("%s: got %s after %q: out of order", key, step, last[key])
			}
			last[key] = step
			fmt.Printf("delivered %-8s %-14s partition %d offset %d  %s\n", key, typ, d.Partition, d.Offset, msg.Payload)
			msg.Ack()
			i++
		case <-ctx.Done():
			return fmt.Errorf("only %d of %d events delivered: %w", i, total, ctx.Err())
		}
	}
	if err := running.Stop(); err != nil {
		return err
	}
	if err := sub.Close(); err != nil {
		return err
	}
	var pending int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+outboxTable+` WHERE status <> 'completed'`).Scan(&pending); err != nil {
		return err
	}
	fmt.Printf("all %d events delivered through Kafka topic %q in order per order id; %d outbox rows left pending\n",
		total, topic, pending)
	return nil
}
