package postgres

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/internal/testenv"
)

// Tests of runs covered by their lane's lease (migration 0010): a keyed row
// handed out is not written to, its lane notes the run, and a lease that
// takes the lane over counts the deliveries of the run's unsettled rows, so
// attempts still equal the deliveries that were counted under row leases.

// expireLane ends the lease of the lane of key now, as a relay that died
// would leave it.
func expireLane(t *testing.T, pool *pgxpool.Pool, ob *Outbox, key string) {
	t.Helper()
	_, err := pool.Exec(context.Background(), `UPDATE `+ob.q.table.derived("_lanes").quoted()+`
SET locked_until = now() - interval '1 second' WHERE partition_key = $1`, key)
	require.NoError(t, err)
}

func fetchOne(t *testing.T, e *engine) unit {
	t.Helper()
	res, err := e.fetch(context.Background(), AllTopics, 10, 10)
	require.NoError(t, err)
	require.Len(t, res.units, 1)
	return res.units[0]
}

func TestRuns_ALostRunCountsEachUnsettledDeliveryOnce(t *testing.T) {
	t.Parallel()
	pool, ob := newOutbox(t)
	enqueue(t, pool, ob, "t", event("k", "r1"), event("k", "r2"), event("k", "r3"))
	crashed := testEngine(pool, ob, "crashed", 16)
	u := fetchOne(t, crashed)
	require.Equal(t, []string{"r1", "r2", "r3"}, payloads(u.rows))
	for _, r := range u.rows {
		assert.False(t, r.own, "%s is covered by the lane's lease", r.payload)
		assert.Nil(t, stateOf(t, pool, ob, string(r.payload)).lockedBy, "%s is not written to", r.payload)
	}
	// The relay dies while handling r1; its lane's lease expires.
	expireLane(t, pool, ob, "k")

	other := testEngine(pool, ob, "other", 16)
	first := cycle(t, other, 10, nil)
	require.Equal(t, []string{"r1"}, payloads(first), "after a lost run the key goes one row at a time")
	assert.True(t, first[0].own, "a row left over from a lost lease is leased on its own")
	assert.Equal(t, 1, first[0].attempts, "the lost delivery is counted")
	for _, p := range []string{"r2", "r3"} {
		s := stateOf(t, pool, ob, p)
		assert.Equal(t, 1, s.attempts, "%s: the lost run's delivery is counted once", p)
		if assert.NotNil(t, s.lockedBy, p) {
			assert.Equal(t, "crashed", *s.lockedBy, "%s is left over from the lost lease", p)
		}
	}

	// Drained by the other relay one row at a time, each acked: every row
	// ends with the one delivery that was lost counted, as under row leases.
	got := payloads(first)
	for range 10 {
		got = append(got, payloads(cycle(t, other, 10, nil))...)
		if len(got) == 3 {
			break
		}
	}
	assert.Equal(t, []string{"r1", "r2", "r3"}, got)
	for _, p := range got {
		s := stateOf(t, pool, ob, p)
		assert.Equal(t, "completed", s.status, p)
		assert.Equal(t, 1, s.attempts, "%s: a completed row's attempts are its counted failures and lost deliveries", p)
	}
}

func TestRuns_SettledRowsOfALostRunAreNotCountedAgain(t *testing.T) {
	t.Parallel()
	pool, ob := newOutbox(t)
	for i := 1; i <= 4; i++ {
		enqueue(t, pool, ob, "t", event("k", fmt.Sprintf("r%d", i)))
	}
	crashed := testEngine(pool, ob, "crashed", 16)
	u := fetchOne(t, crashed)
	require.Len(t, u.rows, 4)
	// r1 acked, r2 failed (counted, due again at once), r3 and r4 released;
	// the settlement is written, then the relay dies before it gives the
	// lane back.
	retry := time.Now().Add(-time.Second)
	fail := failWith(bus.ClassCounted, retry)(u.rows[1])
	fail.id, fail.lease = u.rows[1].id, u.rows[1].attempts+1
	n, err := crashed.settle(context.Background(), []settleOp{
		u.rows[0].settle('a'), *fail, u.rows[2].settle('r'), u.rows[3].settle('r'),
	})
	require.NoError(t, err)
	assert.EqualValues(t, 2, n, "the ack and the failure change their rows; the releases have nothing to undo")
	expireLane(t, pool, ob, "k")

	other := testEngine(pool, ob, "other", 16)
	next := fetchOne(t, other)
	assert.Equal(t, []string{"r2", "r3", "r4"}, payloads(next.rows),
		"nothing of the lost run was unsettled, so the key's run goes on as usual")
	assert.Equal(t, []int{1, 0, 0}, []int{next.rows[0].attempts, next.rows[1].attempts, next.rows[2].attempts},
		"r2 keeps its one counted failure; the released rows spent nothing")
	assert.Equal(t, "completed", stateOf(t, pool, ob, "r1").status)
	assert.Equal(t, 0, stateOf(t, pool, ob, "r1").attempts)
}

