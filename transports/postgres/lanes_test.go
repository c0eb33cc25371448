package postgres

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The race the lanes design must win: a relay empties a key's lane (its last
// row completed) while a writer inserts the next row of that key. Whatever
// the interleaving, once both are done a pending row must have a lane, or a
// note its writer left that the next fetch turns into one.
//
// Both ways a lane is given back are raced: the lane's rows looked at first
// (drained false), and straight to the careful way (drained true: the
// relay's run was all acked and held every row in line).
func TestLanes_WriterRacingLaneDeletionIsNeverOrphaned(t *testing.T) {
	t.Parallel()
	for _, drained := range []bool{false, true} {
		t.Run(fmt.Sprintf("drained=%v", drained), func(t *testing.T) {
			t.Parallel()
			writerRacingLaneDeletion(t, drained)
		})
	}
}

// hint is the reconcile argument that marks lanes drained, or nil.
func hint(drained bool, lanes ...laneKey) map[laneKey]bool {
	if !drained {
		return nil
	}
	m := map[laneKey]bool{}
	for _, l := range lanes {
		m[l] = true
	}
	return m
}

func writerRacingLaneDeletion(t *testing.T, drained bool) {
	pool, ob := newOutbox(t)
	ctx := context.Background()
	e := testEngine(pool, ob, "relay", 16)
	const rounds = 150
	lanes := ob.q.table.derived("_lanes").quoted()
	notes := ob.q.table.derived("_notes").quoted()
	for i := 0; i < rounds; i++ {
		key := fmt.Sprintf("k%d", i)
		// One topic per round, so this round's fetch sees only this key.
		enqueue(t, pool, ob, key, event(key, "first"))
		res, err := e.fetch(ctx, key, 1000, 0)
		require.NoError(t, err)
		var lane *laneKey
		for _, u := range res.units {
			if u.lane != nil && u.lane.key == key {
				lane = u.lane
				_, err := e.settle(ctx, []settleOp{u.rows[0].settle('a')})
				require.NoError(t, err)
			}
		}
		require.NotNil(t, lane, "round %d: the first row of %s was fetched", i, key)

		var wg sync.WaitGroup
		wg.Add(2)
		go func() {
			defer wg.Done()
			// The writer: a transaction that inserts and commits a moment later.
			err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				if err := ob.Enqueue(ctx, tx, key, event(key, "second")); err != nil {
					return err
				}
				_, err := tx.Exec(ctx, "SELECT pg_sleep($1)", float64(i%5)/1000)
				return err
			})
			assert.NoError(t, err)
		}()
		go func() {
			defer wg.Done()
			// The relay gives the lane back, retrying while a writer holds it,
			// as the flusher does.
			pending := []laneKey{*lane}
			for len(pending) > 0 {
				var err error
				pending, _, err = e.reconcile(ctx, pending, nil, hint(drained, *lane))
				if !assert.NoError(t, err) {
					return
				}
			}
		}()
		wg.Wait()

		var orphans int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+ob.q.table.quoted()+` t
			WHERE t.status = 'pending' AND t.partition_key IS NOT NULL
			  AND NOT EXISTS (SELECT 1 FROM `+lanes+` l WHERE l.topic = t.topic AND l.partition_key = t.partition_key)
			  AND NOT EXISTS (SELECT 1 FROM `+notes+` n WHERE n.topic = t.topic AND n.partition_key = t.partition_key)`).Scan(&orphans))
		require.Zero(t, orphans, "round %d: a pending row of %s has neither a lane nor a note", i, key)
	}
	// And every second row is then delivered.
	got := 0
	for c := 0; c < 10 && got < rounds; c++ {
		got += len(cycle(t, e, 1000, nil))
	}
	assert.Equal(t, rounds, got, "every racing writer's row is delivered")
}

func TestLanes_SweepRecreatesLaneDeletedByHand(t *testing.T) {
	t.Parallel()
	pool, ob := newOutbox(t)
	ctx := context.Background()
	enqueue(t, pool, ob, "t", event("k", "x"))
	takeNotes(t, pool, ob.q)
	_, err := pool.Exec(ctx, `DELETE FROM `+ob.q.table.derived("_lanes").quoted())
	require.NoError(t, err)
	e := testEngine(pool, ob, "relay", 16)
	assert.Empty(t, cycle(t, e, 10, nil), "a keyed row without a lane is invisible to the fetch")
	n, err := e.sweep(ctx)
	require.NoError(t, err)
	assert.EqualValues(t, 1, n, "the sweep recreates exactly the missing lane")
	assert.Equal(t, []string{"x"}, payloads(cycle(t, e, 10, nil)))
	n, err = e.sweep(ctx)
	require.NoError(t, err)
	assert.Zero(t, n)
}

