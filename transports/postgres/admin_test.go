package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/internal/testenv"
)

// adminFixture is an outbox table with its Admin.
type adminFixture struct {
	t     *testing.T
	pool  *pgxpool.Pool
	ob    *Outbox
	admin *Admin
}

func newAdminFixture(t *testing.T) *adminFixture {
	t.Helper()
	pool, ob := newOutbox(t)
	a, err := NewAdmin(pool, OutboxTable(ob.Table()))
	require.NoError(t, err)
	return &adminFixture{t: t, pool: pool, ob: ob, admin: a}
}

// exec runs sql with {T} and {L} standing for the table and its lanes.
func (f *adminFixture) exec(sql string, args ...any) int64 {
	f.t.Helper()
	tag, err := f.pool.Exec(context.Background(), f.sql(sql), args...)
	require.NoError(f.t, err, sql)
	return tag.RowsAffected()
}

// backdate runs sql, an UPDATE that changes created_at. The partitioned
// layout refuses that (created_at chooses the partition: moving a row would
// run the dedup and lane triggers again), so there it runs with the table's
// triggers off, as only a test may.
func (f *adminFixture) backdate(sql string) {
	f.t.Helper()
	if !testPartitioned() {
		f.exec(sql)
		return
	}
	ctx := context.Background()
	tx, err := f.pool.Begin(ctx)
	require.NoError(f.t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	for _, s := range []string{`ALTER TABLE {T} DISABLE TRIGGER USER`, sql, `ALTER TABLE {T} ENABLE TRIGGER USER`} {
		_, err := tx.Exec(ctx, f.sql(s))
		require.NoError(f.t, err, s)
	}
	require.NoError(f.t, tx.Commit(ctx))
}

func (f *adminFixture) sql(s string) string {
	return strings.NewReplacer("{T}", f.ob.q.table.quoted(), "{L}", f.ob.q.table.derived("_lanes").quoted()).Replace(s)
}

// id returns the id of the row with payload p.
func (f *adminFixture) id(p string) int64 {
	f.t.Helper()
	var id int64
	require.NoError(f.t, f.pool.QueryRow(context.Background(), f.sql(`SELECT id FROM {T} WHERE payload = $1`), []byte(p)).Scan(&id))
	return id
}

// lane reads the lane of key in topic "t"; ok is false when there is none.
func (f *adminFixture) lane(key string) (blocked, ok bool) {
	f.t.Helper()
	err := f.pool.QueryRow(context.Background(),
		f.sql(`SELECT blocked FROM {L} WHERE topic = 't' AND partition_key = $1`), key).Scan(&blocked)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, false
	}
	require.NoError(f.t, err)
	return blocked, true
}

// laneReadyNow reports whether key's lane exists and is ready at the
// database's now.
func (f *adminFixture) laneReadyNow(key string) bool {
	f.t.Helper()
	var ready bool
	err := f.pool.QueryRow(context.Background(),
		f.sql(`SELECT ready_at <= now() AND NOT blocked FROM {L} WHERE topic = 't' AND partition_key = $1`), key).Scan(&ready)
	if errors.Is(err, pgx.ErrNoRows) {
		return false
	}
	require.NoError(f.t, err)
	return ready
}

func (f *adminFixture) statuses() map[string]string {
	f.t.Helper()
	rows, err := f.pool.Query(context.Background(), f.sql(`SELECT convert_from(payload, 'UTF8'), status FROM {T}`))
	require.NoError(f.t, err)
	out := map[string]string{}
	for rows.Next() {
		var p, s string
		require.NoError(f.t, rows.Scan(&p, &s))
		out[p] = s
	}
	require.NoError(f.t, rows.Err())
	return out
}

// fail marks the rows with these payloads failed, as a relay would have.
func (f *adminFixture) fail(payloads ...string) {
	f.t.Helper()
	for _, p := range payloads {
		n := f.exec(`UPDATE {T} SET status = 'failed', attempts = 6, last_error = 'boom: ' || convert_from(payload, 'UTF8')
			WHERE payload = $1`, []byte(p))
		require.EqualValues(f.t, 1, n, "fail %q", p)
	}
}

