package postgres

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omnibus-go/omnibus/bus"
)

// TestConfigs_RefuseNumbersOverTheirLimits: an attempt budget must fit the
// int32 column (and the one limit the inbox and SetMaxAttempts use), and a
// size must not ask for an absurd allocation.
func TestConfigs_RefuseNumbersOverTheirLimits(t *testing.T) {
	t.Parallel()
	subscriber := func(mutate func(*SubscriberConfig)) func() error {
		return func() error {
			var c SubscriberConfig
			mutate(&c)
			c.setDefaults()
			return c.Validate()
		}
	}
	for _, tc := range []struct {
		name     string
		validate func() error
		field    string
		limit    int
	}{
		{"outbox MaxAttempts 2^32 (stored as 0)", func() error { _, err := NewOutbox(OutboxConfig{MaxAttempts: 1 << 32}); return err }, "MaxAttempts", bus.MaxAttemptsLimit},
		{"outbox MaxAttempts 5000", func() error { _, err := NewOutbox(OutboxConfig{MaxAttempts: 5000}); return err }, "MaxAttempts", bus.MaxAttemptsLimit},
		{"inbox MaxAttempts", func() error { _, err := NewInbox(InboxConfig{MaxAttempts: bus.MaxAttemptsLimit + 1}); return err }, "MaxAttempts", bus.MaxAttemptsLimit},
		{"subscriber SettleBatch 2^40", subscriber(func(c *SubscriberConfig) { c.SettleBatch = 1 << 40 }), "SettleBatch", MaxSettleBatch},
		{"subscriber BatchSize 2^40", subscriber(func(c *SubscriberConfig) { c.BatchSize = 1 << 40 }), "BatchSize", MaxBatchSize},
		{"subscriber RunLength 2^40", subscriber(func(c *SubscriberConfig) { c.RunLength = 1 << 40 }), "RunLength", MaxRunLength},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := tc.validate()
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.field+": at most "+fmt.Sprint(tc.limit))
		})
	}
	at := []func() error{
		func() error { _, err := NewOutbox(OutboxConfig{MaxAttempts: bus.MaxAttemptsLimit}); return err },
		func() error { _, err := NewInbox(InboxConfig{MaxAttempts: bus.MaxAttemptsLimit}); return err },
		subscriber(func(c *SubscriberConfig) {
			c.SettleBatch, c.BatchSize, c.RunLength = MaxSettleBatch, MaxBatchSize, MaxRunLength
		}),
	}
	for i, validate := range at {
		assert.NoError(t, validate(), "limit %d itself is valid", i)
	}
}

// TestEnqueue_AttemptBudgetUpToTheLimitIsStored: the configured budget and a
// message's own (SetMaxAttempts) share one limit, and a budget at the limit
// lands in the column as is.
func TestEnqueue_AttemptBudgetUpToTheLimitIsStored(t *testing.T) {
	t.Parallel()
	pool, plain := newOutbox(t)
	ctx := context.Background()
	ob, err := NewOutbox(OutboxConfig{Table: plain.Table(), MaxAttempts: bus.MaxAttemptsLimit})
	require.NoError(t, err)

	enqueue(t, pool, ob, "t", event("k", "config budget"))
	own := event("k", "own budget")
	SetMaxAttempts(own, bus.MaxAttemptsLimit)
	enqueue(t, pool, plain, "t", own)
	over := event("k", "over")
	SetMaxAttempts(over, bus.MaxAttemptsLimit+1)
	err = plain.Enqueue(ctx, pool, "t", over)
	var invalid *InvalidMessageError
	require.True(t, errors.As(err, &invalid), "a budget over the limit is refused: %v", err)
	assert.Equal(t, MetaMaxAttempts, invalid.Field)

	rows, err := pool.Query(ctx, fmt.Sprintf(`SELECT max_attempts FROM %s ORDER BY id`, plain.q.table.quoted()))
	require.NoError(t, err)
	var got []int
	for rows.Next() {
		var n int
		require.NoError(t, rows.Scan(&n))
		got = append(got, n)
	}
	require.NoError(t, rows.Err())
	assert.Equal(t, []int{bus.MaxAttemptsLimit, bus.MaxAttemptsLimit}, got)
}