// A key whose writer's note is not taken yet has no lane, but none is
// missing: the sweep takes the notes first and counts only the lanes it
// had to recreate (the count is what the relay logs as a repair).
func TestLanes_SweepCountsNoLaneForANoteNotTakenYet(t *testing.T) {
	t.Parallel()
	pool, ob := newOutbox(t)
	ctx := context.Background()
	enqueue(t, pool, ob, "t", event("k", "x"))
	e := testEngine(pool, ob, "relay", 16)
	n, err := e.sweep(ctx)
	require.NoError(t, err)
	assert.Zero(t, n, "no lane was missing")
	assert.Equal(t, []string{"x"}, payloads(cycle(t, e, 10, nil)))
}

// A key whose note is still waiting has no missing lane either when there
// are more notes than one take turns into lanes (1,000): the sweep counts
// only keys with neither a lane nor a note. Behind a pinned horizon, writers
// of a stand left more notes between two takes than that, and every sweep
// logged dozens of "recreated" lanes that were never gone.
func TestLanes_SweepCountsNoLaneForNotesBeyondOneTake(t *testing.T) {
	t.Parallel()
	pool, ob := newOutbox(t)
	ctx := context.Background()
	const keys = 1100
	msgs := make([]*message.Message, keys)
	for i := range msgs {
		msgs[i] = event(fmt.Sprintf("k%04d", i), "x")
	}
	enqueue(t, pool, ob, "t", msgs...)
	e := testEngine(pool, ob, "relay", 16)
	n, err := e.sweep(ctx)
	require.NoError(t, err)
	assert.Zero(t, n, "every key without a lane has a note waiting")
	delivered := 0
	for range 5 {
		delivered += len(cycle(t, e, 1000, nil))
	}
	assert.Equal(t, keys, delivered, "every row is delivered, from the lanes made from notes")
}