func TestAdmin_StatsMatchTheTable(t *testing.T) {
	t.Parallel()
	f := newAdminFixture(t)
	ctx := context.Background()

	s, err := f.admin.Stats(ctx)
	require.NoError(t, err)
	assert.Equal(t, Stats{}, s, "an empty table has all-zero stats, OldestPendingAge 0 included")

	enqueue(t, f.pool, f.ob, "t",
		event("held", "held-1"), event("held", "held-2"), // head tried, retry in an hour: key held
		event("failed", "failed-1"), event("failed", "failed-2"), // failed head does not hold its key
		event("leased", "leased-1"),                                  // live lease
		event("expired", "expired-1"),                                // lease expired
		event("delayed", "delayed-1"), event("delayed", "delayed-2"), // delayed, never tried: does not hold
		event("blocked", "blocked-1"),            // lane blocked by the Block policy
		event("", "done-1"), event("", "done-2"), // completed, unkeyed
		event("", "loose-1"), // unkeyed, due, created two hours ago
	)
	f.exec(`UPDATE {T} SET attempts = 1, last_error = 'boom', scheduled_at = now() + interval '1 hour' WHERE payload = 'held-1'`)
	f.fail("failed-1")
	f.exec(`UPDATE {T} SET locked_by = 'w', locked_until = now() + interval '1 minute' WHERE payload = 'leased-1'`)
	f.exec(`UPDATE {T} SET locked_by = 'w', locked_until = now() - interval '1 minute' WHERE payload = 'expired-1'`)
	f.exec(`UPDATE {T} SET scheduled_at = now() + interval '1 hour' WHERE payload = 'delayed-1'`)
	takeNotes(t, f.pool, f.ob.q)
	f.exec(`UPDATE {L} SET blocked = true, ready_at = 'infinity' WHERE partition_key = 'blocked'`)
	f.exec(`UPDATE {T} SET status = 'completed', completed_at = now() WHERE payload IN ('done-1', 'done-2')`)
	f.backdate(`UPDATE {T} SET created_at = now() - interval '2 hours' WHERE payload = 'loose-1'`)

	s, err = f.admin.Stats(ctx)
	require.NoError(t, err)
	age := s.OldestPendingAge
	s.OldestPendingAge = 0
	assert.Equal(t, Stats{
		// held-1, held-2, failed-2, leased-1, expired-1, delayed-1, delayed-2, blocked-1, loose-1
		Pending: 9,
		// held-2, failed-2, expired-1, delayed-2, blocked-1, loose-1
		Due:           6,
		Leased:        1,
		ExpiredLeases: 1,
		Failed:        1,
		Completed:     2,
		Lanes:         6, // held, failed, leased, expired, delayed, blocked
		HeldKeys:      1, // held
		BlockedKeys:   1, // blocked
	}, s)
	assert.GreaterOrEqual(t, age, 2*time.Hour, "the oldest pending row was created two hours ago")
	assert.Less(t, age, 2*time.Hour+time.Minute, "the oldest pending row was created two hours ago")
}

