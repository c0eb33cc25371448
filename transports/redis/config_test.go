package redis_test

import (
	"errors"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/internal/testenv"
	omniredis "github.com/omnibus-go/omnibus/transports/redis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestConfig_InvalidInputNamesTheField(t *testing.T) {
	t.Parallel()
	client := testenv.Redis(t)
	sub := func(mut func(*omniredis.SubscriberConfig)) func() error {
		return func() error {
			cfg := omniredis.SubscriberConfig{Client: client, ConsumerGroup: "g"}
			mut(&cfg)
			s, err := omniredis.NewSubscriber(cfg, nil)
			if err == nil {
				_ = s.Close()
			}
			return err
		}
	}
	pub := func(cfg omniredis.PublisherConfig) func() error {
		return func() error {
			p, err := omniredis.NewPublisher(cfg, nil)
			if err == nil {
				_ = p.Close()
			}
			return err
		}
	}
	cases := []struct {
		name  string
		build func() error
		field string
	}{
		{"publisher without address or client", pub(omniredis.PublisherConfig{}), "Addr"},
		{"publisher with negative MaxLen", pub(omniredis.PublisherConfig{Client: client, MaxLen: -1}), "MaxLen"},
		{"publisher with negative batch size", pub(omniredis.PublisherConfig{Client: client, BatchSize: -1}), "BatchSize"},
		{"publisher with negative entry size limit", pub(omniredis.PublisherConfig{Client: client, MaxEntryBytes: -1}), "MaxEntryBytes"},
		{"subscriber without address or client", sub(func(c *omniredis.SubscriberConfig) { c.Client = nil }), "Addr"},
		{"subscriber without consumer group", sub(func(c *omniredis.SubscriberConfig) { c.ConsumerGroup = "" }), "ConsumerGroup"},
		{"negative batch size", sub(func(c *omniredis.SubscriberConfig) { c.BatchSize = -5 }), "BatchSize"},
		{"negative in-flight limit", sub(func(c *omniredis.SubscriberConfig) { c.MaxInFlight = -1 }), "MaxInFlight"},
		{"claim idle time shorter than block time", sub(func(c *omniredis.SubscriberConfig) {
			c.BlockTime = time.Second
			c.ClaimIdle = 500 * time.Millisecond
		}), "ClaimIdle"},
		{"default claim idle time shorter than a long block time", sub(func(c *omniredis.SubscriberConfig) {
			c.BlockTime = time.Minute
		}), "ClaimIdle"},
		{"negative nack delay", sub(func(c *omniredis.SubscriberConfig) { c.NackDelay = -time.Second }), "NackDelay"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := tc.build()
			require.Error(t, err)
			var ce *bus.ConfigError
			require.True(t, errors.As(err, &ce), "error %v is not a *ConfigError", err)
			assert.Equal(t, tc.field, ce.Field)
			assert.Contains(t, err.Error(), "invalid config: "+tc.field+": ")
		})
	}
}
