// Package rabbitmqbench measures the rabbitmq transport against Watermill's
// own AMQP transport (watermill-amqp v3) and a raw amqp091-go floor, on the
// local RabbitMQ (issue 30, point 7).
package rabbitmqbench

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/omnibus-go/omnibus/bench/internal/brokerbench"
	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/internal/testenv"
	"github.com/omnibus-go/omnibus/transports/rabbitmq"
)

const (
	// publishPerOp and consumePerOp are the messages of one run.
	publishPerOp = 5000
	consumePerOp = 2000
	// rawBatch is how many messages the floor publishes before it waits for
	// their confirms.
	rawBatch = 100
)

func url(b *testing.B) string { return testenv.RabbitMQ(b) }

func prefix(b *testing.B) string {
	return fmt.Sprintf("omnibus.bench.%d.", time.Now().UnixNano())
}

func ours(b *testing.B, pfx string) rabbitmq.ConnectionConfig {
	return rabbitmq.ConnectionConfig{URL: url(b), ExchangePrefix: pfx, QueueExpires: 30 * time.Second}
}

func theirsConfig(b *testing.B) wamqp.Config {
	cfg := wamqp.NewDurableQueueConfig(url(b))
	cfg.Publish.ConfirmDelivery = true // like ours: Publish returns once the broker has it
	cfg.Publish.ChannelPoolSize = rabbitmq.DefaultChannels
	return cfg
}

// publishRaw is the floor: one confirm-mode channel of amqp091-go,
// rawBatch persistent mandatory publishes to our layout's exchange, then
// their confirms.
func publishRaw(b *testing.B, exchange string, n int) time.Duration {
	conn, err := amqp.Dial(url(b))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		b.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	start := time.Now()
	for done := 0; done < n; done += rawBatch {
		var dcs []*amqp.DeferredConfirmation
		for i := range min(rawBatch, n-done) {
			dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, exchange, "shard.0", true, false, amqp.Publishing{
				MessageId: watermill.NewUUID(), Body: brokerbench.Body, DeliveryMode: amqp.Persistent,
				Headers: amqp.Table{bus.KeyPartitionKey: fmt.Sprintf("key-%d", (done+i)%brokerbench.Keys)},
			})
			if err != nil {
				b.Fatal(err)
			}
			dcs = append(dcs, dc)
		}
		for _, dc := range dcs {
			if ok, err := dc.WaitContext(ctx); err != nil || !ok {
				b.Fatalf("confirm: %v %v", ok, err)
			}
		}
	}
	return time.Since(start)
}

// BenchmarkPublish publishes publishPerOp messages from 64 goroutines, one
// message per Publish call, through ours, watermill-amqp (durable queue,
// confirms on) and the raw floor, in turn. It reports each rate,
// omnibus/watermill-x (target ≥ 1) and omnibus/raw-% (target ≥ 70).
func BenchmarkPublish(b *testing.B) {
	var oursRate, theirsRate, rawRate float64
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		pfx := prefix(b)
		cc := ours(b, pfx)
		init, err := rabbitmq.NewSubscriber(rabbitmq.SubscriberConfig{ConnectionConfig: cc, ConsumerGroup: "bench"}, nil)
		if err != nil {
			b.Fatal(err)
		}
		if err := init.SubscribeInitialize("orders"); err != nil {
			b.Fatal(err)
		}
		pub, err := rabbitmq.NewPublisher(rabbitmq.PublisherConfig{ConnectionConfig: cc}, nil)
		if err != nil {
			b.Fatal(err)
		}
		theirs, err := wamqp.NewPublisher(theirsConfig(b), watermill.NopLogger{})
		if err != nil {
			b.Fatal(err)
		}
		theirTopic := pfx + "watermill"
		declareTheirs(b, theirTopic)
		b.StartTimer()
		runs := []func(){
			func() {
				oursRate += publishPerOp / brokerbench.PublishConcurrently(b, pub, "orders", publishPerOp).Seconds()
			},
			func() {
				theirsRate += publishPerOp / brokerbench.PublishConcurrently(b, theirs, theirTopic, publishPerOp).Seconds()
			},
			func() { rawRate += publishPerOp / publishRaw(b, pfx+"orders", publishPerOp).Seconds() },
		}
		for j := range runs {
			runs[(i+j)%len(runs)]()
		}
		b.StopTimer()
		if n := queueLength(b, theirTopic); n != publishPerOp {
			b.Fatalf("watermill's queue holds %d messages, want %d", n, publishPerOp)
		}
		if n := queueLength(b, pfx+"orders.bench.shard.0"); n != 2*publishPerOp {
			b.Fatalf("our queue holds %d messages, want %d (ours and the floor's)", n, 2*publishPerOp)
		}
		_ = pub.Close()
		_ = theirs.Close()
		_ = rabbitmq.DeleteTopic(context.Background(), url(b), pfx, "orders", 1, "bench")
		deleteQueue(b, theirTopic)
		b.StartTimer()
	}
	b.StopTimer()
	n := float64(b.N)
	b.ReportMetric(oursRate/n, "omnibus-msgs/s")
	b.ReportMetric(theirsRate/n, "watermill-msgs/s")
	b.ReportMetric(rawRate/n, "raw-msgs/s")
	b.ReportMetric(oursRate/theirsRate, "omnibus/watermill-x")
	b.ReportMetric(100*oursRate/rawRate, "omnibus/raw-%")
}