func TestAdmin_ListFailedPaginatesInIDOrder(t *testing.T) {
	t.Parallel()
	f := newAdminFixture(t)
	ctx := context.Background()
	var names []string
	for i := range 8 {
		msg := event(fmt.Sprintf("k%d", i%3), fmt.Sprintf("e%d", i))
		bus.SetEventType(msg, "order.paid")
		enqueue(t, f.pool, f.ob, "t", msg)
		names = append(names, fmt.Sprintf("e%d", i))
	}
	enqueue(t, f.pool, f.ob, "t", event("", "unkeyed"))
	f.fail("e0", "e2", "e3", "e5", "e7", "unkeyed")

	var got []string
	var after int64
	pages := 0
	for {
		page, err := f.admin.ListFailed(ctx, 2, after)
		require.NoError(t, err)
		if len(page) == 0 {
			break
		}
		require.LessOrEqual(t, len(page), 2, "a page holds at most limit rows")
		for _, r := range page {
			require.Greater(t, r.ID, after, "rows come in id order after afterID")
			after = r.ID
			got = append(got, strings.TrimPrefix(r.LastError, "boom: "))
		}
		pages++
	}
	assert.Equal(t, []string{"e0", "e2", "e3", "e5", "e7", "unkeyed"}, got, "every failed row once, in id order")
	assert.Equal(t, 3, pages)

	all, err := f.admin.ListFailed(ctx, 0, 0)
	require.NoError(t, err)
	require.Len(t, all, 6, "limit 0 means the default limit")
	r := all[1]
	var eventID string
	require.NoError(t, f.pool.QueryRow(ctx, f.sql(`SELECT event_id::text FROM {T} WHERE payload = 'e2'`)).Scan(&eventID))
	assert.Equal(t, f.id("e2"), r.ID)
	assert.Equal(t, eventID, r.EventID)
	assert.Equal(t, "", r.ConsumerGroup)
	assert.Equal(t, "t", r.Topic)
	assert.Equal(t, "k2", r.PartitionKey)
	assert.Equal(t, "order.paid", r.EventType)
	assert.Equal(t, 6, r.Attempts)
	assert.Equal(t, DefaultMaxAttempts, r.MaxAttempts)
	assert.Equal(t, "boom: e2", r.LastError)
	assert.WithinDuration(t, time.Now(), r.CreatedAt, time.Minute)
	assert.Equal(t, "", all[5].PartitionKey, "an unkeyed row has no partition key")
	assert.Equal(t, "", all[5].EventType)
}

func TestAdmin_RequeueOneMakesItPendingAndItsLaneReady(t *testing.T) {
	t.Parallel()
	f := newAdminFixture(t)
	ctx := context.Background()
	enqueue(t, f.pool, f.ob, "t", event("k", "first"), event("other", "pending"))
	f.fail("first")
	// The relay deleted the lane when the key ran out of pending rows.
	f.exec(`DELETE FROM {L} WHERE partition_key = 'k'`)

	require.NoError(t, f.admin.Requeue(ctx, f.id("first")))

	var (
		status    string
		attempts  int
		lastError *string
		due       bool
		lockedBy  *string
	)
	require.NoError(t, f.pool.QueryRow(ctx, f.sql(`SELECT status, attempts, last_error, scheduled_at <= now(), locked_by
		FROM {T} WHERE payload = 'first'`)).Scan(&status, &attempts, &lastError, &due, &lockedBy))
	assert.Equal(t, "pending", status)
	assert.Equal(t, 0, attempts, "a requeued row gets a fresh attempt budget")
	require.NotNil(t, lastError, "the last error is kept as the record of the failure")
	assert.Equal(t, "boom: first", *lastError)
	assert.True(t, due, "a requeued row is due now")
	assert.Nil(t, lockedBy)
	blocked, ok := f.lane("k")
	require.True(t, ok, "requeue must recreate the lane: an UPDATE does not fire the insert trigger")
	assert.False(t, blocked)
	assert.True(t, f.laneReadyNow("k"), "the lane is ready now")

	for name, id := range map[string]int64{"pending row": f.id("pending"), "requeued row": f.id("first"), "missing row": 1 << 40} {
		err := f.admin.Requeue(ctx, id)
		require.Error(t, err, name)
		assert.ErrorIs(t, err, ErrNotFound, "%s: requeue of a row that is not failed", name)
		assert.Contains(t, err.Error(), fmt.Sprintf("requeue %d in %q", id, f.ob.Table()))
	}
}

