// Command outbox-rabbitmq shows the transactional outbox relayed to
// RabbitMQ with per-key order kept with two consumers: orders and their
// events are written in PostgreSQL transactions, an outbox relay publishes
// the events (with publisher confirms) to a topic of 4 shard queues, and two
// subscribers of one consumer group consume them. Each shard queue has one
// active consumer at a time (single-active-consumer); the other stands by
// and would take over if the active one went.
//
//	go run ./examples/outbox-rabbitmq [-keep]
//
// PostgreSQL comes from OMNIBUS_POSTGRES_URL, RabbitMQ from
// OMNIBUS_RABBITMQ_URL (default amqp://guest:guest@127.0.0.1:5672/); `make
// services` starts both. It drops its tables and deletes its exchange and
// queues when done, unless -keep.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/examples/internal/example"
	"github.com/omnibus-go/omnibus/transports/postgres"
	"github.com/omnibus-go/omnibus/transports/rabbitmq"
)

const (
	outboxTable = "omnibus_example_rabbitmq_outbox"
	prefix      = "omnibus.example."
	topic       = "orders"
	group       = "order-printer"
	shards      = 4
)

func main() { example.Main("outbox-rabbitmq", 60*time.Second, run) }

func run(ctx context.Context) error {
	logger := example.Logger()
	pool, err := example.Postgres(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	url := os.Getenv("OMNIBUS_RABBITMQ_URL")
	if url == "" {
		url = rabbitmq.DefaultURL
	}
	conn := rabbitmq.ConnectionConfig{URL: url, ExchangePrefix: prefix, Shards: shards}

	done, err := example.Tidy(ctx, "the example's tables "+outboxTable+" and example_rabbitmq_orders and exchange "+prefix+topic,
		func(ctx context.Context) error {
			err := rabbitmq.DeleteTopic(ctx, url, prefix, topic, shards, group)
			return errors.Join(example.DropTables(ctx, pool, []string{outboxTable}, "example_rabbitmq_orders"), err)
		})
	if err != nil {
		return err
	}
	defer done()
	if err := postgres.Migrate(ctx, pool, postgres.OutboxTable(outboxTable)); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE example_rabbitmq_orders (id text PRIMARY KEY, status text NOT NULL)`); err != nil {
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
	total, err := example.WriteOrders(ctx, pool, outbox, "example_rabbitmq_orders", topic, orders, steps)
	if err != nil {
		return err
	}
	fmt.Printf("wrote %d orders and %d events\n", len(orders), total)

	// Two consumers of the group: one active per shard, the other standing by.
	arrived := make(chan example.Arrival, total)
	var subs []*rabbitmq.Subscriber
	for c := range 2 {
		sub, err := rabbitmq.NewSubscriber(rabbitmq.SubscriberConfig{ConnectionConfig: conn, ConsumerGroup: group, Consumer: fmt.Sprintf("printer-%d", c+1)}, logger)
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

	// The relay: outbox rows → the topic's exchange, routed to the shard
	// queue of each order id, confirmed by RabbitMQ.
	pub, err := rabbitmq.NewPublisher(rabbitmq.PublisherConfig{ConnectionConfig: conn, Groups: []string{group}}, logger)
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
	fmt.Printf("all %d events delivered through %d shard queues in order per order id\n", total, shards)
	for _, s := range subs {
		fmt.Printf("  %s handled %d\n", s.Consumer(), perConsumer[s.Consumer()])
	}
	return nil
}
