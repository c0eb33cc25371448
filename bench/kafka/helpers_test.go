package kafkabench

import (
	"context"
	"crypto/rand"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	wmkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/internal/testenv"
	"github.com/omnibus-go/omnibus/transports/kafka"
)

const (
	// goroutines publish concurrently in the publish scenario.
	goroutines = 64
	// payloadBytes is the size of every payload.
	payloadBytes = 256
	// partitions of every topic.
	partitions = 8
	// keys is the number of distinct partition keys messages are spread over.
	keys = 1000
)

func payload() []byte {
	p := make([]byte, payloadBytes)
	_, _ = rand.Read(p)
	return p
}

// keyedMessage returns message i, keyed by one of keys keys.
func keyedMessage(i int, body []byte) *message.Message {
	msg := message.NewMessage(watermill.NewUUID(), body)
	bus.SetPartitionKey(msg, fmt.Sprintf("key-%d", i%keys))
	return msg
}

// watermillMarshaler keys watermill-kafka's records by the same partition
// key, so both sides spread records over partitions the same way.
func watermillMarshaler() wmkafka.MarshalerUnmarshaler {
	return wmkafka.NewWithPartitioningMarshaler(func(_ string, msg *message.Message) (string, error) {
		return bus.PartitionKey(msg), nil
	})
}

func newOurPublisher(b *testing.B, brokers []string) *kafka.Publisher {
	b.Helper()
	p, err := kafka.NewPublisher(kafka.PublisherConfig{ConnectionConfig: kafka.ConnectionConfig{Brokers: brokers}}, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = p.Close() })
	return p
}

func newTheirPublisher(b *testing.B, brokers []string) *wmkafka.Publisher {
	b.Helper()
	p, err := wmkafka.NewPublisher(wmkafka.PublisherConfig{
		Brokers:               brokers,
		Marshaler:             watermillMarshaler(),
		OverwriteSaramaConfig: wmkafka.DefaultSaramaSyncPublisherConfig(),
	}, watermill.NopLogger{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = p.Close() })
	return p
}

// franzPublisher publishes with a franz-go client in its defaults
// (idempotent, acks from all in-sync replicas, up to 5 produce requests in
// flight per broker), the record keyed by the partition key. It is the
// reference for what one client can get from the broker, not a transport.
type franzPublisher struct{ client *kgo.Client }

func newFranzPublisher(b *testing.B, brokers []string) franzPublisher {
	b.Helper()
	client, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(client.Close)
	return franzPublisher{client: client}
}

func (p franzPublisher) Publish(topic string, msgs ...*message.Message) error {
	records := make([]*kgo.Record, len(msgs))
	for i, msg := range msgs {
		records[i] = &kgo.Record{
			Topic:   topic,
			Key:     []byte(bus.PartitionKey(msg)),
			Value:   msg.Payload,
			Headers: []kgo.RecordHeader{{Key: "uuid", Value: []byte(msg.UUID)}},
		}
	}
	return p.client.ProduceSync(context.Background(), records...).FirstErr()
}

func (p franzPublisher) Close() error { return nil } // the client closes in Cleanup

// publishConcurrently publishes n messages from goroutines goroutines,
// perCall messages per Publish call (n must be a multiple of it).
func publishConcurrently(b *testing.B, pub message.Publisher, topic string, n, perCall int, body []byte) time.Duration {
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range goroutines {
		wg.Go(func() {
			batch := make([]*message.Message, perCall)
			for {
				first := int(next.Add(int64(perCall))) - perCall
				if first >= n {
					return
				}
				for j := range batch {
					batch[j] = keyedMessage(first+j, body)
				}
				if err := pub.Publish(topic, batch...); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	return time.Since(start)
}

// recordsIn counts the records of topic.
func recordsIn(b *testing.B, brokers []string, topic string) int64 {
	b.Helper()
	client, err := sarama.NewClient(brokers, sarama.NewConfig())
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = client.Close() }()
	var n int64
	for p := int32(0); p < partitions; p++ {
		off, err := client.GetOffset(topic, p, sarama.OffsetNewest)
		if err != nil {
			b.Fatal(err)
		}
		n += off
	}
	return n
}

// fillTopic creates a topic and writes n keyed messages to it.
func fillTopic(b *testing.B, brokers []string, n int) string {
	b.Helper()
	topic := testenv.KafkaTopic(b, brokers, partitions)
	pub := newOurPublisher(b, brokers)
	body := payload()
	batch := make([]*message.Message, 0, 500)
	for i := range n {
		batch = append(batch, keyedMessage(i, body))
		if len(batch) == cap(batch) || i == n-1 {
			if err := pub.Publish(topic, batch...); err != nil {
				b.Fatal(err)
			}
			batch = batch[:0]
		}
	}
	return topic
}

// consume subscribes with sub, hands each message to handle and returns
// the time from the first message to the n-th distinct ack.
func consume(b *testing.B, sub message.Subscriber, topic string, n int, handle func(*message.Message, func())) time.Duration {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	msgs, err := sub.Subscribe(ctx, topic)
	if err != nil {
		b.Fatal(err)
	}
	var (
		mu    sync.Mutex
		acked = make(map[string]struct{}, n)
		done  = make(chan struct{})
		start time.Time
	)
	ack := func(m *message.Message) func() {
		return func() {
			m.Ack()
			mu.Lock()
			defer mu.Unlock()
			if _, dup := acked[m.UUID]; dup {
				return
			}
			acked[m.UUID] = struct{}{}
			if len(acked) == n {
				close(done)
			}
		}
	}
	go func() {
		for m := range msgs {
			if start.IsZero() {
				mu.Lock()
				start = time.Now()
				mu.Unlock()
			}
			handle(m, ack(m))
		}
	}()
	select {
	case <-done:
	case <-ctx.Done():
		b.Fatalf("consumed %d of %d messages before the deadline", len(acked), n)
	}
	mu.Lock()
	defer mu.Unlock()
	return time.Since(start)
}

func newOurSubscriber(b *testing.B, brokers []string, maxInFlight int) *kafka.Subscriber {
	b.Helper()
	s, err := kafka.NewSubscriber(kafka.SubscriberConfig{
		ConnectionConfig: kafka.ConnectionConfig{Brokers: brokers},
		ConsumerGroup:    "g_" + testenv.Name(b),
		MaxInFlight:      maxInFlight,
	}, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = s.Close() })
	return s
}

func newTheirSubscriber(b *testing.B, brokers []string) *wmkafka.Subscriber {
	b.Helper()
	sc := wmkafka.DefaultSaramaSubscriberConfig()
	sc.Consumer.Offsets.Initial = sarama.OffsetOldest // read the filled topic
	s, err := wmkafka.NewSubscriber(wmkafka.SubscriberConfig{
		Brokers:               brokers,
		Unmarshaler:           watermillMarshaler(),
		OverwriteSaramaConfig: sc,
		ConsumerGroup:         "g_" + testenv.Name(b),
	}, watermill.NopLogger{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = s.Close() })
	return s
}