func TestAdmin_RequeueLiftsABlockedLane(t *testing.T) {
	t.Parallel()
	f := newAdminFixture(t)
	ctx := context.Background()
	enqueue(t, f.pool, f.ob, "t", event("k", "first"), event("k", "second"))
	e := testEngine(f.pool, f.ob, "w1", 16)
	e.block = true
	got := cycle(t, e, 10, failWith(bus.ClassPermanent, time.Time{}))
	require.Equal(t, []string{"first"}, payloads(got))
	require.Empty(t, payloads(cycle(t, e, 10, nil)), "precondition: the key is frozen behind its failed row")
	blocked, ok := f.lane("k")
	require.True(t, ok)
	require.True(t, blocked, "precondition: the lane is blocked")

	require.NoError(t, f.admin.Requeue(ctx, f.id("first")))
	blocked, ok = f.lane("k")
	require.True(t, ok)
	assert.False(t, blocked, "requeue unblocks the lane")
	assert.Equal(t, []string{"first", "second"}, payloads(cycle(t, e, 10, nil)),
		"the requeued head goes out again, then the row it held back, in order")
}

func TestAdmin_RequeuedRowIsDeliverableAgain(t *testing.T) {
	t.Parallel()
	f := newAdminFixture(t)
	ctx := context.Background()
	enqueue(t, f.pool, f.ob, "t", event("k", "first"), event("k", "second"), event("", "loose"))
	e := testEngine(f.pool, f.ob, "w1", 16)
	failFirst := func(r row) *settleOp {
		if p := string(r.payload); p == "first" || p == "loose" {
			return failWith(bus.ClassPermanent, time.Time{})(r)
		}
		return nil
	}
	got := payloads(cycle(t, e, 10, failFirst))
	require.ElementsMatch(t, []string{"first", "loose"}, got)
	require.Equal(t, []string{"second"}, payloads(cycle(t, e, 10, nil)), "a failed row does not hold its key")
	require.Empty(t, payloads(cycle(t, e, 10, nil)))
	_, ok := f.lane("k")
	require.False(t, ok, "precondition: the relay deleted the drained lane")

	n, err := f.admin.RequeueAllFailed(ctx, 10, nil)
	require.NoError(t, err)
	require.EqualValues(t, 2, n)
	require.True(t, f.laneReadyNow("k"), "the requeued row's lane exists and is ready now")

	assert.ElementsMatch(t, []string{"first", "loose"}, payloads(cycle(t, e, 10, nil)),
		"requeued rows, keyed and unkeyed, are delivered on the next fetch")
	assert.Equal(t, map[string]string{"first": "completed", "second": "completed", "loose": "completed"}, f.statuses())
}

func TestAdmin_RequeueAllFailedInBatchesWithProgress(t *testing.T) {
	t.Parallel()
	f := newAdminFixture(t)
	ctx := context.Background()
	enqueue(t, f.pool, f.ob, "t",
		event("a", "a1"), event("a", "a2"), event("b", "b1"), event("c", "c1"),
		event("", "u1"), event("", "u2"), event("d", "d1"), event("", "done"), event("e", "pending"))
	f.fail("a1", "a2", "b1", "c1", "u1", "u2", "d1")
	f.exec(`UPDATE {T} SET status = 'completed', completed_at = now() WHERE payload = 'done'`)
	takeNotes(t, f.pool, f.ob.q)
	f.exec(`DELETE FROM {L} WHERE partition_key <> 'e'`) // keys without pending rows have no lane

	var calls []int64
	n, err := f.admin.RequeueAllFailed(ctx, 3, func(done int64) { calls = append(calls, done) })
	require.NoError(t, err)
	assert.EqualValues(t, 7, n)
	assert.Equal(t, []int64{3, 6, 7}, calls, "one progress call per batch of 3, with the running total")
	assert.Equal(t, map[string]string{
		"a1": "pending", "a2": "pending", "b1": "pending", "c1": "pending", "u1": "pending", "u2": "pending",
		"d1": "pending", "done": "completed", "pending": "pending",
	}, f.statuses())
	for _, k := range []string{"a", "b", "c", "d", "e"} {
		assert.True(t, f.laneReadyNow(k), "lane %q exists and is ready", k)
	}
	var attempts int
	require.NoError(t, f.pool.QueryRow(ctx, f.sql(`SELECT sum(attempts) FROM {T}`)).Scan(&attempts))
	assert.Zero(t, attempts, "every requeued row starts a fresh budget")

	calls = nil
	n, err = f.admin.RequeueAllFailed(ctx, 3, func(done int64) { calls = append(calls, done) })
	require.NoError(t, err)
	assert.Zero(t, n, "nothing is failed any more")
	assert.Empty(t, calls)
}

