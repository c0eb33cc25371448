// Package natsbench measures the nats transport against Watermill's own
// NATS transport (watermill-nats v2, JetStream) and a raw nats.go
// JetStream floor, on the local server (issue 30, point 7).
package natsbench

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wnats "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/nats"
	"github.com/ThreeDotsLabs/watermill/message"
	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/omnibus-go/omnibus/bench/internal/brokerbench"
	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/internal/testenv"
	"github.com/omnibus-go/omnibus/transports/nats"
)

const (
	// publishPerOp and consumePerOp are the messages of one run.
	publishPerOp = 20000
	consumePerOp = 2000
	// rawBatch is how many messages the floor publishes before it waits for
	// their acknowledgements.
	rawBatch = 100
)

func prefix() string { return fmt.Sprintf("omnibus_bench_%d.", time.Now().UnixNano()) }

func ours(b *testing.B, pfx string) nats.ConnectionConfig {
	return nats.ConnectionConfig{URL: testenv.NATS(b), SubjectPrefix: pfx}
}

// theirs are watermill-nats's publisher and subscriber on JetStream, with
// message IDs tracked (deduplication, like ours) and their stream created
// on first use.
func theirs(b *testing.B) (*wnats.Publisher, func() *wnats.Subscriber) {
	js := wnats.JetStreamConfig{
		AutoProvision:    true,
		TrackMsgId:       true,
		DurablePrefix:    "bench",
		SubscribeOptions: []natsgo.SubOpt{natsgo.DeliverAll(), natsgo.AckExplicit()},
	}
	pub, err := wnats.NewPublisher(wnats.PublisherConfig{URL: testenv.NATS(b), Marshaler: &wnats.NATSMarshaler{}, JetStream: js}, watermill.NopLogger{})
	if err != nil {
		b.Fatal(err)
	}
	return pub, func() *wnats.Subscriber {
		sub, err := wnats.NewSubscriber(wnats.SubscriberConfig{
			URL: testenv.NATS(b), QueueGroupPrefix: "bench", AckWaitTimeout: 30 * time.Second,
			Unmarshaler: &wnats.NATSMarshaler{}, JetStream: js,
		}, watermill.NopLogger{})
		if err != nil {
			b.Fatal(err)
		}
		return sub
	}
}

func rawJS(b *testing.B) (jetstream.JetStream, func()) {
	nc, err := natsgo.Connect(testenv.NATS(b))
	if err != nil {
		b.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	return js, nc.Close
}

// publishRaw is the floor: nats.go's JetStream client on one connection,
// rawBatch asynchronous publishes (with a Nats-Msg-Id, to our layout's
// subject) and then their acknowledgements.
func publishRaw(b *testing.B, subject string, n int) time.Duration {
	js, done := rawJS(b)
	defer done()
	start := time.Now()
	for sent := 0; sent < n; sent += rawBatch {
		var acks []jetstream.PubAckFuture
		for i := range min(rawBatch, n-sent) {
			m := natsgo.NewMsg(subject)
			m.Data = brokerbench.Body
			m.Header.Set(jetstream.MsgIDHeader, watermill.NewUUID())
			m.Header.Set(bus.KeyPartitionKey, fmt.Sprintf("key-%d", (sent+i)%brokerbench.Keys))
			f, err := js.PublishMsgAsync(m)
			if err != nil {
				b.Fatal(err)
			}
			acks = append(acks, f)
		}
		for _, f := range acks {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				b.Fatal(err)
			}
		}
	}
	return time.Since(start)
}

func streamMsgs(b *testing.B, stream string) uint64 {
	js, done := rawJS(b)
	defer done()
	s, err := js.Stream(context.Background(), stream)
	if err != nil {
		b.Fatal(err)
	}
	return s.CachedInfo().State.Msgs
}

func deleteStreams(b *testing.B, names ...string) {
	js, done := rawJS(b)
	defer done()
	for _, n := range names {
		_ = js.DeleteStream(context.Background(), n)
	}
}

func ourStream(pfx string) string { return pfx[:len(pfx)-1] + "_orders" }

