package kafka_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/transports/kafka"
)

func TestConfig_BadInputNamesTheField(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "not.pem")
	require.NoError(t, os.WriteFile(notPEM, []byte("not a certificate"), 0o600))
	brokers := []string{"127.0.0.1:9092"}

	pubCases := []struct {
		name  string
		cfg   kafka.PublisherConfig
		field string
	}{
		{"empty brokers", kafka.PublisherConfig{}, "Brokers"},
		{"blank broker", kafka.PublisherConfig{ConnectionConfig: kafka.ConnectionConfig{Brokers: []string{" "}}}, "Brokers"},
		{"invalid SASL mechanism", kafka.PublisherConfig{ConnectionConfig: kafka.ConnectionConfig{Brokers: brokers, SASL: kafka.SASLConfig{Mechanism: "GSSAPI", User: "u"}}}, "SASL.Mechanism"},
		{"SASL without user", kafka.PublisherConfig{ConnectionConfig: kafka.ConnectionConfig{Brokers: brokers, SASL: kafka.SASLConfig{Mechanism: kafka.SASLScramSHA512}}}, "SASL.User"},
		{"unreadable CA file", kafka.PublisherConfig{ConnectionConfig: kafka.ConnectionConfig{Brokers: brokers, TLS: kafka.TLSConfig{CAFile: filepath.Join(dir, "missing.pem")}}}, "TLS.CAFile"},
		{"CA file without PEM", kafka.PublisherConfig{ConnectionConfig: kafka.ConnectionConfig{Brokers: brokers, TLS: kafka.TLSConfig{CAFile: notPEM}}}, "TLS.CAFile"},
		{"cert without key", kafka.PublisherConfig{ConnectionConfig: kafka.ConnectionConfig{Brokers: brokers, TLS: kafka.TLSConfig{CertFile: notPEM}}}, "TLS.KeyFile"},
		{"bad Kafka version", kafka.PublisherConfig{ConnectionConfig: kafka.ConnectionConfig{Brokers: brokers, KafkaVersion: "two"}}, "KafkaVersion"},
		{"Kafka version without record headers", kafka.PublisherConfig{ConnectionConfig: kafka.ConnectionConfig{Brokers: brokers, KafkaVersion: "0.10.2.0"}}, "KafkaVersion"},
		{"unknown acks", kafka.PublisherConfig{ConnectionConfig: kafka.ConnectionConfig{Brokers: brokers}, Acks: "some"}, "Acks"},
		{"idempotence without acks=all", kafka.PublisherConfig{ConnectionConfig: kafka.ConnectionConfig{Brokers: brokers}, Acks: kafka.AcksLeader}, "Acks"},
		{"unknown compression", kafka.PublisherConfig{ConnectionConfig: kafka.ConnectionConfig{Brokers: brokers}, Compression: "brotli"}, "Compression"},
		{"negative retries", kafka.PublisherConfig{ConnectionConfig: kafka.ConnectionConfig{Brokers: brokers}, Retries: -1}, "Retries"},
		{"negative batch bytes", kafka.PublisherConfig{ConnectionConfig: kafka.ConnectionConfig{Brokers: brokers}, BatchBytes: -1}, "BatchBytes"},
	}
	for _, tc := range pubCases {
		t.Run("publisher/"+tc.name, func(t *testing.T) {
			t.Parallel()
			assertFieldError(t, tc.cfg.Validate(), tc.field)
			_, err := kafka.NewPublisher(tc.cfg, nil)
			assertFieldError(t, err, tc.field)
		})
	}

	sub := func(mut func(*kafka.SubscriberConfig)) kafka.SubscriberConfig {
		c := kafka.SubscriberConfig{ConnectionConfig: kafka.ConnectionConfig{Brokers: brokers}, ConsumerGroup: "g"}
		mut(&c)
		return c
	}
	subCases := []struct {
		name  string
		cfg   kafka.SubscriberConfig
		field string
	}{
		{"empty brokers", sub(func(c *kafka.SubscriberConfig) { c.Brokers = nil }), "Brokers"},
		{"invalid SASL mechanism", sub(func(c *kafka.SubscriberConfig) { c.SASL = kafka.SASLConfig{Mechanism: "SCRAM-MD5", User: "u"} }), "SASL.Mechanism"},
		{"Kafka version without record headers", sub(func(c *kafka.SubscriberConfig) { c.KafkaVersion = "0.10.2.0" }), "KafkaVersion"},
		{"unreadable CA file", sub(func(c *kafka.SubscriberConfig) { c.TLS.CAFile = filepath.Join(dir, "missing.pem") }), "TLS.CAFile"},
		{"negative in-flight limit", sub(func(c *kafka.SubscriberConfig) { c.MaxInFlight = -1 }), "MaxInFlight"},
		{"no consumer group", sub(func(c *kafka.SubscriberConfig) { c.ConsumerGroup = "" }), "ConsumerGroup"},
		{"unknown initial offset", sub(func(c *kafka.SubscriberConfig) { c.InitialOffset = "middle" }), "InitialOffset"},
		{"unknown balance strategy", sub(func(c *kafka.SubscriberConfig) { c.BalanceStrategy = "random" }), "BalanceStrategy"},
		{"heartbeat not below session", sub(func(c *kafka.SubscriberConfig) { c.SessionTimeout, c.HeartbeatInterval = time.Second, 2*time.Second }), "HeartbeatInterval"},
		{"negative nack delay", sub(func(c *kafka.SubscriberConfig) { c.NackDelay = -1 }), "NackDelay"},
		{"negative read-ahead", sub(func(c *kafka.SubscriberConfig) { c.MaxReadAheadBytes = -1 }), "MaxReadAheadBytes"},
		{"negative fetch wait", sub(func(c *kafka.SubscriberConfig) { c.FetchMaxWait = -time.Second }), "FetchMaxWait"},
		{"fetch wait below a millisecond", sub(func(c *kafka.SubscriberConfig) { c.FetchMaxWait = 500 * time.Microsecond }), "FetchMaxWait"},
		{"blank dead-letter topic", sub(func(c *kafka.SubscriberConfig) { c.DeadLetterTopic = " " }), "DeadLetterTopic"},
	}
	for _, tc := range subCases {
		t.Run("subscriber/"+tc.name, func(t *testing.T) {
			t.Parallel()
			assertFieldError(t, tc.cfg.Validate(), tc.field)
			_, err := kafka.NewSubscriber(tc.cfg, nil)
			assertFieldError(t, err, tc.field)
		})
	}
}

