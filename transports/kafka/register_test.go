package kafka_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/transports/kafka"
)

func TestSubscriberConfigFrom_MapsTheKafkaSection(t *testing.T) {
	t.Parallel()
	var cfg bus.Config
	kafka.SetSection(&cfg, kafka.Config{
		ConnectionConfig:  kafka.ConnectionConfig{Brokers: []string{"b1:9092"}},
		MaxInFlight:       8,
		MaxReadAheadBytes: 1 << 20,
		FetchMaxWait:      50 * time.Millisecond,
		InitialOffset:     "newest",
	})
	got := kafka.SubscriberConfigFrom(cfg)
	assert.Equal(t, []string{"b1:9092"}, got.Brokers)
	assert.Equal(t, 8, got.MaxInFlight)
	assert.Equal(t, 1<<20, got.MaxReadAheadBytes)
	assert.Equal(t, 50*time.Millisecond, got.FetchMaxWait)
	assert.Equal(t, kafka.OffsetNewest, got.InitialOffset)
}

// The kafka section's defaults are the subscriber's (config check shows
// them).
func TestSubscriberConfigFrom_DefaultsAreTheSubscribers(t *testing.T) {
	t.Parallel()
	got := kafka.SubscriberConfigFrom(bus.Config{})
	assert.Equal(t, kafka.DefaultMaxInFlight, got.MaxInFlight)
	assert.Equal(t, kafka.DefaultMaxReadAheadBytes, got.MaxReadAheadBytes)
	assert.Equal(t, kafka.DefaultFetchMaxWait, got.FetchMaxWait)
	assert.Equal(t, kafka.DefaultDeadLetterTopic, got.DeadLetterTopic)
}
