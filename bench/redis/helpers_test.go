package redisbench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/omnibus-go/omnibus/bench/internal/rounds"
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
)

// addRound records one round's rates (msgs/s of "omnibus", "watermill" and
// "raw") and its ratios: omnibus/raw-% (issue 26: at least 70) and
// omnibus/watermill-x.
func addRound(m *rounds.Medians, rate map[string]float64) {
	m.Add("omnibus-msgs/s", rate["omnibus"])
	m.Add("watermill-msgs/s", rate["watermill"])
	m.Add("raw-msgs/s", rate["raw"])
	m.Add("omnibus/watermill-x", rate["omnibus"]/rate["watermill"])
	m.Add("omnibus/raw-%", 100*rate["omnibus"]/rate["raw"])
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