func assertFieldError(t *testing.T, err error, field string) {
	t.Helper()
	require.Error(t, err, "expected an error naming %s", field)
	var ce *bus.ConfigError
	require.True(t, errors.As(err, &ce), "expected a *bus.ConfigError, got %T: %v", err, err)
	assert.Equal(t, field, ce.Field, "error %q names the wrong field", err)
	assert.True(t, strings.HasPrefix(err.Error(), "invalid config: "+field+": "), "error %q does not start with %q", err, "invalid config: "+field+": ")
}

func TestConfig_ZeroValuesAreDefaults(t *testing.T) {
	t.Parallel()
	require.NoError(t, kafka.PublisherConfig{ConnectionConfig: kafka.ConnectionConfig{Brokers: []string{"127.0.0.1:9092"}}}.Validate())
	require.NoError(t, kafka.SubscriberConfig{ConnectionConfig: kafka.ConnectionConfig{Brokers: []string{"127.0.0.1:9092"}}, ConsumerGroup: "g"}.Validate())
	require.NoError(t, kafka.PublisherConfig{
		ConnectionConfig: kafka.ConnectionConfig{
			Brokers: []string{"127.0.0.1:9092"},
			SASL:    kafka.SASLConfig{Mechanism: kafka.SASLPlain, User: "u", Password: "p"},
		},
		Acks: kafka.AcksLeader, DisableIdempotence: true, Compression: "zstd",
	}.Validate())

	// The connection fields are promoted from the embedded ConnectionConfig.
	var pc kafka.PublisherConfig
	pc.Brokers = []string{"127.0.0.1:9092"}
	pc.SASL.Mechanism = kafka.SASLPlain
	pc.SASL.User = "u"
	require.NoError(t, pc.Validate())
}