func TestRuns_ASettlementOutsideTheLanesRunChangesNothing(t *testing.T) {
	t.Parallel()
	pool, ob := newOutbox(t)
	enqueue(t, pool, ob, "t", event("k", "r1"), event("k", "r2"))
	e := testEngine(pool, ob, "w1", 1) // runs of one row: r2 is not handed out
	u := fetchOne(t, e)
	require.Equal(t, []string{"r1"}, payloads(u.rows))
	var r2 int64
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT id FROM `+ob.q.table.quoted()+` WHERE payload = 'r2'`).Scan(&r2))

	thief := testEngine(pool, ob, "w2", 1)
	n, err := thief.settle(context.Background(), []settleOp{u.rows[0].settle('a')})
	require.NoError(t, err)
	assert.Zero(t, n, "a worker whose run it is not does not settle r1")
	key := "k"
	n, err = e.settle(context.Background(), []settleOp{row{id: r2, topic: "t", partitionKey: &key}.settle('a')})
	require.NoError(t, err)
	assert.Zero(t, n, "r2 is past the run's end: its holder was never handed it")
	assert.Equal(t, "pending", stateOf(t, pool, ob, "r2").status)
	n, err = e.settle(context.Background(), []settleOp{u.rows[0].settle('a')})
	require.NoError(t, err)
	assert.EqualValues(t, 1, n, "the run's holder acks r1")
}

func TestRuns_ReleasingAnExpiredLaneCountsItsRun(t *testing.T) {
	t.Parallel()
	f := newAdminFixture(t)
	ctx := context.Background()
	enqueue(t, f.pool, f.ob, "t", event("k", "r1"), event("k", "r2"), event("k", "r3"))
	e := testEngine(f.pool, f.ob, "crashed", 2)
	u := fetchOne(t, e)
	require.Equal(t, []string{"r1", "r2"}, payloads(u.rows))

	s, err := f.admin.Stats(ctx)
	require.NoError(t, err)
	assert.EqualValues(t, 2, s.Leased, "the rows of a lane's run are leased while the lane's lease lives")
	assert.EqualValues(t, 1, s.Due, "r3 is due; r1 and r2 are out")
	assert.Zero(t, s.ExpiredLeases)
	holders, err := f.admin.Leases(ctx)
	require.NoError(t, err)
	require.Len(t, holders, 1)
	assert.Equal(t, "crashed", holders[0].Instance)
	assert.EqualValues(t, 2, holders[0].Rows)
	assert.EqualValues(t, 1, holders[0].Lanes)

	expireLane(t, f.pool, f.ob, "k")
	s, err = f.admin.Stats(ctx)
	require.NoError(t, err)
	assert.EqualValues(t, 2, s.ExpiredLeases, "and expired after it")
	assert.Zero(t, s.Leased)

	rows, lanes, err := f.admin.ReleaseExpiredLeases(ctx)
	require.NoError(t, err)
	assert.Zero(t, rows, "no row had a lease of its own")
	assert.EqualValues(t, 1, lanes)
	for _, p := range []string{"r1", "r2"} {
		st := stateOf(t, f.pool, f.ob, p)
		assert.Equal(t, 1, st.attempts, "%s: the lost delivery is counted, as a row lease released kept it", p)
		assert.Nil(t, st.lockedBy, p)
	}
	assert.Zero(t, stateOf(t, f.pool, f.ob, "r3").attempts, "r3 was never handed out")
	s, err = f.admin.Stats(ctx)
	require.NoError(t, err)
	assert.Zero(t, s.ExpiredLeases+s.Leased, "nothing left held")
	assert.EqualValues(t, 3, s.Due)
}

// A row that was not due when the run was handed out was not handed out: a
// delayed row is not in line, and the run passes it. The lease that takes
// the lane over neither counts it nor makes it look left over, which would
// make it hold its key back once due.
func TestRuns_ALostRunLeavesADelayedRowItPassedAlone(t *testing.T) {
	t.Parallel()
	pool, ob := newOutbox(t)
	delayed := event("k", "r2")
	SetDeliverAt(delayed, time.Now().Add(time.Second))
	enqueue(t, pool, ob, "t", event("k", "r1"), delayed, event("k", "r3"))
	crashed := testEngine(pool, ob, "crashed", 16)
	u := fetchOne(t, crashed)
	require.Equal(t, []string{"r1", "r3"}, payloads(u.rows), "the delayed row is passed")
	// r2 comes due; then the relay's lease is lost.
	testenv.Eventually(t, 5*time.Second, func() bool {
		return stateOf(t, pool, ob, "r2").scheduledAt.Before(time.Now())
	}, "r2 to come due")
	time.Sleep(50 * time.Millisecond)
	expireLane(t, pool, ob, "k")

	other := testEngine(pool, ob, "other", 16)
	first := cycle(t, other, 10, nil)
	require.Equal(t, []string{"r1"}, payloads(first), "the lost run's head goes alone")
	s := stateOf(t, pool, ob, "r2")
	assert.Zero(t, s.attempts, "r2 was never handed out: nothing to count")
	assert.Nil(t, s.lockedBy, "and it is not left over from the lost lease")
	assert.Equal(t, 1, stateOf(t, pool, ob, "r3").attempts, "r3 was handed out in the lost run")
}