func TestLanes_EmptyLaneIsDeletedAfterItsLastRow(t *testing.T) {
	t.Parallel()
	pool, ob := newOutbox(t)
	enqueue(t, pool, ob, "t", event("k", "x"))
	e := testEngine(pool, ob, "relay", 16)
	require.Len(t, cycle(t, e, 10, nil), 1)
	var lanes int
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM `+ob.q.table.derived("_lanes").quoted()).Scan(&lanes))
	assert.Zero(t, lanes)
}

// The other race: a lane holding only a delayed event is put to sleep until
// that event is due, while a writer adds a row that is due now. The new row
// must not sleep with the lane.
//
// Given back as drained (its run was all acked and held every row in line:
// the delayed row is not in line), the lane goes the careful way at once.
func TestLanes_WriterRacingLaneGoingToSleepIsNotDelayed(t *testing.T) {
	t.Parallel()
	for _, drained := range []bool{false, true} {
		t.Run(fmt.Sprintf("drained=%v", drained), func(t *testing.T) {
			t.Parallel()
			writerRacingLaneGoingToSleep(t, drained)
		})
	}
}

func writerRacingLaneGoingToSleep(t *testing.T, drained bool) {
	pool, ob := newOutbox(t)
	ctx := context.Background()
	e := testEngine(pool, ob, "relay", 16)
	const rounds = 300
	for i := 0; i < rounds; i++ {
		key := fmt.Sprintf("k%d", i)
		reminder := event(key, "reminder")
		SetDeliverAt(reminder, time.Now().Add(time.Hour))
		enqueue(t, pool, ob, key, event(key, "first"), reminder)
		res, err := e.fetch(ctx, key, 10, 0)
		require.NoError(t, err)
		require.Len(t, res.units, 1, "round %d", i)
		require.Equal(t, []string{"first"}, payloads(res.units[0].rows), "round %d: the delayed event is not in the run", i)
		_, err = e.settle(ctx, []settleOp{res.units[0].rows[0].settle('a')})
		require.NoError(t, err)

		var wg sync.WaitGroup
		wg.Add(2)
		go func() {
			defer wg.Done()
			err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				if err := ob.Enqueue(ctx, tx, key, event(key, "now")); err != nil {
					return err
				}
				_, err := tx.Exec(ctx, "SELECT pg_sleep($1)", float64(i%5)/1000)
				return err
			})
			assert.NoError(t, err)
		}()
		go func() {
			defer wg.Done()
			// Given back now, the lane holds only the reminder: it goes to sleep.
			pending := []laneKey{*res.units[0].lane}
			for len(pending) > 0 {
				var err error
				pending, _, err = e.reconcile(ctx, pending, nil, hint(drained, pending...))
				if !assert.NoError(t, err) {
					return
				}
			}
		}()
		wg.Wait()
		got := cycle(t, e, 10, nil)
		require.Equal(t, []string{"now"}, payloadsOf(t, e, key, got), "round %d: the due row is delivered at once", i)
	}
}

func payloadsOf(t *testing.T, _ *engine, key string, rs []row) []string {
	t.Helper()
	var out []string
	for _, r := range rs {
		if r.topic == key {
			out = append(out, string(r.payload))
		}
	}
	return out
}

// A relay that keeps a key for its next run (engine.next) while a writer of
// the key is in flight gives up that run, but not the lane: it still holds
// it and gives it back itself. (When KeepLane let the lease go in the same
// statement, the relay's own next fetch could lease the key again before its
// give-back ran; the give-back then saw the new run's rows leased and put
// the lane to sleep for a whole lease: BenchmarkPoisonKey and
// BenchmarkHotKeyThroughput stalled for 30 s.)
func TestLanes_NextRunWithAWriterInFlightKeepsTheLane(t *testing.T) {
	t.Parallel()
	pool, ob := newOutbox(t)
	ctx := context.Background()
	for i := range 20 {
		enqueue(t, pool, ob, "t", event("k", fmt.Sprintf("r%02d", i)))
	}
	e := testEngine(pool, ob, "relay", 16)
	res, err := e.fetch(ctx, AllTopics, 10, 0)
	require.NoError(t, err)
	require.Len(t, res.units, 1)
	run := res.units[0]
	require.Len(t, run.rows, 16)

	writer, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = writer.Rollback(ctx) }()
	require.NoError(t, ob.Enqueue(ctx, writer, "t", event("k", "written")))

	acks := make([]settleOp, len(run.rows))
	for i, r := range run.rows {
		acks[i] = r.settle('a')
	}
	next, err := e.next(ctx, *run.lane, run.rows[len(run.rows)-1].id, acks)
	require.Error(t, err, "the next run is not taken while a writer of the key is in flight")
	assert.True(t, isLockTimeout(err), "it fails as lock_not_available: %v", err)
	assert.Empty(t, next.units)
	var lockedBy *string
	require.NoError(t, pool.QueryRow(ctx, `SELECT locked_by FROM `+ob.q.table.derived("_lanes").quoted()).Scan(&lockedBy))
	require.NotNil(t, lockedBy, "the lane is still leased")
	assert.Equal(t, "relay", *lockedBy, "the lane is still the relay's, to give back itself")
	require.NoError(t, writer.Commit(ctx))
}

// A fetch tries the advisory locks of its candidates only, at most twice the
// batch, whatever plan reads the lanes table. With the try in the scan's
// filter, a plan that sorts instead of reading the ready_at index (stale
// statistics) tried every ready lane and held every bucket's lock for the
// length of the fetch: in the 100,000-transaction soak two relays then
// delivered 90 events/s and held every writer back.
func TestLeaseLanes_TriesOnlyItsCandidatesWhateverThePlan(t *testing.T) {
	t.Parallel()
	pool, ob := newOutbox(t)
	ctx := context.Background()
	_, err := pool.Exec(ctx, `INSERT INTO `+ob.q.table.quoted()+` (event_id, topic, partition_key, payload)
		SELECT gen_random_uuid(), 't', 'k' || i, '\x00' FROM generate_series(1, 3000) i`)
	require.NoError(t, err)
	takeNotes(t, pool, ob.q)
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `SET LOCAL enable_indexscan = off; SET LOCAL enable_bitmapscan = off`)
	require.NoError(t, err)
	rows, err := tx.Query(ctx, ob.q.leaseLanes, 10, nil, "")
	require.NoError(t, err)
	leased, err := scanLeased(rows)
	require.NoError(t, err)
	assert.Len(t, leased, 10)
	var locks int
	require.NoError(t, tx.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()`).Scan(&locks))
	assert.LessOrEqual(t, locks, 20, "the fetch holds the locks of its candidates only, not of every ready lane")
}

