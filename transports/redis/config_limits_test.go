package redis_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omnibus-go/omnibus/bus"
	omniredis "github.com/omnibus-go/omnibus/transports/redis"
)

// TestConfig_SizesOverTheirLimitsAreRefused: a size set in code is the
// capacity of a queue or the COUNT of a read; an absurd one must be refused
// by Validate, naming the field and the limit, not crash the process
// (makechan: size out of range, or out of memory).
func TestConfig_SizesOverTheirLimitsAreRefused(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		cfg   interface{ Validate() error }
		field string
		limit int
	}{
		{"publisher BatchSize 2^40", omniredis.PublisherConfig{Addr: "127.0.0.1:6379", BatchSize: 1 << 40}, "BatchSize", omniredis.MaxPublishBatchSize},
		{"publisher Pipelines 2^40", omniredis.PublisherConfig{Addr: "127.0.0.1:6379", Pipelines: 1 << 40}, "Pipelines", omniredis.MaxPublishPipelines},
		{"subscriber BatchSize 2^40", omniredis.SubscriberConfig{Addr: "127.0.0.1:6379", ConsumerGroup: "g", BatchSize: 1 << 40}, "BatchSize", omniredis.MaxBatchSize},
		{"subscriber MaxInFlight 2^40", omniredis.SubscriberConfig{Addr: "127.0.0.1:6379", ConsumerGroup: "g", MaxInFlight: 1 << 40}, "MaxInFlight", omniredis.MaxMaxInFlight},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := tc.cfg.Validate()
			require.Error(t, err)
			var ce *bus.ConfigError
			require.True(t, errors.As(err, &ce), "%v", err)
			assert.Equal(t, tc.field, ce.Field)
			assert.Contains(t, ce.Reason, fmt.Sprintf("at most %d", tc.limit))
		})
	}
	for _, cfg := range []interface{ Validate() error }{
		omniredis.PublisherConfig{Addr: "127.0.0.1:6379", BatchSize: omniredis.MaxPublishBatchSize, Pipelines: omniredis.MaxPublishPipelines},
		omniredis.SubscriberConfig{Addr: "127.0.0.1:6379", ConsumerGroup: "g", BatchSize: omniredis.MaxBatchSize, MaxInFlight: omniredis.MaxMaxInFlight},
	} {
		assert.NoError(t, cfg.Validate(), "the limits themselves are valid")
	}
}
