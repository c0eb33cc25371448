package postgres

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestMigrate_SmallHotTablesVacuumAfterAThousandDeadVersions: migration
// 0006 sets autovacuum to vacuum the lanes and notes tables after every
// 1,000 dead versions, without cost delay or truncation (its lock would
// stop writers), and the table itself at 5 %
// dead instead of PostgreSQL's 20 %.
func TestMigrate_SmallHotTablesVacuumAfterAThousandDeadVersions(t *testing.T) {
	t.Parallel()
	pool, ob := newOutbox(t)
	tn := ob.q.table
	options := func(rel string) []string {
		var opts []string
		require.NoError(t, pool.QueryRow(context.Background(),
			`SELECT coalesce(reloptions, '{}') FROM pg_class WHERE oid = $1::regclass`, rel).Scan(&opts))
		return opts
	}
	small := []string{"autovacuum_vacuum_scale_factor=0", "autovacuum_vacuum_threshold=1000", "autovacuum_vacuum_cost_delay=0", "vacuum_truncate=false"}
	assert.Subset(t, options(tn.derived("_lanes").quoted()), small, "lanes")
	assert.Subset(t, options(tn.derived("_notes").quoted()), small, "notes")
	table := tn.quoted()
	if testPartitioned() { // the settings are each partition's
		table = tn.derived("_default").quoted()
		names, err := newPartitioner(pool, tn, false).partitions(context.Background(), pool)
		require.NoError(t, err)
		require.NotEmpty(t, names)
		assert.Subset(t, options(quoteIdent(names[0])), []string{"autovacuum_vacuum_scale_factor=0.05", "autovacuum_vacuum_threshold=10000", "fillfactor=70"}, names[0])
	}
	assert.Subset(t, options(table), []string{"autovacuum_vacuum_scale_factor=0.05", "autovacuum_vacuum_threshold=10000", "fillfactor=70"}, "table")
}

// TestSubscriber_VacuumsItsLanesAndNotesTables: a Subscriber vacuums the
// lanes and notes tables of its table every VacuumInterval, so their dead
// versions go away even with autovacuum off; a negative interval turns it
// off.
func TestSubscriber_VacuumsItsLanesAndNotesTables(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		interval time.Duration
		want     bool
	}{
		{"every 200ms", 200 * time.Millisecond, true},
		{"off", -1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pool, ob := newOutbox(t)
			tn := ob.q.table
			ctx := context.Background()
			// Dead versions in both: notes taken and lanes emptied by a drain.
			for i := range 20 {
				require.NoError(t, ob.Enqueue(ctx, pool, "vac", event(fmt.Sprintf("k%d", i), "x")))
			}
			sub, err := NewSubscriber(pool, SubscriberConfig{Table: ob.Table(), WorkerID: "w", VacuumInterval: tc.interval}, nil)
			require.NoError(t, err)
			t.Cleanup(func() { _ = sub.Close() })
			msgs, err := sub.Subscribe(ctx, "vac")
			require.NoError(t, err)
			for range 20 {
				select {
				case m := <-msgs:
					m.Ack()
				case <-time.After(10 * time.Second):
					t.Fatal("no delivery within 10s")
				}
			}

			vacuums := func() (lanes, notes int64) {
				require.NoError(t, pool.QueryRow(ctx, `
SELECT (SELECT vacuum_count FROM pg_stat_user_tables WHERE relid = $1::regclass),
       (SELECT vacuum_count FROM pg_stat_user_tables WHERE relid = $2::regclass)`,
					tn.derived("_lanes").quoted(), tn.derived("_notes").quoted()).Scan(&lanes, &notes))
				return lanes, notes
			}
			deadline := time.Now().Add(5 * time.Second)
			for {
				lanes, notes := vacuums()
				if tc.want && lanes > 0 && notes > 0 {
					return
				}
				if time.Now().After(deadline) {
					if tc.want {
						t.Fatalf("lanes vacuumed %d times, notes %d times in 5s; want both at least once", lanes, notes)
					}
					assert.Zero(t, lanes, "lanes vacuumed with VacuumInterval off")
					assert.Zero(t, notes, "notes vacuumed with VacuumInterval off")
					return
				}
				time.Sleep(100 * time.Millisecond)
			}
		})
	}
}