// A lane given back as drained (engine.reconcile) that is not empty after
// all keeps its rows: a row written after its run was picked is delivered
// next, and a delayed row not in line puts the lane to sleep until it is
// due. The lane's floor still moves past the run.
func TestReconcile_ALaneGivenBackAsDrainedThatIsNotEmptyKeepsItsRows(t *testing.T) {
	t.Parallel()
	pool, ob := newOutbox(t)
	ctx := context.Background()
	e := testEngine(pool, ob, "relay", 16)
	lanes := ob.q.table.derived("_lanes").quoted()
	dueAt := time.Now().Add(time.Hour)
	reminder := event("sleepy", "reminder")
	SetDeliverAt(reminder, dueAt)
	enqueue(t, pool, ob, "t", event("late", "first"), event("sleepy", "first"), reminder)

	res, err := e.fetch(ctx, AllTopics, 10, 0)
	require.NoError(t, err)
	require.Len(t, res.units, 2)
	var (
		ops   []settleOp
		given []laneKey
		lasts = map[laneKey]int64{}
	)
	for _, u := range res.units {
		require.Equal(t, []string{"first"}, payloads(u.rows), "key %s: the delayed row is not in line", u.lane.key)
		ops = append(ops, u.rows[0].settle('a'))
		given = append(given, *u.lane)
		lasts[*u.lane] = u.rows[0].id
	}
	_, err = e.settle(ctx, ops)
	require.NoError(t, err)
	enqueue(t, pool, ob, "t", event("late", "second")) // after the pick

	retry, _, err := e.reconcile(ctx, given, lasts, hint(true, given...))
	require.NoError(t, err)
	assert.Empty(t, retry)
	for _, l := range given {
		var (
			readyAt  time.Time
			floor    int64
			lockedBy *string
		)
		require.NoError(t, pool.QueryRow(ctx, `SELECT ready_at, floor_id, locked_by FROM `+lanes+` WHERE partition_key = $1`, l.key).
			Scan(&readyAt, &floor, &lockedBy), "key %s keeps its lane", l.key)
		assert.Nil(t, lockedBy, "key %s: the lane is given back", l.key)
		assert.Equal(t, lasts[l]+1, floor, "key %s: the floor moves past the run", l.key)
		if l.key == "sleepy" {
			assert.WithinDuration(t, dueAt, readyAt, time.Second, "the lane sleeps until its delayed row is due")
		} else {
			assert.False(t, readyAt.After(time.Now()), "the lane with a due row is ready now (%s)", readyAt)
		}
	}
	assert.Equal(t, []string{"second"}, payloads(cycle(t, e, 10, nil)), "the row written after the pick is delivered next, alone")
}

// The give-back of a drained lane looks for pending rows from the lane's
// floor, not from past the run it handed out: a row below the run's end can
// be pending without having been handed out. Were the lane deleted with
// such a row, the row would have neither lane nor note, and the key's next
// writer would make a lane whose floor lies above it: the rows written
// after it would go first. Two such rows: one an operator requeues while
// the run is delivered (this test), and one whose ack the database refuses
// (the next).
func TestReconcile_ARowRequeuedInsideADrainedRunKeepsItsLane(t *testing.T) {
	t.Parallel()
	f := newAdminFixture(t)
	ctx := context.Background()
	e := testEngine(f.pool, f.ob, "relay", 16)
	enqueue(t, f.pool, f.ob, "t", event("k", "failed"), event("k", "next"))
	f.fail("failed") // the key's first row, failed for good: it holds nothing back

	res, err := e.fetch(ctx, AllTopics, 10, 0)
	require.NoError(t, err)
	require.Len(t, res.units, 1)
	u := res.units[0]
	require.Equal(t, []string{"next"}, payloads(u.rows))
	// While the run is delivered, an operator requeues the failed row: it
	// is pending again, between the lane's floor and the run's end.
	require.NoError(t, f.admin.Requeue(ctx, f.id("failed")))
	_, err = e.settle(ctx, []settleOp{u.rows[0].settle('a')})
	require.NoError(t, err)
	giveBackDrained(t, e, u)

	_, ok := f.lane("k")
	assert.True(t, ok, "the lane of a key with a requeued row is kept")
	enqueue(t, f.pool, f.ob, "t", event("k", "later"))
	assert.Equal(t, []string{"failed", "later"}, payloads(cycle(t, e, 10, nil)),
		"the requeued row goes before the row written after it")
}

// giveBackDrained gives u's lane back as drained, as the flusher does after
// a run that was all acked and shorter than RunLength.
func giveBackDrained(t *testing.T, e *engine, u unit) {
	t.Helper()
	lane := *u.lane
	retry, _, err := e.reconcile(context.Background(), []laneKey{lane}, map[laneKey]int64{lane: u.rows[len(u.rows)-1].id}, hint(true, lane))
	require.NoError(t, err)
	require.Empty(t, retry)
}