// A writer's business transaction holds no lock a requeue waits for: the
// requeue goes through while the writer of the same key is still open (on
// the earlier lanes design it waited for the writer's lane insert and
// retried), and the key then delivers both rows in id order.
func TestAdmin_RequeueDoesNotWaitForAWriterOfTheKey(t *testing.T) {
	t.Parallel()
	f := newAdminFixture(t)
	ctx := context.Background()
	enqueue(t, f.pool, f.ob, "t", event("k", "failed"), event("j", "other"))
	f.fail("failed")
	takeNotes(t, f.pool, f.ob.q)
	f.exec(`DELETE FROM {L} WHERE partition_key = 'k'`)

	writer, err := f.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = writer.Rollback(ctx) }()
	require.NoError(t, f.ob.Enqueue(ctx, writer, "t", event("k", "written")))

	var retries atomic.Int64
	f.admin.lockTimeout = 20 * time.Millisecond
	f.admin.onLockRetry = func(error) { retries.Add(1) }
	n, err := f.admin.RequeueAllFailed(ctx, 10, nil)
	require.NoError(t, err)
	assert.EqualValues(t, 1, n)
	assert.Zero(t, retries.Load(), "the requeue never waited for the open writer")
	assert.True(t, f.laneReadyNow("k"))
	require.NoError(t, writer.Commit(ctx))

	e := testEngine(f.pool, f.ob, "relay", 16)
	var got []string
	for c := 0; c < 5; c++ {
		for _, r := range cycle(t, e, 10, nil) {
			if deref(r.partitionKey) == "k" {
				got = append(got, string(r.payload))
			}
		}
	}
	assert.Equal(t, []string{"failed", "written"}, got, "the key delivers the requeued row, then the writer's")
}

func TestAdmin_ReleaseExpiredLeases(t *testing.T) {
	t.Parallel()
	f := newAdminFixture(t)
	ctx := context.Background()
	enqueue(t, f.pool, f.ob, "t", event("dead", "dead-1"), event("live", "live-1"), event("", "loose"))
	f.exec(`UPDATE {T} SET locked_by = 'crashed', locked_until = now() - interval '1 second' WHERE payload IN ('dead-1', 'loose')`)
	f.exec(`UPDATE {T} SET locked_by = 'alive', locked_until = now() + interval '1 minute' WHERE payload = 'live-1'`)
	takeNotes(t, f.pool, f.ob.q)
	f.exec(`UPDATE {L} SET locked_by = 'crashed', locked_until = now() - interval '1 second' WHERE partition_key = 'dead'`)
	f.exec(`UPDATE {L} SET locked_by = 'alive', locked_until = now() + interval '1 minute' WHERE partition_key = 'live'`)

	rows, lanes, err := f.admin.ReleaseExpiredLeases(ctx)
	require.NoError(t, err)
	assert.EqualValues(t, 2, rows)
	assert.EqualValues(t, 1, lanes)

	leaseOf := func(table, where string) *string {
		var by *string
		require.NoError(t, f.pool.QueryRow(ctx, f.sql(`SELECT locked_by FROM `+table+` WHERE `+where)).Scan(&by))
		return by
	}
	assert.Nil(t, leaseOf("{T}", "payload = 'dead-1'"), "an expired row lease is cleared")
	assert.Nil(t, leaseOf("{T}", "payload = 'loose'"), "an expired row lease is cleared")
	assert.Nil(t, leaseOf("{L}", "partition_key = 'dead'"), "an expired lane lease is cleared")
	if by := leaseOf("{T}", "payload = 'live-1'"); assert.NotNil(t, by, "a live row lease is kept") {
		assert.Equal(t, "alive", *by)
	}
	if by := leaseOf("{L}", "partition_key = 'live'"); assert.NotNil(t, by, "a live lane lease is kept") {
		assert.Equal(t, "alive", *by)
	}
	s, err := f.admin.Stats(ctx)
	require.NoError(t, err)
	assert.Zero(t, s.ExpiredLeases)
	assert.EqualValues(t, 1, s.Leased)

	rows, lanes, err = f.admin.ReleaseExpiredLeases(ctx)
	require.NoError(t, err)
	assert.Zero(t, rows+lanes, "nothing left to release")
}