// BenchmarkPublish publishes publishPerOp messages from 64 goroutines, one
// message per Publish call, through ours, watermill-nats (JetStream,
// message IDs tracked) and the raw floor, in turn. It reports each rate,
// omnibus/watermill-x (target ≥ 1) and omnibus/raw-% (target ≥ 70).
func BenchmarkPublish(b *testing.B) {
	var oursRate, theirsRate, rawRate float64
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		pfx := prefix()
		pub, err := nats.NewPublisher(nats.PublisherConfig{ConnectionConfig: ours(b, pfx)}, nil)
		if err != nil {
			b.Fatal(err)
		}
		if err := pub.Publish("orders", brokerbench.Keyed(0)); err != nil { // creates the stream
			b.Fatal(err)
		}
		theirPub, _ := theirs(b)
		theirTopic := pfx[:len(pfx)-1] + "_watermill"
		b.StartTimer()
		runs := []func(){
			func() {
				oursRate += publishPerOp / brokerbench.PublishConcurrently(b, pub, "orders", publishPerOp).Seconds()
			},
			func() {
				theirsRate += publishPerOp / brokerbench.PublishConcurrently(b, theirPub, theirTopic, publishPerOp).Seconds()
			},
			func() { rawRate += publishPerOp / publishRaw(b, pfx+"orders.0", publishPerOp).Seconds() },
		}
		for j := range runs {
			runs[(i+j)%len(runs)]()
		}
		b.StopTimer()
		if n := streamMsgs(b, theirTopic); n != publishPerOp {
			b.Fatalf("watermill's stream holds %d messages, want %d", n, publishPerOp)
		}
		if n := streamMsgs(b, ourStream(pfx)); n != 2*publishPerOp+1 {
			b.Fatalf("our stream holds %d messages, want %d (ours and the floor's)", n, 2*publishPerOp+1)
		}
		_ = pub.Close()
		_ = theirPub.Close()
		deleteStreams(b, ourStream(pfx), ourStream(pfx)+"_DEAD_LETTER", theirTopic)
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

// BenchmarkConsume reads consumePerOp messages over 1,000 keys, published
// beforehand, with a 1 ms handler, through ours (one subscriber, default
// prefetch, keys handled concurrently, one at a time per key) and
// watermill-nats (one subscriber, its defaults), in turn. It reports each
// rate and omnibus/watermill-x (target ≥ 1).
func BenchmarkConsume(b *testing.B) {
	var oursRate, theirsRate float64
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		pfx := prefix()
		cc := ours(b, pfx)
		pub, err := nats.NewPublisher(nats.PublisherConfig{ConnectionConfig: cc}, nil)
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
		theirPub, theirSub := theirs(b)
		theirTopic := pfx[:len(pfx)-1] + "_watermill"
		for j := range consumePerOp {
			if err := theirPub.Publish(theirTopic, brokerbench.Keyed(j)); err != nil {
				b.Fatal(err)
			}
		}
		_ = theirPub.Close()
		b.StartTimer()
		runs := []func(){
			func() {
				sub, err := nats.NewSubscriber(nats.SubscriberConfig{ConnectionConfig: cc, ConsumerGroup: "bench"}, nil)
				if err != nil {
					b.Fatal(err)
				}
				oursRate += consumePerOp / brokerbench.Consume(b, sub, "orders", consumePerOp).Seconds()
			},
			func() {
				theirsRate += consumePerOp / brokerbench.Consume(b, theirSub(), theirTopic, consumePerOp).Seconds()
			},
		}
		for j := range runs {
			runs[(i+j)%len(runs)]()
		}
		b.StopTimer()
		deleteStreams(b, ourStream(pfx), ourStream(pfx)+"_DEAD_LETTER", theirTopic)
		b.StartTimer()
	}
	b.StopTimer()
	n := float64(b.N)
	b.ReportMetric(oursRate/n, "omnibus-msgs/s")
	b.ReportMetric(theirsRate/n, "watermill-msgs/s")
	b.ReportMetric(oursRate/theirsRate, "omnibus/watermill-x")
}