func TestReconcile_ARowWhoseAckIsRefusedKeepsItsLane(t *testing.T) {
	t.Parallel()
	f := newAdminFixture(t)
	ctx := context.Background()
	e := testEngine(f.pool, f.ob, "relay", 16)
	refuse := f.ob.q.table.derived("_refuse").quoted()
	// The database refuses to complete one row (a trigger of the user's,
	// say), so its ack is never written.
	f.exec(`CREATE FUNCTION ` + refuse + `() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status = 'completed' AND NEW.payload = '\x737475636b'::bytea THEN
        RAISE EXCEPTION 'refused by the test';
    END IF;
    RETURN NEW;
END $$`)
	t.Cleanup(func() { _, _ = f.pool.Exec(context.Background(), `DROP FUNCTION IF EXISTS `+refuse+`() CASCADE`) })
	f.exec(`CREATE TRIGGER refuse BEFORE UPDATE ON {T} FOR EACH ROW EXECUTE FUNCTION ` + refuse + `()`)
	enqueue(t, f.pool, f.ob, "t", event("k", "stuck"), event("k", "after"))

	res, err := e.fetch(ctx, AllTopics, 10, 0)
	require.NoError(t, err)
	require.Len(t, res.units, 1)
	u := res.units[0]
	require.Equal(t, []string{"stuck", "after"}, payloads(u.rows))
	var logged []string
	n, err := e.settleIsolating(ctx, []settleOp{u.rows[0].settle('a'), u.rows[1].settle('a')},
		func(msg string, _ ...any) { logged = append(logged, msg) })
	require.NoError(t, err)
	assert.EqualValues(t, 1, n, "the other ack is written")
	require.Len(t, logged, 1, "the refusal is logged")
	require.Equal(t, "pending", stateOf(t, f.pool, f.ob, "stuck").status)
	// Both rows were acked and the run was shorter than RunLength: the
	// relay gives the lane back as drained.
	giveBackDrained(t, e, u)

	_, ok := f.lane("k")
	assert.True(t, ok, "the lane of a key whose ack was refused is kept")
	f.exec(`DROP TRIGGER refuse ON {T}`)
	enqueue(t, f.pool, f.ob, "t", event("k", "later"))
	assert.Equal(t, []string{"stuck", "later"}, payloads(cycle(t, e, 10, nil)),
		"the row whose ack was refused is delivered again, before the row written after it")
}

// A relay that gives back as drained a lane another relay has taken over
// since (its lease ran out) leaves that lane alone: not deleted, still the
// other relay's, and not counted as ready (which would wake its fetch for
// nothing). The other relay then delivers the key's new row.
func TestReconcile_ADrainedLaneAnotherRelayTookIsLeftToIt(t *testing.T) {
	t.Parallel()
	pool, ob := newOutbox(t)
	ctx := context.Background()
	lanes := ob.q.table.derived("_lanes").quoted()
	enqueue(t, pool, ob, "t", event("k", "first"))
	a, b := testEngine(pool, ob, "a", 16), testEngine(pool, ob, "b", 16)
	res, err := a.fetch(ctx, AllTopics, 10, 0)
	require.NoError(t, err)
	require.Len(t, res.units, 1)
	u := res.units[0]
	_, err = a.settle(ctx, []settleOp{u.rows[0].settle('a')})
	require.NoError(t, err)

	// a stalls past its lease; a writer adds a row and b takes the key.
	enqueue(t, pool, ob, "t", event("k", "second"))
	_, err = pool.Exec(ctx, `UPDATE `+lanes+` SET locked_until = now() - interval '1s'`)
	require.NoError(t, err)
	taken, err := b.fetch(ctx, AllTopics, 10, 0)
	require.NoError(t, err)
	require.Len(t, taken.units, 1)
	require.Equal(t, []string{"second"}, payloads(taken.units[0].rows))

	retry, ready, err := a.reconcile(ctx, []laneKey{*u.lane}, map[laneKey]int64{*u.lane: u.rows[0].id}, hint(true, *u.lane))
	require.NoError(t, err)
	assert.Empty(t, retry, "a drops a lane that is no longer its own")
	assert.Zero(t, ready, "a lane that is not a's is not counted as ready for a")
	var lockedBy *string
	require.NoError(t, pool.QueryRow(ctx, `SELECT locked_by FROM `+lanes).Scan(&lockedBy), "the lane is still there")
	require.NotNil(t, lockedBy)
	assert.Equal(t, "b", *lockedBy, "the lane is still b's")
}
