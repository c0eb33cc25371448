// Command broker-swap is one program whose broker is chosen by configuration:
// the same code publishes and receives order events through the in-memory
// broker, PostgreSQL, Kafka or Redis Streams, depending on OMNIBUS_BROKER.
//
//	go run ./examples/broker-swap                        # memory
//	OMNIBUS_BROKER=postgres go run ./examples/broker-swap
//	OMNIBUS_BROKER=redis go run ./examples/broker-swap
//	OMNIBUS_BROKER=kafka go run ./examples/broker-swap   # in-process Kafka unless OMNIBUS_KAFKA_BROKERS is set
//
// Every key of the configuration can be set the same way (OMNIBUS_REDIS_ADDR,
// OMNIBUS_POSTGRES_URL, …) or in a YAML file named by OMNIBUS_CONFIG; see
// docs/configuration.md. When done it deletes what its topic left on Redis
// or in the postgres broker's queue table, unless -keep.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/examples/internal/tidy"
	_ "github.com/omnibus-go/omnibus/transports/all" // every broker, so the config can pick any
	"github.com/omnibus-go/omnibus/transports/kafka"
)

func main() {
	flag.Parse()
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "broker-swap:", err)
		os.Exit(1)
	}
}

func run() error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// The configuration: a file (OMNIBUS_CONFIG, optional) and the OMNIBUS_*
	// environment. Nothing below depends on which broker it names.
	cfg, err := loadConfig()
	if err != nil {
		return err
	}
	b, err := bus.OpenBroker(ctx, cfg)
	if err != nil {
		return err
	}
	defer b.Close()
	fmt.Printf("broker: %s\n", b.BrokerName())

	// A topic of its own each run, so brokers that keep messages (Redis,
	// Kafka, PostgreSQL) start empty.
	topic := "broker_swap_orders_" + randomHex(4)
	defer func() { // after the subscriber is closed (deferred below), before the broker
		if *tidy.Keep {
			fmt.Printf("kept topic %s on the %s broker (-keep)\n", topic, b.BrokerName())
			return
		}
		if err := tidy.BrokerTopic(context.Background(), cfg, topic); err != nil {
			fmt.Fprintln(os.Stderr, "broker-swap:", err)
		}
	}()
	// The service receives as its consumer group, inbox.consumer_group
	// (OMNIBUS_INBOX_CONSUMER_GROUP, default "omnibus"); the postgres broker
	// stores a row for each group in postgres.queue_groups, which defaults
	// to that group.
	sub, err := b.Subscriber(b.Config().Inbox.ConsumerGroup)
	if err != nil {
		return err
	}
	defer sub.Close()
	received, err := sub.Subscribe(ctx, topic)
	if err != nil {
		return err
	}

	orders := []string{"order-1", "order-2", "order-3"}
	steps := []string{"created", "paid", "shipped"}
	for _, step := range steps {
		for _, id := range orders {
			msg := message.NewMessage(watermill.NewUUID(), fmt.Appendf(nil, `{"order":%q,"step":%q}`, id, step))
			bus.SetPartitionKey(msg, id) // events of one order stay in order
			bus.SetEventType(msg, "order."+step)
			if err := b.Publisher().Publish(topic, msg); err != nil {
				return fmt.Errorf("publish %s %s: %w", id, step, err)
			}
		}
	}

	seen := map[string][]string{}
	for n := 0; n < len(orders)*len(steps); n++ {
		select {
		case msg := <-received:
			key := bus.PartitionKey(msg)
			seen[key] = append(seen[key], strings.TrimPrefix(bus.EventType(msg), "order."))
			msg.Ack()
		case <-ctx.Done():
			return fmt.Errorf("received %d of %d messages: %w", n, len(orders)*len(steps), ctx.Err())
		}
	}
	for _, id := range orders {
		fmt.Printf("%s: %s\n", id, strings.Join(seen[id], ", "))
		if !slices.Equal(seen[id], steps) {
			return fmt.Errorf("%s: received out of order", id)
		}
	}
	fmt.Printf("%d messages published and received through %s, in order per key\n", len(orders)*len(steps), b.BrokerName())
	return nil
}

// loadConfig is bus.LoadConfig, except that broker kafka without brokers
// gets an in-process Kafka cluster, so the example runs anywhere.
func loadConfig() (bus.Config, error) {
	var cfg bus.Config
	if path := os.Getenv("OMNIBUS_CONFIG"); path != "" {
		data, err := os.ReadFile(path)
		if err != nil {
			return cfg, err
		}
		if cfg, err = bus.ParseConfig(data); err != nil {
			return cfg, err
		}
	}
	if err := cfg.ApplyEnv(os.LookupEnv); err != nil {
		return cfg, err
	}
	if k := kafka.Section(cfg); cfg.Broker == bus.BrokerKafka && len(k.Brokers) == 0 {
		cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.AllowAutoTopicCreation(), kfake.DefaultNumPartitions(3))
		if err != nil {
			return cfg, err
		}
		// The cluster lives as long as the program.
		k.Brokers = cluster.ListenAddrs()
		kafka.SetSection(&cfg, k)
		fmt.Printf("OMNIBUS_KAFKA_BROKERS is not set: started an in-process Kafka (kfake)\n")
	}
	return cfg, cfg.Validate()
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