// TestExtend_RowsAnotherStatementHoldsAreSkippedAndLanesStillRenewed: a
// lease renewal does not wait for rows another transaction holds (a
// settlement of the same worker locks them in another order: waiting made
// deadlocks under load, seen in make soak-horizon), renews the others, and
// renews the lanes.
func TestExtend_RowsAnotherStatementHoldsAreSkippedAndLanesStillRenewed(t *testing.T) {
	t.Parallel()
	pool, ob := newOutbox(t)
	ctx := context.Background()
	// Unkeyed rows carry leases of their own; the keyed row is covered by
	// its lane's (migration 0010).
	for i := range 4 {
		enqueue(t, pool, ob, "t", event("", fmt.Sprintf("r%d", i)))
	}
	enqueue(t, pool, ob, "t", event("k", "keyed"))
	e := testEngine(pool, ob, "relay", 16)
	res, err := e.fetch(ctx, AllTopics, 10, 10)
	require.NoError(t, err)
	require.Len(t, res.units, 5)
	var (
		run *unit
		ids []int64
	)
	for i, u := range res.units {
		if u.lane != nil {
			run = &res.units[i]
			continue
		}
		require.True(t, u.rows[0].own, "an unkeyed row has its own lease")
		ids = append(ids, u.rows[0].id)
	}
	require.NotNil(t, run)
	require.Len(t, ids, 4)
	until := func(id int64) (at time.Time) {
		require.NoError(t, pool.QueryRow(ctx, `SELECT locked_until FROM `+ob.q.table.quoted()+` WHERE id = $1`, id).Scan(&at))
		return at
	}
	held, before := until(ids[0]), until(ids[1])

	holder, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = holder.Rollback(ctx) }()
	_, err = holder.Exec(ctx, `SELECT 1 FROM `+ob.q.table.quoted()+` WHERE id = $1 FOR UPDATE`, ids[0])
	require.NoError(t, err)

	time.Sleep(10 * time.Millisecond) // so a renewal shows in locked_until
	wait, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	renewed, lost, err := e.extend(wait, ids, []laneKey{*run.lane})
	require.NoError(t, err, "the renewal neither waits for the held row nor fails")
	assert.Equal(t, []laneKey{*run.lane}, renewed)
	assert.Empty(t, lost)
	assert.True(t, until(ids[1]).After(before), "a row nobody else holds is renewed")
	require.NoError(t, holder.Rollback(ctx))
	assert.True(t, until(ids[0]).Equal(held), "the held row was skipped")
}

// TestTakeNotes_TakesAThousandWhateverTheStatisticsSay: a vacuum of the
// notes table while it is empty leaves statistics that say it is empty.
// TakeNotes written as "id IN (subquery … LIMIT 1000 FOR UPDATE SKIP
// LOCKED)" was then planned as a nested loop that ran the subquery again
// for every note: it took every note at once, in time quadratic in their
// number (58 s for 20,000; make soak-horizon's relay stalled for 10-20 s at
// a time). It takes at most 1,000, from the primary key, whatever the
// statistics.
func TestTakeNotes_TakesAThousandWhateverTheStatisticsSay(t *testing.T) {
	t.Parallel()
	pool, ob := newOutbox(t)
	ctx := context.Background()
	notes := ob.q.table.derived("_notes").quoted()
	// 3,000 writers' notes: one per new key.
	write := func() {
		_, err := pool.Exec(ctx, `INSERT INTO `+notes+` (consumer_group, topic, partition_key, ready_at)
SELECT '', 't', 'k' || g, now() FROM generate_series(1, 3000) g`)
		require.NoError(t, err)
	}
	// A burst taken, then a vacuum of the empty table (its pages stay).
	write()
	_, err := pool.Exec(ctx, `DELETE FROM `+notes)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `VACUUM `+notes)
	require.NoError(t, err)
	var (
		reltuples float64
		relpages  int
	)
	require.NoError(t, pool.QueryRow(ctx, `SELECT reltuples, relpages FROM pg_class WHERE oid = $1::regclass`, notes).Scan(&reltuples, &relpages))
	require.Zero(t, reltuples, "the statistics say the notes table is empty")
	require.NotZero(t, relpages, "and has pages")

	write()
	_, err = pool.Exec(ctx, ob.q.takeNotes)
	require.NoError(t, err)
	var left int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+notes).Scan(&left))
	assert.Equal(t, 2000, left, "one TakeNotes takes 1,000 notes")
	var lanes int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+ob.q.table.derived("_lanes").quoted()).Scan(&lanes))
	assert.Equal(t, 1000, lanes, "and makes their lanes")
}

// TestVacuum_SkipsTablesAnotherProcessJustVacuumed: a fleet of relays over
// one table vacuums it about once per interval, not once per relay: a
// relay whose turn comes within the interval after another process (or
// autovacuum) vacuumed both tables skips its turn.
func TestVacuum_SkipsTablesAnotherProcessJustVacuumed(t *testing.T) {
	t.Parallel()
	pool, ob := newOutbox(t)
	ctx := context.Background()
	lanes, notes := ob.q.table.derived("_lanes").quoted(), ob.q.table.derived("_notes").quoted()
	count := func() (n int64) {
		require.NoError(t, pool.QueryRow(ctx, `SELECT sum(vacuum_count) FROM pg_stat_user_tables WHERE relid IN ($1::regclass, $2::regclass)`,
			lanes, notes).Scan(&n))
		return n
	}
	e := testEngine(pool, ob, "relay", 16)
	did, err := e.vacuum(ctx, time.Minute)
	require.NoError(t, err)
	assert.True(t, did, "never vacuumed: this relay vacuums")
	assert.EqualValues(t, 2, count())

	other := testEngine(pool, ob, "another relay", 16)
	did, err = other.vacuum(ctx, time.Minute)
	require.NoError(t, err)
	assert.False(t, did, "vacuumed a moment ago: the other relay skips its turn")
	assert.EqualValues(t, 2, count())

	time.Sleep(50 * time.Millisecond)
	did, err = other.vacuum(ctx, 10*time.Millisecond)
	require.NoError(t, err)
	assert.True(t, did, "longer ago than its interval: it vacuums")
	assert.EqualValues(t, 4, count())
}
