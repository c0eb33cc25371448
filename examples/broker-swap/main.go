// Command broker-swap is one program whose broker is chosen by configuration:
// the same code publishes and receives order events through the in-memory
// broker, PostgreSQL, Kafka, Redis Streams, RabbitMQ or NATS JetStream,
// depending on
// OMNIBUS_BROKER.
//
//	go run ./examples/broker-swap                        # memory
//	OMNIBUS_BROKER=postgres go run ./examples/broker-swap
//	OMNIBUS_BROKER=redis go run ./examples/broker-swap
//	OMNIBUS_BROKER=kafka go run ./examples/broker-swap   # in-process Kafka unless OMNIBUS_KAFKA_BROKERS is set
//	OMNIBUS_BROKER=rabbitmq go run ./examples/broker-swap
//	OMNIBUS_BROKER=nats go run ./examples/broker-swap
//
// Every key of the configuration can be set the same way (OMNIBUS_REDIS_ADDR,
// OMNIBUS_POSTGRES_URL, …) or in a YAML file named by OMNIBUS_CONFIG; see
// docs/configuration.md. When done it deletes what its topic left on Redis,
// on RabbitMQ, on NATS or in the postgres broker's queue table, unless -keep.
package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/examples/internal/example"
	_ "github.com/omnibus-go/omnibus/transports/all" // every broker, so the config can pick any
)

func main() { example.Main("broker-swap", 60*time.Second, run) }

func run(ctx context.Context) error {
	// The configuration: a file (OMNIBUS_CONFIG, optional) and the OMNIBUS_*
	// environment. Nothing below depends on which broker it names.
	cfg, err := example.Config(nil)
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
	// Kafka, PostgreSQL) start empty. It is deleted after the subscriber is
	// closed (deferred below), before the broker.
	topic := example.Unique("broker_swap_orders_")
	done := example.TidyWhenDone("topic "+topic+" on the "+b.BrokerName()+" broker", func(ctx context.Context) error {
		return example.BrokerTopic(ctx, cfg, topic)
	})
	defer done()
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
