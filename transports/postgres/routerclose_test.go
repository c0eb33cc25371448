package postgres

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omnibus-go/omnibus/internal/testenv"
)

// TestSubscriber_RouterCloseReturnsAfterTheSettlementsAreWritten runs a
// Subscriber under a Watermill router, the way the processors do, and
// closes the router: once Close has returned, every row its handler acked is
// completed in the table. A program that closes the router and then its
// pool (or drops its tables) must not find the last settlements still being
// written; the router closes its subscribers without waiting for them, so
// the subscription itself writes them before its channel closes.
func TestSubscriber_RouterCloseReturnsAfterTheSettlementsAreWritten(t *testing.T) {
	t.Parallel()
	pool, ob := newOutbox(t)
	const rows = 50
	for i := range rows {
		enqueue(t, pool, ob, "t", event("k"+strconv.Itoa(i%5), "r"+strconv.Itoa(i)))
	}
	// Settlements are gathered for an hour: only the shutdown writes them.
	s, err := NewSubscriber(pool, SubscriberConfig{Table: ob.Table(), SettleInterval: time.Hour}, nil)
	require.NoError(t, err)
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	require.NoError(t, err)
	var handled atomic.Int64
	router.AddNoPublisherHandler("h", AllTopics, s, func(*message.Message) error {
		handled.Add(1)
		return nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- router.Run(ctx) }()
	testenv.Eventually(t, 20*time.Second, func() bool { return handled.Load() == rows }, "all %d rows handled", rows)

	require.NoError(t, router.Close())
	var completed int
	require.NoError(t, pool.QueryRow(context.Background(),
		`SELECT count(*) FROM `+ob.q.table.quoted()+` WHERE status = 'completed'`).Scan(&completed))
	assert.Equal(t, rows, completed, "rows completed when router.Close returned")
	require.NoError(t, <-done)
	require.NoError(t, s.Close())
}
