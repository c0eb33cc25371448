package redisbench

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/omnibus-go/omnibus/bench/internal/rounds"

	omniredis "github.com/omnibus-go/omnibus/transports/redis"
)

// BenchmarkPublish publishes messagesPerOp messages of payloadBytes from 64
// goroutines, one message per Publish call, with each publisher in turn, and
// the floor: one loop of raw go-redis pipelines of rawPipeline XADDs. Each
// metric is the median of rounds.N rounds per iteration.
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

	floor := newClient(b)

	var m rounds.Medians
	b.ResetTimer()
	for i := range b.N * rounds.N {
		runs := []struct {
			publish func(stream string) time.Duration
			name    string
		}{
			{func(s string) time.Duration { return publishConcurrently(b, ours, s, body) }, "omnibus"},
			{func(s string) time.Duration { return publishConcurrently(b, theirs, s, body) }, "watermill"},
			{func(s string) time.Duration { return publishRaw(b, floor, s, body) }, "raw"},
		}
		rate := map[string]float64{}
		for j := range runs {
			r := runs[(i+j)%len(runs)] // rotate which goes first
			stream := streamName(b, admin, "publish-"+r.name)
			elapsed := r.publish(stream)
			rate[r.name] = messagesPerOp / elapsed.Seconds()
			if n := admin.XLen(b.Context(), stream).Val(); n != messagesPerOp {
				b.Fatalf("%s: stream holds %d entries, want %d", r.name, n, messagesPerOp)
			}
		}
		addRound(&m, rate)
	}
	b.StopTimer()
	m.Report(b)
}

// publishRaw is the floor: one loop of go-redis pipelines of rawPipeline
// XADDs, each entry a uuid and the payload, no framework around it.
func publishRaw(b *testing.B, c *redis.Client, stream string, body []byte) time.Duration {
	ctx := context.Background()
	start := time.Now()
	for done := 0; done < messagesPerOp; done += rawPipeline {
		pipe := c.Pipeline()
		for range min(rawPipeline, messagesPerOp-done) {
			pipe.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{"uuid", watermill.NewUUID(), "payload", body}})
		}
		if _, err := pipe.Exec(ctx); err != nil {
			b.Fatal(err)
		}
	}
	return time.Since(start)
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