func TestAdmin_CleanupDeletesOnlyOldCompletedRowsInBatches(t *testing.T) {
	t.Parallel()
	f := newAdminFixture(t)
	ctx := context.Background()
	for i := range 5 {
		enqueue(t, f.pool, f.ob, "t", event("", fmt.Sprintf("old-%d", i)))
	}
	enqueue(t, f.pool, f.ob, "t", event("", "recent-1"), event("", "recent-2"), event("k", "failed"), event("k", "pending"))
	f.exec(`UPDATE {T} SET status = 'completed', completed_at = now() - interval '2 hours' WHERE convert_from(payload, 'UTF8') LIKE 'old-%'`)
	f.exec(`UPDATE {T} SET status = 'completed', completed_at = now() - interval '1 minute' WHERE convert_from(payload, 'UTF8') LIKE 'recent-%'`)
	f.fail("failed")
	f.backdate(`UPDATE {T} SET created_at = now() - interval '1 day', completed_at = now() - interval '1 day' WHERE payload IN ('failed', 'pending')`)

	canceled, cancel := context.WithCancel(ctx)
	cancel()
	n, err := f.admin.Cleanup(canceled, time.Hour, 2, nil)
	require.ErrorIs(t, err, context.Canceled)
	assert.Zero(t, n)
	require.Len(t, f.statuses(), 9, "a canceled cleanup deletes nothing")

	n, err = f.admin.CountCompletedOlderThan(ctx, time.Hour)
	require.NoError(t, err)
	assert.EqualValues(t, 5, n, "CountCompletedOlderThan counts what Cleanup is about to delete")
	n, err = f.admin.CountCompletedOlderThan(ctx, 0)
	require.NoError(t, err)
	assert.EqualValues(t, 7, n, "retention 0 counts every completed row")

	var calls []int64
	n, err = f.admin.Cleanup(ctx, time.Hour, 2, func(deleted int64) { calls = append(calls, deleted) })
	require.NoError(t, err)
	assert.EqualValues(t, 5, n)
	assert.Equal(t, []int64{2, 4, 5}, calls, "batches of 2, with the running total")
	assert.Equal(t, map[string]string{
		"recent-1": "completed", "recent-2": "completed", "failed": "failed", "pending": "pending",
	}, f.statuses(), "only completed rows older than the retention are deleted")

	calls = nil
	n, err = f.admin.Cleanup(ctx, time.Hour, 2, func(deleted int64) { calls = append(calls, deleted) })
	require.NoError(t, err)
	assert.Zero(t, n)
	assert.Empty(t, calls)

	n, err = f.admin.Cleanup(ctx, 0, 100, nil)
	require.NoError(t, err)
	assert.EqualValues(t, 2, n, "retention 0 deletes every completed row")
	assert.Equal(t, map[string]string{"failed": "failed", "pending": "pending"}, f.statuses())
}

