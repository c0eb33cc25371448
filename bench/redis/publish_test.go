package redisbench

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"

	omniredis "github.com/omnibus-go/omnibus/transports/redis"
)

// BenchmarkPublish publishes messagesPerOp messages of payloadBytes from 64
// goroutines, one message per Publish call, with each publisher in turn.
func BenchmarkPublish(b *testing.B) {
	admin := newClient(b)
	body := payload()

	ours, err := omniredis.NewPublisher(omniredis.PublisherConfig{Client: newClient(b)}, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer ours.Close()
	theirs, err := redisstream.NewPublisher(redisstream.PublisherConfig{Client: newClient(b)}, watermill.NopLogger{})
	if err != nil {
		b.Fatal(err)
	}
	defer theirs.Close()

	var oursRate, theirsRate float64
	b.ResetTimer()
	for i := range b.N {
		runs := []struct {
			rate *float64
			pub  message.Publisher
			name string
		}{{&oursRate, ours, "omnibus"}, {&theirsRate, theirs, "watermill"}}
		if i%2 == 1 {
			runs[0], runs[1] = runs[1], runs[0]
		}
		for _, r := range runs {
			stream := streamName(b, admin, "publish-"+r.name)
			elapsed := publishConcurrently(b, r.pub, stream, body)
			*r.rate += messagesPerOp / elapsed.Seconds()
			if n := admin.XLen(b.Context(), stream).Val(); n != messagesPerOp {
				b.Fatalf("%s: stream holds %d entries, want %d", r.name, n, messagesPerOp)
			}
		}
	}
	b.StopTimer()
	n := float64(b.N)
	b.ReportMetric(oursRate/n, "omnibus-msgs/s")
	b.ReportMetric(theirsRate/n, "watermill-msgs/s")
	b.ReportMetric(oursRate/theirsRate, "omnibus/watermill-x")
}

func publishConcurrently(b *testing.B, pub message.Publisher, topic string, body []byte) time.Duration {
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range goroutines {
		wg.Go(func() {
			for next.Add(1) <= messagesPerOp {
				msg := message.NewMessage(watermill.NewUUID(), body)
				if err := pub.Publish(topic, msg); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	return time.Since(start)
}