// declareTheirs declares watermill-amqp's queue of topic (its publisher
// does not: what it publishes before is dropped).
func declareTheirs(b *testing.B, topic string) {
	sub, err := wamqp.NewSubscriber(theirsConfig(b), watermill.NopLogger{})
	if err != nil {
		b.Fatal(err)
	}
	defer sub.Close()
	if err := sub.SubscribeInitialize(topic); err != nil {
		b.Fatal(err)
	}
}

// queueLength is how many messages queue holds.
func queueLength(b *testing.B, queue string) int {
	conn, err := amqp.Dial(url(b))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		b.Fatal(err)
	}
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		b.Fatal(err)
	}
	return q.Messages
}

func deleteQueue(b *testing.B, name string) {
	conn, err := amqp.Dial(url(b))
	if err != nil {
		return
	}
	defer conn.Close()
	if ch, err := conn.Channel(); err == nil {
		_, _ = ch.QueueDelete(name, false, false, false)
	}
}

// BenchmarkConsume reads consumePerOp messages over 1,000 keys, published
// beforehand, with a 1 ms handler, through ours (one subscriber, default
// prefetch, keys handled concurrently, one at a time per key) and
// watermill-amqp (one subscriber, its default prefetch of 1), in turn. It
// reports each rate and omnibus/watermill-x (target ≥ 1).
func BenchmarkConsume(b *testing.B) {
	var oursRate, theirsRate float64
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		pfx := prefix(b)
		cc := ours(b, pfx)
		pub, err := rabbitmq.NewPublisher(rabbitmq.PublisherConfig{ConnectionConfig: cc, Groups: []string{"bench"}}, nil)
		if err != nil {
			b.Fatal(err)
		}
		for start := 0; start < consumePerOp; start += 100 {
			var batch []*message.Message
			for j := range 100 {
				batch = append(batch, brokerbench.Keyed(start+j))
			}
			if err := pub.Publish("orders", batch...); err != nil {
				b.Fatal(err)
			}
		}
		_ = pub.Close()
		theirTopic := pfx + "watermill"
		declareTheirs(b, theirTopic)
		theirPub, err := wamqp.NewPublisher(theirsConfig(b), watermill.NopLogger{})
		if err != nil {
			b.Fatal(err)
		}
		for j := range consumePerOp {
			if err := theirPub.Publish(theirTopic, brokerbench.Keyed(j)); err != nil {
				b.Fatal(err)
			}
		}
		_ = theirPub.Close()
		b.StartTimer()
		runs := []func(){
			func() {
				sub, err := rabbitmq.NewSubscriber(rabbitmq.SubscriberConfig{ConnectionConfig: cc, ConsumerGroup: "bench"}, nil)
				if err != nil {
					b.Fatal(err)
				}
				oursRate += consumePerOp / brokerbench.Consume(b, sub, "orders", consumePerOp).Seconds()
			},
			func() {
				sub, err := wamqp.NewSubscriber(theirsConfig(b), watermill.NopLogger{})
				if err != nil {
					b.Fatal(err)
				}
				theirsRate += consumePerOp / brokerbench.Consume(b, sub, theirTopic, consumePerOp).Seconds()
			},
		}
		for j := range runs {
			runs[(i+j)%len(runs)]()
		}
		b.StopTimer()
		_ = rabbitmq.DeleteTopic(context.Background(), url(b), pfx, "orders", 1, "bench")
		deleteQueue(b, theirTopic)
		b.StartTimer()
	}
	b.StopTimer()
	n := float64(b.N)
	b.ReportMetric(oursRate/n, "omnibus-msgs/s")
	b.ReportMetric(theirsRate/n, "watermill-msgs/s")
	b.ReportMetric(oursRate/theirsRate, "omnibus/watermill-x")
}
