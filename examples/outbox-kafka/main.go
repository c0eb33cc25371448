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
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/examples/internal/tidy"
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

func main() {
	flag.Parse()
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "outbox-kafka:", err)
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

	brokers, stopKafka, err := kafkaBrokers()
	if err != nil {
		return err
	}
	defer stopKafka()

	// A clean slate each run, so the output is the same every time, and
	// nothing left behind when done (unless -keep).
	if err := tidy.DropTables(ctx, pool, []string{outboxTable}, ordersTable); err != nil {
		return err
	}
	if err := resetTopic(ctx, brokers); err != nil {
		return err
	}
	defer func() {
		if *tidy.Keep {
			fmt.Printf("kept the example's tables %s and %s, topic %s and consumer group %s (-keep)\n", outboxTable, ordersTable, topic, group)
			return
		}
		err := errors.Join(tidy.DropTables(context.Background(), pool, []string{outboxTable}, ordersTable), deleteTopic(brokers))
		if err != nil {
			fmt.Fprintln(os.Stderr, "outbox-kafka:", err)
		}
	}()
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
	relayCtx, stopRelay := context.WithCancel(ctx)
	defer stopRelay()
	relayDone := make(chan error, 1)
	go func() { relayDone <- relay.Run(relayCtx) }()

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
	fmt.Printf("all %d events delivered through Kafka topic %q in order per order id; %d outbox rows left pending\n",
		total, topic, pending)
	return nil
}

// kafkaBrokers returns the brokers of OMNIBUS_KAFKA_BROKERS, or starts an
// in-process kfake cluster and returns its address.
func kafkaBrokers() (brokers []string, stop func(), err error) {
	if env := os.Getenv("OMNIBUS_KAFKA_BROKERS"); env != "" {
		for b := range strings.SplitSeq(env, ",") {
			if b = strings.TrimSpace(b); b != "" {
				brokers = append(brokers, b)
			}
		}
		fmt.Printf("using Kafka at %s\n", strings.Join(brokers, ","))
		return brokers, func() {}, nil
	}
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.AllowAutoTopicCreation())
	if err != nil {
		return nil, nil, fmt.Errorf("start in-process Kafka: %w", err)
	}
	brokers = cluster.ListenAddrs()
	fmt.Printf("OMNIBUS_KAFKA_BROKERS is not set: started an in-process Kafka (kfake) at %s\n", strings.Join(brokers, ","))
	return brokers, cluster.Close, nil
}

// deleteTopic deletes the example's consumer group and topic.
func deleteTopic(brokers []string) error {
	admin, err := sarama.NewClusterAdmin(brokers, sarama.NewConfig())
	if err != nil {
		return fmt.Errorf("Kafka at %v: %w", brokers, err)
	}
	defer admin.Close()
	if err := admin.DeleteConsumerGroup(group); err != nil && !errors.Is(err, sarama.ErrGroupIDNotFound) {
		return fmt.Errorf("delete consumer group %q: %w", group, err)
	}
	if err := admin.DeleteTopic(topic); err != nil && !errors.Is(err, sarama.ErrUnknownTopicOrPartition) {
		return fmt.Errorf("delete topic %q: %w", topic, err)
	}
	return nil
}

// resetTopic deletes the example's topic and consumer group if they exist
// and creates the topic afresh.
func resetTopic(ctx context.Context, brokers []string) error {
	admin, err := sarama.NewClusterAdmin(brokers, sarama.NewConfig())
	if err != nil {
		return fmt.Errorf("Kafka at %v: %w", brokers, err)
	}
	defer admin.Close()
	if err := admin.DeleteConsumerGroup(group); err != nil && !errors.Is(err, sarama.ErrGroupIDNotFound) {
		return fmt.Errorf("reset consumer group %q: %w", group, err)
	}
	if err := admin.DeleteTopic(topic); err != nil && !errors.Is(err, sarama.ErrUnknownTopicOrPartition) {
		return fmt.Errorf("reset topic %q: %w", topic, err)
	}
	// A real broker deletes a topic asynchronously: retry the creation until
	// the old one is gone.
	for {
		err := admin.CreateTopic(topic, &sarama.TopicDetail{NumPartitions: partitions, ReplicationFactor: 1}, false)
		if err == nil {
			return nil
		}
		if !errors.Is(err, sarama.ErrTopicAlreadyExists) {
			return fmt.Errorf("create topic %q: %w", topic, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("create topic %q: the previous one is still being deleted: %w", topic, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}