func TestAdmin_SweepRecreatesALaneDeletedByHand(t *testing.T) {
	t.Parallel()
	f := newAdminFixture(t)
	ctx := context.Background()
	enqueue(t, f.pool, f.ob, "t", event("k", "k1"), event("k", "k2"), event("j", "j1"), event("", "loose"))
	takeNotes(t, f.pool, f.ob.q)
	require.EqualValues(t, 1, f.exec(`DELETE FROM {L} WHERE partition_key = 'k'`))

	n, err := f.admin.SweepLanes(ctx)
	require.NoError(t, err)
	assert.EqualValues(t, 1, n, "one lane was missing")
	assert.True(t, f.laneReadyNow("k"), "the lane is back and ready")
	n, err = f.admin.SweepLanes(ctx)
	require.NoError(t, err)
	assert.Zero(t, n, "nothing missing the second time")

	e := testEngine(f.pool, f.ob, "w1", 16)
	assert.ElementsMatch(t, []string{"k1", "k2", "j1", "loose"}, payloads(cycle(t, e, 10, nil)))
}

func TestAdmin_RefusesBadArguments(t *testing.T) {
	t.Parallel()
	f := newAdminFixture(t)
	ctx := context.Background()
	enqueue(t, f.pool, f.ob, "t", event("k", "a"))
	f.exec(`UPDATE {T} SET status = 'completed', completed_at = now() - interval '1 day'`)

	_, err := NewAdmin(f.pool, OutboxTable("bad-name"))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "invalid config: Table:")
	_, err = NewAdmin(f.pool, Table{Name: "x.y.z"})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "invalid config: Table:")
	_, err = NewAdmin(nil, OutboxTable(""))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "invalid config: pool:")
	_, err = NewAdmin(f.pool, Table{Name: "x", Kind: Kind(7)})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "invalid config: Kind:")
	_, err = f.admin.WithConsumerGroup("g")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "consumer group")

	for _, c := range []struct {
		name, field string
		call        func() error
	}{
		{"negative limit", "limit", func() error { _, err := f.admin.ListFailed(ctx, -1, 0); return err }},
		{"negative afterID", "afterID", func() error { _, err := f.admin.ListFailed(ctx, 10, -1); return err }},
		{"zero id", "id", func() error { return f.admin.Requeue(ctx, 0) }},
		{"negative id", "id", func() error { return f.admin.Requeue(ctx, -3) }},
		{"zero requeue batch", "batch", func() error { _, err := f.admin.RequeueAllFailed(ctx, 0, nil); return err }},
		{"negative requeue batch", "batch", func() error { _, err := f.admin.RequeueAllFailed(ctx, -1, nil); return err }},
		{"negative retention", "olderThan", func() error { _, err := f.admin.Cleanup(ctx, -time.Second, 10, nil); return err }},
		{"zero cleanup batch", "batch", func() error { _, err := f.admin.Cleanup(ctx, time.Hour, 0, nil); return err }},
		{"negative cleanup batch", "batch", func() error { _, err := f.admin.Cleanup(ctx, time.Hour, -5, nil); return err }},
	} {
		err := c.call()
		require.Error(t, err, c.name)
		assert.Contains(t, err.Error(), c.field+":", "%s: the error names the argument", c.name)
		assert.NotErrorIs(t, err, ErrNotFound, c.name)
	}
	assert.Equal(t, map[string]string{"a": "completed"}, f.statuses(), "refused calls change nothing")
}

// newAdminInbox migrates a fresh inbox table for the test and drops it after.
func newAdminInbox(t *testing.T) (*pgxpool.Pool, tableName) {
	t.Helper()
	pool := testenv.Postgres(t)
	name := testenv.Name(t)
	require.NoError(t, Migrate(context.Background(), pool, InboxTable(name)))
	dropAfter(t, pool, name)
	tn, err := parseTableName(name)
	require.NoError(t, err)
	return pool, tn
}

