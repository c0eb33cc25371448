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
	"flag"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/examples/internal/tidy"
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

func main() {
	flag.Parse()
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "outbox-redis:", err)
		os.Exit(1)
	}
}

func run() error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))

	pgURL := os.Getenv("OMNIBUS_POSTGRES_URL")
	if pgURL == "" {
		pgURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
	}
	pool, err := pgxpool.New(ctx, pgURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := pool.Ping(ctx); err != nil {
		return fmt.Errorf("PostgreSQL at %s: %w (start it with `make services`)", pgURL, err)
	}

	redisAddr := os.Getenv("OMNIBUS_REDIS_ADDR")
	if redisAddr == "" {
		redisAddr = "127.0.0.1:6379"
	}
	client := goredis.NewClient(&goredis.Options{Addr: redisAddr})
	defer client.Close() // ours: the transport never closes a client it is given
	if err := client.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("Redis at %s: %w (start it with `make services`)", redisAddr, err)
	}

	// A clean slate each run, so the output is the same every time, and
	// nothing left behind when done (unless -keep).
	stream := streamPrefix + topic
	cleanUp := func(ctx context.Context) error {
		if err := tidy.DropTables(ctx, pool, []string{outboxTable}, "example_redis_orders"); err != nil {
			return err
		}
		if err := client.Del(ctx, stream, stream+redis.DefaultDeadLetterSuffix).Err(); err != nil {
			return fmt.Errorf("delete the example's stream: %w", err)
		}
		return nil
	}
	if err := cleanUp(ctx); err != nil {
		return err
	}
	defer func() {
		if *tidy.Keep {
			fmt.Printf("kept the example's tables %s and example_redis_orders and stream %s (-keep)\n", outboxTable, stream)
			return
		}
		if err := cleanUp(context.Background()); err != nil {
			fmt.Fprintln(os.Stderr, "outbox-redis:", err)
		}
	}()
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
	for _, step := range steps {
		for _, id := range orders {
			if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, `INSERT INTO example_redis_orders (id, status) VALUES ($1, $2)
					ON CONFLICT (id) DO UPDATE SET status = EXCLUDED.status`, id, step); err != nil {
					return err
				}
				msg := message.NewMessage(watermill.NewUUID(), fmt.Appendf(nil, `{"order":%q,"status":%q}`, id, step))
				bus.SetPartitionKey(msg, id)
				bus.SetEventType(msg, "order."+step)
				return outbox.Enqueue(ctx, tx, topic, msg)
			}); err != nil {
				return fmt.Errorf("write %s %s: %w", id, step, err)
			}
		}
	}
	total := len(orders) * len(steps)
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
	relayCtx, stopRelay := context.WithCancel(ctx)
	defer stopRelay()
	relayDone := make(chan error, 1)
	go func() { relayDone <- relay.Run(relayCtx) }()

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
	stopRelay()
	if err := <-relayDone; err != nil {
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
