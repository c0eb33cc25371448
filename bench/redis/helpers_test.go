package redisbench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

const (
	// goroutines publish concurrently in the publish scenario.
	goroutines = 64
	// payloadBytes is the size of every payload.
	payloadBytes = 256
	// messagesPerOp is how many messages one iteration publishes or consumes,
	// per implementation.
	messagesPerOp = 50000
	// rawPipeline is how many XADDs the raw floor sends per pipeline.
	rawPipeline = 100
	// rawReadCount is the COUNT of each XREADGROUP of the raw floor.
	rawReadCount = 500
	// poolSize is the connection pool of every client, ours and theirs.
	poolSize = 128
	// rounds is how many times one iteration of BenchmarkPublish and
	// BenchmarkConsume runs each side. A round is short (about a second),
	// so one round's ratio swings with whatever else the machine does;
	// make bench runs one iteration and reports the medians of three.
	rounds = 3
)

// rates are one side's msgs/s, one per round.
type rates []float64

func (r *rates) add(v float64) { *r = append(*r, v) }

// report prints the medians of each side's rates and of the per-round
// ratios: omnibus/raw-% (issue 26: at least 70) and omnibus/watermill-x.
func report(b *testing.B, ours, theirs, raw rates) {
	b.Helper()
	toRaw, toTheirs := make([]float64, len(ours)), make([]float64, len(ours))
	for i := range ours {
		toRaw[i], toTheirs[i] = 100*ours[i]/raw[i], ours[i]/theirs[i]
	}
	b.ReportMetric(median(ours), "omnibus-msgs/s")
	b.ReportMetric(median(theirs), "watermill-msgs/s")
	b.ReportMetric(median(raw), "raw-msgs/s")
	b.ReportMetric(median(toTheirs), "omnibus/watermill-x")
	b.ReportMetric(median(toRaw), "omnibus/raw-%")
	b.Logf("omnibus/raw-%% per round: %.1f", toRaw)
}

func redisAddr() string {
	if a := os.Getenv("OMNIBUS_TEST_REDIS_ADDR"); a != "" {
		return a
	}
	return "127.0.0.1:6379"
}

// newClient opens a client and closes it when the benchmark ends. Tolerant
// of being closed earlier (watermill-redisstream's Publisher closes the
// client it is given).
func newClient(b *testing.B) *redis.Client {
	b.Helper()
	c := redis.NewClient(&redis.Options{Addr: redisAddr(), PoolSize: poolSize})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		b.Fatalf("Redis is not reachable at %s: %v\nStart it with `make services` (or set OMNIBUS_TEST_REDIS_ADDR).", redisAddr(), err)
	}
	b.Cleanup(func() { _ = c.Close() })
	return c
}

// streamName returns a fresh stream name and deletes the stream (and its
// dead-letter stream) when the benchmark ends.
func streamName(b *testing.B, admin *redis.Client, what string) string {
	b.Helper()
	var r [6]byte
	_, _ = rand.Read(r[:])
	name := "omnibus:bench:" + hex.EncodeToString(r[:]) + ":" + what
	b.Cleanup(func() {
		_ = admin.Del(context.Background(), name, name+":dead-letter").Err()
	})
	return name
}

func payload() []byte {
	p := make([]byte, payloadBytes)
	_, _ = rand.Read(p)
	return p
}
