package redisbench

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/omnibus-go/omnibus/bench/internal/rounds"
	omniredis "github.com/omnibus-go/omnibus/transports/redis"
)

// BenchmarkConsume reads messagesPerOp messages of payloadBytes, published
// beforehand, through a new consumer group of one subscriber, acking each
// in a goroutine of its own as Watermill's router does; with each subscriber
// in turn, default settings, and the floor: one loop of raw XREADGROUP COUNT
// rawReadCount and one XACK per batch. Each metric is the median of rounds.N
// rounds per iteration.
func BenchmarkConsume(b *testing.B) {
	admin := newClient(b)
	body := payload()
	ourSeeder, err := omniredis.NewPublisher(omniredis.PublisherConfig{Client: admin}, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer ourSeeder.Close()
	// Each subscriber reads entries in its own format: watermill-redisstream's
	// are seeded in pipelines of XADDs with its marshaller (its Publisher
	// would add them one round trip at a time; seeding is not timed anyway).
	theirSeeder := pipelinePublisher{admin: admin, marshal: redisstream.DefaultMarshallerUnmarshaller{}}

	var m rounds.Medians
	b.ResetTimer()
	for i := range b.N * rounds.N {
		runs := []struct {
			name    string
			seeder  message.Publisher
			consume func(stream string) time.Duration
		}{
			{"omnibus", ourSeeder, func(stream string) time.Duration {
				s, err := omniredis.NewSubscriber(omniredis.SubscriberConfig{Client: newClient(b), ConsumerGroup: "bench"}, nil)
				if err != nil {
					b.Fatal(err)
				}
				return consumeAndClose(b, "omnibus", s, stream)
			}},
			{"watermill", theirSeeder, func(stream string) time.Duration {
				s, err := redisstream.NewSubscriber(redisstream.SubscriberConfig{
					Client: newClient(b), ConsumerGroup: "bench", Consumer: "bench",
				}, watermill.NopLogger{})
				if err != nil {
					b.Fatal(err)
				}
				return consumeAndClose(b, "watermill", s, stream)
			}},
			{"raw", ourSeeder, func(stream string) time.Duration {
				return consumeRaw(b, admin, stream)
			}},
		}
		rate := map[string]float64{}
		for j := range runs {
			r := runs[(i+j)%len(runs)] // rotate which goes first
			b.StopTimer()
			stream := streamName(b, admin, "consume-"+r.name)
			seed(b, r.seeder, stream, body)
			b.StartTimer()
			rate[r.name] = messagesPerOp / r.consume(stream).Seconds()
		}
		addRound(&m, rate)
	}
	b.StopTimer()
	m.Report(b)
}

// consumeAndClose consumes the stream with sub and closes sub, untimed.
func consumeAndClose(b *testing.B, name string, sub message.Subscriber, stream string) time.Duration {
	elapsed := consume(b, name, sub, stream)
	b.StopTimer()
	if err := sub.Close(); err != nil {
		b.Error(err)
	}
	b.StartTimer()
	return elapsed
}

// consumeRaw is the floor: one loop of XREADGROUP COUNT rawReadCount through
// a new consumer group, and one XACK of each batch's IDs, no framework
// around it (no decoding, no handler, no redelivery).
func consumeRaw(b *testing.B, c *redis.Client, stream string) time.Duration {
	ctx := context.Background()
	start := time.Now()
	if err := c.XGroupCreateMkStream(ctx, stream, "bench", "0").Err(); err != nil {
		b.Fatal(err)
	}
	for read := 0; read < messagesPerOp; {
		res, err := c.XReadGroup(ctx, &redis.XReadGroupArgs{
			Group: "bench", Consumer: "raw", Streams: []string{stream, ">"}, Count: rawReadCount, Block: time.Second,
		}).Result()
		if err != nil {
			b.Fatalf("raw: read %d of %d: %v", read, messagesPerOp, err)
		}
		ids := make([]string, 0, rawReadCount)
		for _, s := range res {
			for _, m := range s.Messages {
				ids = append(ids, m.ID)
			}
		}
		if err := c.XAck(ctx, stream, "bench", ids...).Err(); err != nil {
			b.Fatal(err)
		}
		read += len(ids)
	}
	return time.Since(start)
}

func seed(b *testing.B, pub message.Publisher, stream string, body []byte) {
	const chunk = 1000
	for done := 0; done < messagesPerOp; done += chunk {
		msgs := make([]*message.Message, 0, chunk)
		for range min(chunk, messagesPerOp-done) {
			msgs = append(msgs, message.NewMessage(watermill.NewUUID(), body))
		}
		if err := pub.Publish(stream, msgs...); err != nil {
			b.Fatal(err)
		}
	}
}

func consume(b *testing.B, name string, sub message.Subscriber, topic string) time.Duration {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	start := time.Now()
	msgs, err := sub.Subscribe(ctx, topic)
	if err != nil {
		b.Fatal(err)
	}
	seen := make(map[string]struct{}, messagesPerOp)
	for len(seen) < messagesPerOp {
		select {
		case msg, ok := <-msgs:
			if !ok {
				b.Fatalf("%s: messages channel closed after %d of %d", name, len(seen), messagesPerOp)
			}
			seen[msg.UUID] = struct{}{}
			go msg.Ack()
		case <-ctx.Done():
			b.Fatalf("%s: consumed %d of %d messages before the deadline", name, len(seen), messagesPerOp)
		}
	}
	return time.Since(start)
}

// pipelinePublisher adds messages marshalled by watermill-redisstream's
// marshaller, one pipeline per Publish call.
type pipelinePublisher struct {
	admin   *redis.Client
	marshal redisstream.Marshaller
}

func (p pipelinePublisher) Publish(topic string, msgs ...*message.Message) error {
	pipe := p.admin.Pipeline()
	for _, msg := range msgs {
		values, err := p.marshal.Marshal(topic, msg)
		if err != nil {
			return err
		}
		pipe.XAdd(context.Background(), &redis.XAddArgs{Stream: topic, Values: values})
	}
	_, err := pipe.Exec(context.Background())
	return err
}

func (pipelinePublisher) Close() error { return nil }
