package postgres

import (
	"context"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/internal/testenv"
	"github.com/omnibus-go/omnibus/middleware"
)

func TestFetch_FailedHeadHoldsItsKeyButNotOthers(t *testing.T) {
	t.Parallel()
	pool, ob := newOutbox(t)
	enqueue(t, pool, ob, "orders", event("a", "a1"), event("a", "a2"), event("b", "b1"), event("b", "b2"))
	e := testEngine(pool, ob, "w1", 1)

	// a1 fails with a retry an hour away; b advances.
	later := time.Now().Add(time.Hour)
	got := cycle(t, e, 10, func(r row) *settleOp {
		if string(r.payload) == "a1" {
			return failWith(bus.ClassCounted, later)(r)
		}
		return nil
	})
	assert.ElementsMatch(t, []string{"a1", "b1"}, payloads(got), "with RunLength 1 each key advances one head per cycle")
	got = cycle(t, e, 10, nil)
	assert.Equal(t, []string{"b2"}, payloads(got), "a2 must wait behind the tried head a1; b is not held back")
	got = cycle(t, e, 10, nil)
	assert.Empty(t, payloads(got), "nothing of key a may be delivered while its head waits")
	s := stateOf(t, pool, ob, "a1")
	assert.Equal(t, 1, s.attempts)
	assert.Equal(t, "pending", s.status)
}

func TestFetch_RunLengthOneAdvancesOneHeadPerKeyPerCycle(t *testing.T) {
	t.Parallel()
	pool, ob := newOutbox(t)
	for i := 1; i <= 3; i++ {
		enqueue(t, pool, ob, "t", event("a", fmt.Sprintf("a%d", i)), event("b", fmt.Sprintf("b%d", i)))
	}
	e := testEngine(pool, ob, "w1", 1)
	for i := 1; i <= 3; i++ {
		got := cycle(t, e, 10, nil)
		assert.ElementsMatch(t, []string{fmt.Sprintf("a%d", i), fmt.Sprintf("b%d", i)}, payloads(got), "cycle %d", i)
	}
	assert.Empty(t, cycle(t, e, 10, nil))
}

