package processors_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omnibus-go/omnibus/processors"
	"github.com/omnibus-go/omnibus/transports/memory"
)

// TestInboxIngestConfig_SizesOverTheirLimitsAreRefused: BatchSize × Writers
// is the capacity of the ingest's request queue; an absurd value must be
// refused by Validate, naming the field and the limit, not crash the process
// (makechan: size out of range).
func TestInboxIngestConfig_SizesOverTheirLimitsAreRefused(t *testing.T) {
	t.Parallel()
	broker := memory.NewBroker(nil)
	t.Cleanup(func() { _ = broker.Close() })
	sub, err := broker.Subscriber("g")
	require.NoError(t, err)
	base := processors.InboxIngestConfig{Subscriber: sub, Topic: "t", ConsumerGroup: "g", Writers: 1, BatchSize: 1}
	for _, tc := range []struct {
		name   string
		mutate func(*processors.InboxIngestConfig)
		field  string
		limit  int
	}{
		{"BatchSize 2^40", func(c *processors.InboxIngestConfig) { c.BatchSize = 1 << 40 }, "BatchSize", processors.MaxIngestBatchSize},
		{"Writers 2^40", func(c *processors.InboxIngestConfig) { c.Writers = 1 << 40 }, "Writers", processors.MaxIngestWriters},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg := base
			tc.mutate(&cfg)
			err := cfg.Validate()
			require.Error(t, err)
			assert.Contains(t, err.Error(), fmt.Sprintf("%s: at most %d", tc.field, tc.limit))
		})
	}
	at := base
	at.BatchSize, at.Writers = processors.MaxIngestBatchSize, processors.MaxIngestWriters
	assert.NoError(t, at.Validate(), "the limits themselves are valid")
}
