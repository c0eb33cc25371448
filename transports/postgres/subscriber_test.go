package postgres

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/internal/testenv"
)

func TestSubscriber_WokenByNotifyOnCommit(t *testing.T) {
	t.Parallel()
	pool, ob := newOutbox(t)
	// Polling is effectively off: only the notification can wake it.
	sub, err := NewSubscriber(pool, SubscriberConfig{Table: ob.Table(), PollInterval: time.Hour}, nil)
	require.NoError(t, err)
	defer sub.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ch, err := sub.Subscribe(ctx, AllTopics)
	require.NoError(t, err)
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, ob.Enqueue(ctx, tx, "t", event("k", "x")))
	select {
	case m := <-ch:
		t.Fatalf("delivered %s before the writer committed", m.Payload)
	case <-time.After(100 * time.Millisecond):
	}
	require.NoError(t, tx.Commit(ctx))
	select {
	case m := <-ch:
		assert.Equal(t, "x", string(m.Payload))
		m.Ack()
	case <-ctx.Done():
		t.Fatal("the commit's notification did not wake the subscriber (poll interval is an hour)")
	}
}

func TestSubscriber_CloseReleasesUnstartedRowsAndSettlesInFlight(t *testing.T) {
	t.Parallel()
	pool, ob := newOutbox(t)
	enqueue(t, pool, ob, "t", event("k", "r1"), event("k", "r2"), event("k", "r3"))
	sub, err := NewSubscriber(pool, SubscriberConfig{Table: ob.Table(), CloseTimeout: 5 * time.Second}, nil)
	require.NoError(t, err)
	ch, err := sub.Subscribe(context.Background(), AllTopics)
	require.NoError(t, err)
	var first = <-ch
	require.Equal(t, "r1", string(first.Payload))
	closed := make(chan struct{})
	go func() {
		assert.NoError(t, sub.Close())
		close(closed)
	}()
	select {
	case <-closed:
		t.Fatal("Close returned while a message was still in flight")
	case <-time.After(200 * time.Millisecond):
	}
	first.Ack() // the in-flight handler finishes during the graceful close
	<-closed
	_, open := <-ch
	assert.False(t, open, "the output channel is closed")
	assert.Equal(t, "completed", stateOf(t, pool, ob, "r1").status, "the in-flight ack is written at close")
	for _, p := range []string{"r2", "r3"} {
		s := stateOf(t, pool, ob, p)
		assert.Equal(t, "pending", s.status)
		assert.Nil(t, s.lockedBy, "%s, fetched but not started, is released", p)
		assert.Zero(t, s.attempts)
	}
	_, err = sub.Subscribe(context.Background(), AllTopics)
	assert.ErrorIs(t, err, ErrClosed)
	assert.NoError(t, sub.Close(), "Close is idempotent")
}

func TestSubscriber_LeaseIsRenewedWhileHandlerRuns(t *testing.T) {
	t.Parallel()
	pool, ob := newOutbox(t)
	enqueue(t, pool, ob, "t", event("k", "slow"))
	a, err := NewSubscriber(pool, SubscriberConfig{Table: ob.Table(), Lease: time.Second, WorkerID: "a"}, nil)
	require.NoError(t, err)
	defer a.Close()
	chA, err := a.Subscribe(context.Background(), AllTopics)
	require.NoError(t, err)
	m := <-chA
	b, err := NewSubscriber(pool, SubscriberConfig{Table: ob.Table(), Lease: time.Second, WorkerID: "b", PollInterval: 50 * time.Millisecond}, nil)
	require.NoError(t, err)
	defer b.Close()
	chB, err := b.Subscribe(context.Background(), AllTopics)
	require.NoError(t, err)
	select {
	case dup := <-chB:
		t.Fatalf("row %s delivered to a second worker while the first still handles it", dup.Payload)
	case <-time.After(3 * time.Second): // three lease lengths
	}
	m.Ack()
	testenv.Eventually(t, 5*time.Second, func() bool { return stateOf(t, pool, ob, "slow").status == "completed" }, "the row to complete")
}

