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

// The SASL mechanisms are words of the kafka section, registered by this
// transport (bus names no broker's words): a password that happens to equal
// one is redacted where it is the password, and the mechanism still prints.
func TestRegister_SASLMechanismsAreConfigWords(t *testing.T) {
	t.Parallel()
	var cfg bus.Config
	cfg.Broker = kafka.Name
	kafka.SetSection(&cfg, kafka.Config{
		ConnectionConfig: kafka.ConnectionConfig{Brokers: []string{"b1:9092"},
			SASL: kafka.SASLConfig{Mechanism: kafka.SASLScramSHA512, User: "app", Password: kafka.SASLScramSHA512}},
	})
	out := cfg.String()
	assert.Contains(t, out, "mechanism: "+kafka.SASLScramSHA512)
	assert.Contains(t, out, "password: "+bus.Redacted)
}
