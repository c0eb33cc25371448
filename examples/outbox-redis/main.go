// Command outbox-redis shows the transactional outbox relayed to Redis
// Streams: a service writes an order and its events in one PostgreSQL
// transaction, an outbox relay publishes the events to a Redis stream in
// order per order id, and a consumer group reads the stream and prints what
// arrived.
//
//	go run ./examples/outbox-redis [-keep]
//
// PostgreSQL comes from OMNIBUS_POSTGRES_URL (default
// postgres://postgres@127.0.0.1:5432/postgres), Redis from OMNIBUS_REDIS_ADDR
// (default 127.0.0.1:6379). `make services` starts both. It drops its
// tables and deletes its stream when done, unless -keep.
package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/examples/internal/example"
	"github.com/omnibus-go/omnibus/processors"
	"github.com/omnibus-go/omnibus/transports/postgres"
	"github.com/omnibus-go/omnibus/transports/redis"
)

const (
	outboxTable  = "omnibus_example_redis_outbox"
	streamPrefix = "omnibus:example:"
	topic        = "orders"
	group        = "order-printer"
)

func main() { example.Main("outbox-redis", 60*time.Second, run) }

func run(ctx context.Context) error {
	logger := example.Logger()
	pool, err := example.Postgres(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	client, err := example.Redis(ctx)
	if err != nil {
		return err
	}
	defer client.Close() // ours: the transport never closes a client it is given

	// A clean slate each run, so the output is the same every time, and
	// nothing left behind when done (unless -keep).
	stream := streamPrefix + topic
	done, err := example.Tidy(ctx, "the example's tables "+outboxTable+" and example_redis_orders and stream "+stream,
		func(ctx context.Context) error {
			return errors.Join(example.DropTables(ctx, pool, []string{outboxTable}, "example_redis_orders"),
				example.DropStreams(ctx, client, stream))
		})
	if err != nil {
		return err
	}
	defer done()
	if err := postgres.Migrate(ctx, pool, postgres.OutboxTable(outboxTable)); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE example_redis_orders (id text PRIMARY KEY, status text NOT NULL)`); err != nil {
		return err
	}
	outbox, err := postgres.NewOutbox(postgres.OutboxConfig{Table: outboxTable})
	if err != nil {
		return err
	}

	// The service: each business change and its event commit together.
	orders := []string{"order-1", "order-2", "order-3"}
	steps := []string{"created", "paid", "shipped"}
	total, err := example.WriteOrders(ctx, pool, outbox, "example_redis_orders", topic, orders, steps)
	if err != nil {
		return err
	}
	fmt.Printf("wrote %d orders and %d events in %d transactions\n", len(orders), total, total)

	// The relay: outbox rows → XADD to the stream "omnibus:example:orders".
	pub, err := redis.NewPublisher(redis.PublisherConfig{Client: client, StreamPrefix: streamPrefix}, logger)
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

	// The consumer: a consumer group on the stream, one order's events at a
	// time (OrderByKey), acked after printing.
	sub, err := redis.NewSubscriber(redis.SubscriberConfig{
		Client:        client,
		StreamPrefix:  streamPrefix,
		ConsumerGroup: group,
		OrderByKey:    true,
		BlockTime:     200 * time.Millisecond,
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
	for i := range total {
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
	length, err := client.XLen(ctx, stream).Result()
	if err != nil {
		return err
	}
	fmt.Printf("all %d events delivered through stream %q (%d entries) in order per order id; %d outbox rows left pending\n",
		total, stream, length, pending)
	return nil
}