func TestSubscriber_NackAppliesTheSettlement(t *testing.T) {
	t.Parallel()
	pool, ob := newOutbox(t)
	enqueue(t, pool, ob, "t", event("k", "p"), event("k", "after"))
	sub, err := NewSubscriber(pool, SubscriberConfig{Table: ob.Table()}, nil)
	require.NoError(t, err)
	defer sub.Close()
	ch, err := sub.Subscribe(context.Background(), AllTopics)
	require.NoError(t, err)
	m := <-ch
	d, ok := bus.DeliveryOf(m)
	require.True(t, ok)
	assert.Equal(t, 0, d.Attempts)
	assert.Equal(t, DefaultMaxAttempts, d.MaxAttempts)
	assert.Equal(t, "t", d.Topic)
	require.True(t, bus.Settle(m, bus.Settlement{Class: bus.ClassPermanent, GiveUp: true, Error: "cannot decode"}))
	m.Nack()
	next := <-ch
	assert.Equal(t, "after", string(next.Payload), "a failed row does not hold its key (default policy)")
	next.Ack()
	testenv.Eventually(t, 5*time.Second, func() bool { return stateOf(t, pool, ob, "p").status == "failed" }, "the failure to be written")
	assert.Equal(t, "cannot decode", *stateOf(t, pool, ob, "p").lastError)
}

// A lane's give-back can wait: for a writer of its key, or, here, for a
// lock someone holds on the lane's row. The settlements of other keys' rows
// are written meanwhile. (When one goroutine wrote both, every settlement
// waited for the give-backs before it, and the relay drained no faster than
// it gave lanes back: BenchmarkRelayDrain.)
func TestSubscriber_SettlementsDoNotWaitForAGiveBack(t *testing.T) {
	t.Parallel()
	pool, ob := newOutbox(t)
	ctx := context.Background()
	lanes := ob.q.table.derived("_lanes").quoted()
	// The second key must not share the first one's advisory lock, which
	// the waiting give-back holds (a writer of the second key would wait
	// for it, and so would its fetch).
	lockOf := func(key string) string { return laneLock(ob.q.table, "''", "'t'", "'"+key+"'") }
	other := ""
	for _, k := range []string{"b", "c", "d", "e", "f"} {
		var same bool
		require.NoError(t, pool.QueryRow(ctx, `SELECT (`+lockOf("a")+`) = (`+lockOf(k)+`)`).Scan(&same))
		if !same {
			other = k
			break
		}
	}
	require.NotEmpty(t, other)

	enqueue(t, pool, ob, "t", event("a", "a1"))
	sub, err := NewSubscriber(pool, SubscriberConfig{Table: ob.Table(), CloseTimeout: 5 * time.Second}, nil)
	require.NoError(t, err)
	defer sub.Close()
	rcvCtx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	ch, err := sub.Subscribe(rcvCtx, AllTopics)
	require.NoError(t, err)
	receive := func(want string) *message.Message {
		t.Helper()
		select {
		case m := <-ch:
			require.Equal(t, want, string(m.Payload))
			return m
		case <-rcvCtx.Done():
			t.Fatalf("%s was not delivered", want)
			return nil
		}
	}

	a1 := receive("a1")
	// Someone holds the row of a's lane locked: a's give-back, after a1's
	// settlement, waits for them.
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	tag, err := tx.Exec(ctx, `SELECT 1 FROM `+lanes+` WHERE partition_key = 'a' FOR UPDATE`)
	require.NoError(t, err)
	require.EqualValues(t, 1, tag.RowsAffected(), "a's lane")
	a1.Ack()
	testenv.Eventually(t, 5*time.Second, func() bool { return stateOf(t, pool, ob, "a1").status == "completed" }, "a1's ack to be written")

	enqueue(t, pool, ob, "t", event(other, "x1"))
	receive("x1").Ack()
	testenv.Eventually(t, 5*time.Second, func() bool { return stateOf(t, pool, ob, "x1").status == "completed" },
		"x1's ack to be written while a's give-back waits")

	require.NoError(t, tx.Rollback(ctx))
	testenv.Eventually(t, 5*time.Second, func() bool {
		var held bool
		require.NoError(t, pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+lanes+` WHERE partition_key = 'a' AND locked_by IS NOT NULL)`).Scan(&held))
		return !held
	}, "a's lane to be given back once the lock is released")
}