func TestAdmin_InboxConsumerGroupFilter(t *testing.T) {
	t.Parallel()
	pool, tn := newAdminInbox(t)
	ctx := context.Background()
	T, L := tn.quoted(), tn.derived("_lanes").quoted()
	_, err := pool.Exec(ctx, `INSERT INTO `+T+` (message_id, consumer_group, event_id, topic, partition_key, payload)
		SELECT 'm' || i, g, gen_random_uuid(), 't', 'k', convert_to(g || i, 'UTF8')
		FROM generate_series(1, 3) i CROSS JOIN (VALUES ('billing'), ('shipping')) AS gs(g)`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE `+T+` SET status = 'failed', last_error = 'boom' WHERE message_id IN ('m1', 'm2')`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE `+T+` SET locked_by = 'w', locked_until = now() - interval '1 second'
		WHERE message_id = 'm3'`)
	require.NoError(t, err)
	takeNotes(t, pool, newQueries(tn, true))
	_, err = pool.Exec(ctx, `UPDATE `+L+` SET locked_by = 'w', locked_until = now() - interval '1 second'`)
	require.NoError(t, err)

	all, err := NewAdmin(pool, InboxTable(tn.String()))
	require.NoError(t, err)
	_, err = all.WithConsumerGroup("")
	require.Error(t, err, "an empty consumer group is refused")
	billing, err := all.WithConsumerGroup("billing")
	require.NoError(t, err)
	assert.Equal(t, "billing", billing.ConsumerGroup())
	assert.Equal(t, "", all.ConsumerGroup(), "WithConsumerGroup returns a copy")

	s, err := all.Stats(ctx)
	require.NoError(t, err)
	assert.Positive(t, s.OldestPendingAge)
	s.OldestPendingAge = 0
	assert.Equal(t, Stats{Pending: 2, Due: 2, ExpiredLeases: 2, Failed: 4, Lanes: 2}, s)
	s, err = billing.Stats(ctx)
	require.NoError(t, err)
	s.OldestPendingAge = 0
	assert.Equal(t, Stats{Pending: 1, Due: 1, ExpiredLeases: 1, Failed: 2, Lanes: 1}, s)

	failed, err := billing.ListFailed(ctx, 10, 0)
	require.NoError(t, err)
	require.Len(t, failed, 2)
	for _, r := range failed {
		assert.Equal(t, "billing", r.ConsumerGroup)
	}
	var shippingFailed int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT id FROM `+T+` WHERE consumer_group = 'shipping' AND message_id = 'm1'`).Scan(&shippingFailed))
	assert.ErrorIs(t, billing.Requeue(ctx, shippingFailed), ErrNotFound, "another group's row is out of reach")

	rows, lanes, err := billing.ReleaseExpiredLeases(ctx)
	require.NoError(t, err)
	assert.EqualValues(t, 1, rows)
	assert.EqualValues(t, 1, lanes)

	// The lanes are gone, as a relay leaves them once a key has no pending row.
	_, err = pool.Exec(ctx, `DELETE FROM `+L)
	require.NoError(t, err)
	n, err := billing.RequeueAllFailed(ctx, 1, nil)
	require.NoError(t, err)
	assert.EqualValues(t, 2, n)
	rs, err := pool.Query(ctx, `SELECT consumer_group FROM `+L+` WHERE ready_at <= now() ORDER BY 1`)
	require.NoError(t, err)
	laneGroups, err := pgx.CollectRows(rs, pgx.RowTo[string])
	require.NoError(t, err)
	assert.Equal(t, []string{"billing"}, laneGroups, "the requeued rows' lane is billing's")

	s, err = all.Stats(ctx)
	require.NoError(t, err)
	assert.EqualValues(t, 2, s.Failed, "shipping's failed rows are untouched")
	swept, err := all.SweepLanes(ctx)
	require.NoError(t, err)
	assert.EqualValues(t, 1, swept, "the sweep recreates shipping's lane")
}