func TestFetch_DelayedNeverTriedEventDoesNotBlockItsKey(t *testing.T) {
	t.Parallel()
	pool, ob := newOutbox(t)
	reminder := event("k", "reminder")
	SetDeliverAt(reminder, time.Now().Add(time.Hour))
	enqueue(t, pool, ob, "t", reminder, event("k", "next"))
	e := testEngine(pool, ob, "w1", 16)
	got := cycle(t, e, 10, nil)
	assert.Equal(t, []string{"next"}, payloads(got), "a delayed event never tried must not hold its key")
	assert.Equal(t, "pending", stateOf(t, pool, ob, "reminder").status)
	var ready time.Time
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT ready_at FROM `+ob.q.table.derived("_lanes").quoted()).Scan(&ready))
	assert.WithinDuration(t, time.Now().Add(time.Hour), ready, time.Minute, "the lane sleeps until the delayed event is due")
}

func TestFetch_TerminallyFailedEventDoesNotBlock_UnlessBlockPolicy(t *testing.T) {
	t.Parallel()
	for _, block := range []bool{false, true} {
		t.Run(fmt.Sprintf("block=%v", block), func(t *testing.T) {
			t.Parallel()
			pool, ob := newOutbox(t)
			enqueue(t, pool, ob, "t", event("k", "first"), event("k", "second"))
			e := testEngine(pool, ob, "w1", 16)
			e.block = block
			got := cycle(t, e, 10, failWith(bus.ClassPermanent, time.Time{}))
			require.Equal(t, []string{"first"}, payloads(got))
			assert.Equal(t, "failed", stateOf(t, pool, ob, "first").status)
			got = cycle(t, e, 10, nil)
			if block {
				assert.Empty(t, payloads(got), "with FailedBlock the key stays frozen behind its failed row")
				var blocked bool
				require.NoError(t, pool.QueryRow(context.Background(), `SELECT blocked FROM `+ob.q.table.derived("_lanes").quoted()).Scan(&blocked))
				assert.True(t, blocked, "the lane is marked blocked")
			} else {
				assert.Equal(t, []string{"second"}, payloads(got), "a failed row does not hold its key")
			}
		})
	}
}

func TestFetch_TwoRelays_SecondGetsOnlyOtherKeys(t *testing.T) {
	t.Parallel()
	pool, ob := newOutbox(t)
	enqueue(t, pool, ob, "t", event("k", "k1"), event("k", "k2"), event("o", "o1"))
	r1 := testEngine(pool, ob, "relay-1", 1)
	r2 := testEngine(pool, ob, "relay-2", 16)
	ctx := context.Background()
	res1, err := r1.fetch(ctx, AllTopics, 1, 0)
	require.NoError(t, err)
	require.Len(t, res1.units, 1)
	held := res1.units[0].rows[0]
	require.Equal(t, "k1", string(held.payload), "relay 1 takes the oldest lane's head")

	res2, err := r2.fetch(ctx, AllTopics, 10, 10)
	require.NoError(t, err)
	var got []string
	for _, u := range res2.units {
		got = append(got, payloads(u.rows)...)
	}
	assert.Equal(t, []string{"o1"}, got, "while relay 1 holds k's head, k2 is not eligible for relay 2")
}

func TestFetch_BusyRelay_RejectedRowSpendsOneAttemptPerRetryTime(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		base       time.Duration
		wantStatus string
		wantTries  int
	}{
		{"default base", 0, "pending", 1},
		{"base zero", middleware.NoDelay, "failed", 6},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pool, ob := newOutbox(t)
			retry, err := middleware.NewRetry(middleware.RetryConfig{Base: tc.base}, nil)
			require.NoError(t, err)
			// Plenty of other work keeps the relay busy every cycle.
			for i := 0; i < 6; i++ {
				enqueue(t, pool, ob, "t", event(fmt.Sprintf("busy-%d", i), "busy"))
			}
			enqueue(t, pool, ob, "t", event("bad", "bad"))
			e := testEngine(pool, ob, "w1", 1)
			var failedAt time.Time
			for c := 0; c < 6; c++ {
				enqueue(t, pool, ob, "t", event(fmt.Sprintf("more-%d", c), "busy"))
				cycle(t, e, 100, func(r row) *settleOp {
					if string(r.payload) != "bad" {
						return nil
					}
					failedAt = time.Now()
					st := retry.Decide(bus.Delivery{Attempts: r.attempts, MaxAttempts: r.maxAttempts}, fmt.Errorf("rejected"), failedAt)
					op := &settleOp{op: 'n', inc: 1, giveUp: st.GiveUp, err: st.Error}
					if !st.RetryAt.IsZero() {
						op.retryAt = &st.RetryAt
					}
					return op
				})
			}
			s := stateOf(t, pool, ob, "bad")
			assert.Equal(t, tc.wantStatus, s.status)
			assert.Equal(t, tc.wantTries, s.attempts)
			if tc.wantStatus == "pending" {
				assert.GreaterOrEqual(t, s.scheduledAt.Sub(failedAt), 5*time.Second-time.Millisecond,
					"the next try of a row failed once with base 10 s is at least 5 s away")
			}
		})
	}
}

func TestSettle_FailureWithoutRetryTimeKeepsSchedule(t *testing.T) {
	t.Parallel()
	pool, ob := newOutbox(t)
	enqueue(t, pool, ob, "t", event("k", "x"))
	e := testEngine(pool, ob, "w1", 1)
	before := stateOf(t, pool, ob, "x").scheduledAt
	got := cycle(t, e, 10, failWith(bus.ClassCounted, time.Time{}))
	require.Len(t, got, 1)
	s := stateOf(t, pool, ob, "x")
	assert.True(t, before.Equal(s.scheduledAt), "scheduled_at kept: %s → %s", before, s.scheduledAt)
	assert.Equal(t, 1, s.attempts)
	assert.Equal(t, "boom", *s.lastError)
}

func TestSettle_TransientSpendsNoAttempt(t *testing.T) {
	t.Parallel()
	pool, ob := newOutbox(t)
	enqueue(t, pool, ob, "t", event("k", "x"))
	e := testEngine(pool, ob, "w1", 1)
	cycle(t, e, 10, failWith(bus.ClassTransient, time.Now().Add(time.Hour)))
	s := stateOf(t, pool, ob, "x")
	assert.Equal(t, 0, s.attempts)
	assert.Equal(t, "pending", s.status)
	assert.NotNil(t, s.lastError, "a transient failure still marks the row as tried")
}

func TestSettle_GuardedByLease(t *testing.T) {
	t.Parallel()
	pool, ob := newOutbox(t)
	enqueue(t, pool, ob, "t", event("k", "x"))
	e := testEngine(pool, ob, "w1", 1)
	res, err := e.fetch(context.Background(), AllTopics, 1, 1)
	require.NoError(t, err)
	thief := testEngine(pool, ob, "w2", 1)
	n, err := thief.settle(context.Background(), []settleOp{res.units[0].rows[0].settle('a')})
	require.NoError(t, err)
	assert.Zero(t, n, "a worker that does not hold the lease must not settle the row")
	assert.Equal(t, "pending", stateOf(t, pool, ob, "x").status)
}

func TestRuns_StopAtFirstFailureAndReleaseTheRest(t *testing.T) {
	t.Parallel()
	pool, ob := newOutbox(t)
	for i := 1; i <= 5; i++ {
		enqueue(t, pool, ob, "t", event("k", fmt.Sprintf("r%d", i)))
	}
	e := testEngine(pool, ob, "w1", 16)
	got := cycle(t, e, 10, func(r row) *settleOp {
		if string(r.payload) == "r3" {
			return failWith(bus.ClassCounted, time.Now().Add(time.Hour))(r)
		}
		return nil
	})
	assert.Equal(t, []string{"r1", "r2", "r3"}, payloads(got), "the run is emitted in order and stops at its failing member")
	for _, p := range []string{"r4", "r5"} {
		s := stateOf(t, pool, ob, p)
		assert.Equal(t, 0, s.attempts, "%s was released without spending an attempt", p)
		assert.Nil(t, s.lockedBy, "%s was released", p)
		assert.Nil(t, s.lastError)
	}
	assert.Empty(t, cycle(t, e, 10, nil), "r4 and r5 wait behind r3")
}

func TestRuns_StopAtRowInLineButNotDue(t *testing.T) {
	t.Parallel()
	pool, ob := newOutbox(t)
	for i := 1; i <= 4; i++ {
		enqueue(t, pool, ob, "t", event("k", fmt.Sprintf("r%d", i)))
	}
	// r3 was tried and waits for its retry: it is in line but not due.
	_, err := pool.Exec(context.Background(), `UPDATE `+ob.q.table.quoted()+`
		SET last_error = 'earlier failure', attempts = 1, scheduled_at = now() + interval '1 hour' WHERE payload = 'r3'`)
	require.NoError(t, err)
	e := testEngine(pool, ob, "w1", 16)
	got := cycle(t, e, 10, nil)
	assert.Equal(t, []string{"r1", "r2"}, payloads(got), "the run stops before the tried row r3")
	assert.Empty(t, cycle(t, e, 10, nil), "r4 stays behind r3")
}

func TestRuns_OneKeyDrainsInFewCycles(t *testing.T) {
	t.Parallel()
	pool, ob := newOutbox(t)
	const n = 1000
	msgs := make([]*message.Message, n)
	for i := range msgs {
		msgs[i] = event("hot", fmt.Sprintf("%04d", i))
	}
	enqueue(t, pool, ob, "t", msgs...)
	e := testEngine(pool, ob, "w1", DefaultRunLength)
	var (
		cycles int
		got    []string
	)
	for len(got) < n && cycles < 2*n {
		got = append(got, payloads(cycle(t, e, 100, nil))...)
		cycles++
	}
	require.Len(t, got, n)
	for i, p := range got {
		require.Equal(t, fmt.Sprintf("%04d", i), p, "delivery %d out of order", i)
	}
	limit := int(math.Ceil(float64(n)/float64(DefaultRunLength))) + 2
	assert.LessOrEqual(t, cycles, limit, "1000 events of one key must drain in at most ceil(1000/RunLength)+2 cycles")
}

func TestFetch_CrashedRelaysRowsGoToAnotherAfterLeaseExpiry(t *testing.T) {
	t.Parallel()
	pool, ob := newOutbox(t)
	enqueue(t, pool, ob, "t", event("k", "k1"), event("k", "k2"), event("k", "k3"))
	crashed := testEngine(pool, ob, "crashed", 16)
	crashed.lease = time.Second
	res, err := crashed.fetch(context.Background(), AllTopics, 10, 10)
	require.NoError(t, err)
	require.Len(t, res.units, 1)
	require.Len(t, res.units[0].rows, 3)
	// The crashed relay never settles. Another relay gets nothing until the lease expires.
	other := testEngine(pool, ob, "other", 16)
	assert.Empty(t, cycle(t, other, 10, nil), "rows leased by a live relay are not handed out")
	var got []string
	testenv.Eventually(t, 10*time.Second, func() bool {
		got = append(got, payloads(cycle(t, other, 10, nil))...)
		return len(got) >= 3
	}, "the crashed relay's lease to expire and the rows to be delivered")
	assert.Equal(t, []string{"k1", "k2", "k3"}, got, "taken over in order")
}

// A keyed row is not written to when it is handed out: its lane's lease
// covers it (migration 0010), so an event leaves one version behind its
// insert (its settlement) instead of two. An unkeyed row gets a lease of its
// own, which changes no indexed column, so on a page with room (fillfactor
// 70) it is a HOT update: no index gets an entry for it. The pick also
// decides there whether a row's attempts are spent, and gives a leased row
// its own status back; PostgreSQL compares values, so that keeps it HOT too.
func TestFetch_KeyedRowsAreNotWrittenAndLeasesAreHOT(t *testing.T) {
	t.Parallel()
	pool, ob := newOutbox(t)
	var msgs []*message.Message
	for i := range 20 {
		key := ""
		if i%2 == 0 {
			key = fmt.Sprintf("k%d", i%4)
		}
		msgs = append(msgs, event(key, fmt.Sprintf("e%d", i)))
	}
	enqueue(t, pool, ob, "t", msgs...)
	e := testEngine(pool, ob, "w1", 16)
	res, err := e.fetch(context.Background(), AllTopics, 10, 10)
	require.NoError(t, err)
	handed, own := 0, 0
	for _, u := range res.units {
		for _, r := range u.rows {
			handed++
			assert.Equal(t, u.lane == nil, r.own, "%s: only an unkeyed row has a lease of its own", r.payload)
			if r.own {
				own++
			}
		}
	}
	require.Equal(t, 20, handed)
	require.Equal(t, 10, own)
	for i := 0; i < 20; i += 2 {
		s := stateOf(t, pool, ob, fmt.Sprintf("e%d", i))
		assert.Nil(t, s.lockedBy, "e%d: a keyed row handed out is not written to", i)
		assert.Zero(t, s.attempts, "e%d", i)
	}
	// The counters of the table and, in the partitioned layout, its
	// partitions; a backend reports them within a second or so of going idle.
	var updates, hot int64
	testenv.Eventually(t, 15*time.Second, func() bool {
		require.NoError(t, pool.QueryRow(context.Background(), `
SELECT coalesce(sum(s.n_tup_upd), 0)::bigint, coalesce(sum(s.n_tup_hot_upd), 0)::bigint
FROM pg_stat_user_tables s
WHERE s.relid = $1::regclass OR s.relid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = $1::regclass)`,
			ob.q.table.quoted()).Scan(&updates, &hot))
		return updates >= 10
	}, "the leases' updates to reach the statistics")
	assert.Equal(t, int64(10), updates, "one update per unkeyed row, none per keyed row")
	assert.Equal(t, updates, hot, "every lease is a HOT update")
}

// A fetch writes each lane it takes once: Pick leases it and notes its run
// in one write, as a key's next run renews the lease and extends the run in
// one. (LeaseLanes and KeepLane wrote the lease first, and Pick the run
// again: two versions of every lane per fetch and per next run.)
func TestFetch_WritesEachLaneOnce(t *testing.T) {
	t.Parallel()
	pool, ob := newOutbox(t)
	ctx := context.Background()
	var msgs []*message.Message
	for i := range 12 {
		msgs = append(msgs, event(fmt.Sprintf("k%d", i%3), fmt.Sprintf("e%d", i)))
	}
	enqueue(t, pool, ob, "t", msgs...)
	e := testEngine(pool, ob, "w1", 2)
	res, err := e.fetch(ctx, AllTopics, 10, 0)
	require.NoError(t, err)
	require.Len(t, res.units, 3, "one run of each key")
	u := res.units[0]
	require.Len(t, u.rows, 2)
	next, err := e.next(ctx, *u.lane, u.rows[len(u.rows)-1].id, nil)
	require.NoError(t, err)
	require.Len(t, next.units, 1, "the key's next run")
	assert.Greater(t, next.units[0].rows[0].id, u.rows[len(u.rows)-1].id, "the next run follows the first")

	var lockedBy, runBy string
	var runEnd int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT locked_by, run_by, run_end FROM `+ob.q.table.derived("_lanes").quoted()+`
		WHERE partition_key = $1`, *u.rows[0].partitionKey).Scan(&lockedBy, &runBy, &runEnd))
	assert.Equal(t, "w1", lockedBy, "the lane is leased")
	assert.Equal(t, "w1", runBy, "its run is noted")
	assert.Equal(t, next.units[0].rows[len(next.units[0].rows)-1].id, runEnd, "the run ends at the next run's last row")

	// Three lanes leased with their runs, then one renewed with its next run:
	// four writes. The backend reports its counters within a second or so of
	// going idle.
	var updates int64
	testenv.Eventually(t, 15*time.Second, func() bool {
		require.NoError(t, pool.QueryRow(ctx, `SELECT coalesce(max(n_tup_upd), 0)::bigint FROM pg_stat_user_tables WHERE relid = $1::regclass`,
			ob.q.table.derived("_lanes").quoted()).Scan(&updates))
		return updates >= 4
	}, "the lanes' updates to reach the statistics")
	assert.Equal(t, int64(4), updates, "one write per lane taken and per next run")
}
