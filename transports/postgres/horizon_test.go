package postgres

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omnibus-go/omnibus/internal/testenv"
)

// pinHorizon opens a REPEATABLE READ transaction with its snapshot taken, as
// a long report does: until it ends, VACUUM removes no version that a later
// transaction made dead. It ends when the test does.
func pinHorizon(t *testing.T, pool *pgxpool.Pool) pgx.Tx {
	t.Helper()
	ctx := context.Background()
	report, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	require.NoError(t, err)
	t.Cleanup(func() { _ = report.Rollback(ctx) })
	var one int
	require.NoError(t, report.QueryRow(ctx, `SELECT 1`).Scan(&one))
	return report
}

// TestCompact_FreesTheVersionsVacuumCannotRemoveBehindAPinnedHorizon: with
// a long transaction open, VACUUM leaves every dead version of the lanes
// and notes tables in place; compaction frees them and keeps every live
// lane and note exactly as it was. Below its threshold it does nothing.
func TestCompact_FreesTheVersionsVacuumCannotRemoveBehindAPinnedHorizon(t *testing.T) {
	t.Parallel()
	pool, ob := newOutbox(t)
	ctx := context.Background()
	lanes, notes := ob.q.table.derived("_lanes").quoted(), ob.q.table.derived("_notes").quoted()
	exec := func(sql string, args ...any) {
		t.Helper()
		_, err := pool.Exec(ctx, sql, args...)
		require.NoError(t, err)
	}
	for i := range 20 {
		enqueue(t, pool, ob, "t", event(fmt.Sprintf("k%02d", i), "x"))
	}
	takeNotes(t, pool, ob.q) // 20 lanes
	for i := range 20 {
		exec(`INSERT INTO `+notes+` (topic, partition_key, ready_at) VALUES ('t', $1, now())`, fmt.Sprintf("n%02d", i))
	}
	exec(`UPDATE ` + lanes + ` SET locked_by = 'w', locked_until = now() + interval '1 minute', floor_id = 7 WHERE partition_key = 'k03'`)
	report := pinHorizon(t, pool)

	// Versions the open report keeps: 60 leases of every lane, and 900
	// notes left and taken.
	for range 60 {
		exec(`UPDATE ` + lanes + ` SET ready_at = ready_at WHERE partition_key <> 'k03'`)
	}
	for range 30 {
		exec(`INSERT INTO ` + notes + ` (topic, partition_key, ready_at) SELECT 't', 'gone' || g, now() FROM generate_series(1, 30) g`)
		exec(`DELETE FROM ` + notes + ` WHERE partition_key LIKE 'gone%'`)
	}
	exec(`VACUUM ` + lanes + `, ` + notes)
	e := testEngine(pool, ob, "relay", 16)
	dead := func(rel string) (dead, live int64) {
		t.Helper()
		require.NoError(t, pool.QueryRow(ctx, e.q.deadVersions, rel).Scan(&dead, &live, new(int64), new(uint32)))
		return dead, live
	}
	laneDead, laneLive := dead(lanes)
	noteDead, _ := dead(notes)
	require.GreaterOrEqual(t, laneDead, int64(1000), "the pinned horizon kept the lanes' dead versions (%d live)", laneLive)
	require.GreaterOrEqual(t, noteDead, int64(500), "the pinned horizon kept the notes' dead versions")

	contents := func(rel, order string) string {
		t.Helper()
		var s string
		require.NoError(t, pool.QueryRow(ctx, `SELECT string_agg(x::text, E'\n' ORDER BY `+order+`) FROM `+rel+` x`).Scan(&s))
		return s
	}
	size := func(rel string) (n int64) {
		t.Helper()
		require.NoError(t, pool.QueryRow(ctx, `SELECT pg_total_relation_size($1::regclass)`, rel).Scan(&n))
		return n
	}
	lanesBefore, notesBefore := contents(lanes, "x.partition_key"), contents(notes, "x.id")
	laneSize, noteSize := size(lanes), size(notes)

	compacted, _, err := e.compact(ctx, 500)
	require.NoError(t, err)
	assert.Equal(t, []string{lanes, notes}, compacted)
	assert.Equal(t, lanesBefore, contents(lanes, "x.partition_key"), "every live lane kept, lease and floor included")
	assert.Equal(t, notesBefore, contents(notes, "x.id"), "every live note kept, with its id")
	assert.Less(t, size(lanes), laneSize/2, "the lanes' dead versions freed")
	assert.Less(t, size(notes), noteSize/2, "the notes' dead versions freed")

	compacted, _, err = e.compact(ctx, 500)
	require.NoError(t, err)
	assert.Empty(t, compacted, "nothing to compact right after a compaction")
	require.NoError(t, report.QueryRow(ctx, `SELECT 1`).Scan(new(int)), "the long transaction is unharmed")
}

// TestCompact_TrustsTheCountsOfAFileACompactionMadeOnceItHasGrown: the
// dead-version counts reach the statistics when a session reports, so after
// a compaction they may still show what it freed (a relay compacted the
// same table three times in a second under make test). A relay that finds
// a file a compaction made since its last look (its own or another
// relay's) compacts it only once the file has grown: it keeps looking, and
// a real pile of dead versions is compacted at a later look.
func TestCompact_TrustsTheCountsOfAFileACompactionMadeOnceItHasGrown(t *testing.T) {
	t.Parallel()
	pool, ob := newOutbox(t)
	ctx := context.Background()
	lanes := ob.q.table.derived("_lanes").quoted()
	for i := range 20 {
		enqueue(t, pool, ob, "t", event(fmt.Sprintf("k%02d", i), "x"))
	}
	takeNotes(t, pool, ob.q)
	pinHorizon(t, pool)
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	churn := func() {
		t.Helper()
		for range 60 {
			_, err := conn.Exec(ctx, `UPDATE `+lanes+` SET ready_at = ready_at`)
			require.NoError(t, err)
		}
		_, err := conn.Exec(ctx, `SELECT pg_stat_force_next_flush()`)
		require.NoError(t, err)
	}
	dead := func() (n int64) {
		require.NoError(t, pool.QueryRow(ctx, `SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = $1::regclass`, lanes).Scan(&n))
		return n
	}

	churn()
	other, relay := testEngine(pool, ob, "other", 16), testEngine(pool, ob, "relay", 16)
	compacted, over, err := relay.compact(ctx, 1<<40) // a look below its threshold
	require.NoError(t, err)
	require.Empty(t, compacted)
	require.False(t, over)
	compacted, _, err = other.compact(ctx, 500)
	require.NoError(t, err)
	require.Equal(t, []string{lanes}, compacted, "another relay compacted the lanes")
	testenv.Eventually(t, 15*time.Second, func() bool { return dead() == 0 }, "the compaction's counts reported")

	// 1,200 dead versions in the new file, as counts that lag would show.
	churn()
	require.GreaterOrEqual(t, dead(), int64(1000))
	compacted, over, err = relay.compact(ctx, 500)
	require.NoError(t, err)
	assert.Empty(t, compacted, "a file a compaction made is not compacted at the first look")
	assert.True(t, over, "the counts are over the threshold: look again")

	churn() // the file grows by 1,200 versions
	compacted, over, err = relay.compact(ctx, 500)
	require.NoError(t, err)
	assert.Equal(t, []string{lanes}, compacted, "compacted once the file grew")
	assert.True(t, over)
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+lanes).Scan(&n))
	assert.Equal(t, 20, n, "no lane lost")
}

// TestCompact_GivesUpAfterItsLockTimeout: a compaction that cannot have
// the lanes table within its lock timeout (a writer's transaction holds a
// lock on it) gives up with a lock timeout, changes nothing, and succeeds
// once the transaction ends.
func TestCompact_GivesUpAfterItsLockTimeout(t *testing.T) {
	t.Parallel()
	pool, ob := newOutbox(t)
	ctx := context.Background()
	lanes := ob.q.table.derived("_lanes").quoted()
	for i := range 20 {
		enqueue(t, pool, ob, "t", event(fmt.Sprintf("k%02d", i), "x"))
	}
	takeNotes(t, pool, ob.q)
	pinHorizon(t, pool)
	for range 60 {
		_, err := pool.Exec(ctx, `UPDATE `+lanes+` SET ready_at = ready_at`)
		require.NoError(t, err)
	}
	_, err := pool.Exec(ctx, `VACUUM `+lanes)
	require.NoError(t, err)

	writer, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = writer.Rollback(ctx) }()
	_, err = writer.Exec(ctx, `SELECT 1 FROM `+lanes+` LIMIT 1`)
	require.NoError(t, err)

	e := testEngine(pool, ob, "relay", 16)
	start := time.Now()
	compacted, _, err := e.compact(ctx, 500)
	require.Error(t, err)
	assert.True(t, isLockTimeout(err), "a lock timeout, got %v", err)
	assert.Less(t, time.Since(start), 2*time.Second, "it waited its lock timeout, not for the writer")
	assert.Empty(t, compacted)
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+lanes).Scan(&n))
	assert.Equal(t, 20, n, "no lane lost")

	require.NoError(t, writer.Commit(ctx))
	compacted, _, err = e.compact(ctx, 500)
	require.NoError(t, err)
	assert.Equal(t, []string{lanes}, compacted)
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+lanes).Scan(&n))
	assert.Equal(t, 20, n)
}

// TestSubscriber_CompactsBehindAPinnedHorizonWithoutLosingOrReordering:
// writers and a relay run while a long transaction pins the horizon and
// the Subscriber compacts the lanes and notes tables again and again; every
// event arrives once, in its key's order. The writers go on until the lanes
// table has been compacted twice: the counts a compaction works from lag by
// a second or more, so a fixed number of events may end before the second.
func TestSubscriber_CompactsBehindAPinnedHorizonWithoutLosingOrReordering(t *testing.T) {
	t.Parallel()
	pool, ob := newOutbox(t)
	ctx := context.Background()
	lanes := ob.q.table.derived("_lanes").quoted()
	pinHorizon(t, pool)

	const writers, keysPerWriter, minPerKey = 4, 5, 60
	var logs testenv.LogBuffer
	started := time.Now()
	sub, err := NewSubscriber(pool, SubscriberConfig{
		Table: ob.Table(), WorkerID: "relay", VacuumInterval: 50 * time.Millisecond, compactMinDead: 50,
	}, slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo})))
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })
	msgs, err := sub.Subscribe(ctx, "c")
	require.NoError(t, err)

	// Compactions give the lanes table a new file each time.
	var files sync.Map
	var nfiles atomic.Int32
	watchCtx, stopWatch := context.WithCancel(ctx)
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for watchCtx.Err() == nil {
			var f uint32
			if pool.QueryRow(watchCtx, `SELECT pg_relation_filenode($1::regclass)`, lanes).Scan(&f) == nil {
				if _, seen := files.LoadOrStore(f, true); !seen {
					nfiles.Add(1)
				}
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()

	// Each transaction writes the next event of three of its writer's
	// keys, until every key has minPerKey events and the lanes table has
	// had three files (or a minute has passed).
	written := make([]int, writers) // events each writer committed
	writeUntil := time.Now().Add(60 * time.Second)
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for n := 0; n < minPerKey*keysPerWriter || (nfiles.Load() < 3 && time.Now().Before(writeUntil)); n += 3 {
				tx, err := pool.Begin(ctx)
				if !assert.NoError(t, err) {
					return
				}
				for j := range 3 {
					key := fmt.Sprintf("w%d-k%d", w, (n+j)%keysPerWriter)
					if !assert.NoError(t, ob.Enqueue(ctx, tx, "c", event(key, fmt.Sprintf("%s:%d", key, (n+j)/keysPerWriter)))) {
						_ = tx.Rollback(ctx)
						return
					}
				}
				if !assert.NoError(t, tx.Commit(ctx)) {
					return
				}
				written[w] = n + 3
			}
		})
	}
	wrote := make(chan struct{})
	go func() { wg.Wait(); close(wrote) }()

	next := map[string]int{}
	total := -1 // known once the writers are done
	deadline := time.After(120 * time.Second)
	for got := 0; got != total; {
		select {
		case m := <-msgs:
			key, seq, _ := strings.Cut(string(m.Payload), ":")
			n, err := strconv.Atoi(seq)
			require.NoError(t, err)
			require.Equal(t, next[key], n, "key %s: event %d arrived when %d was due", key, n, next[key])
			next[key]++
			got++
			m.Ack()
		case <-wrote:
			wrote, total = nil, 0
			for _, n := range written {
				total += n
			}
		case <-deadline:
			t.Fatalf("%d events arrived within 120s (writers done: %v, %d written)", got, total >= 0, total)
		}
	}
	stopWatch()
	<-watched
	for w, n := range written {
		for k := range keysPerWriter {
			// Writer w's n events went round its keys in turn.
			want := n / keysPerWriter
			if k < n%keysPerWriter {
				want++
			}
			assert.Equal(t, want, next[fmt.Sprintf("w%d-k%d", w, k)])
		}
	}
	select {
	case m := <-msgs:
		t.Fatalf("an event arrived twice: %s", m.Payload)
	case <-time.After(300 * time.Millisecond):
	}
	assert.GreaterOrEqual(t, int(nfiles.Load()), 3, "the lanes table was compacted at least twice while the relay ran")
	// The operator hears of it at once, and then once a minute at most.
	lines := strings.Count(logs.String(), "compacted tables whose dead versions vacuum could not remove")
	assert.GreaterOrEqual(t, lines, 1, "the first compaction is logged: %s", logs.String())
	assert.LessOrEqual(t, lines, 1+int(time.Since(started)/compactLogEvery), "one compaction line a minute at most: %s", logs.String())
	testenv.Eventually(t, 5*time.Second, func() bool {
		var pending int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+ob.q.table.quoted()+` WHERE status <> 'completed'`).Scan(&pending))
		return pending == 0
	}, "every row completed")
}

// Behind a pinned horizon the lanes table gains dead versions faster than
// one compaction per vacuum interval keeps up with (a few per event), so a
// relay whose last vacuum left them looks again between its vacuums.
func TestCompactLog_OneLineAMinuteCountingThoseItHolds(t *testing.T) {
	t.Parallel()
	var l compactLog
	t0 := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	n, ok := l.note(t0)
	assert.True(t, ok, "the first compaction is logged at once")
	assert.Equal(t, 1, n)
	for _, d := range []time.Duration{2 * time.Second, 30 * time.Second, compactLogEvery - time.Millisecond} {
		_, ok := l.note(t0.Add(d))
		assert.False(t, ok, "a compaction %s after the logged one", d)
	}
	n, ok = l.note(t0.Add(compactLogEvery))
	assert.True(t, ok, "a minute after the last line")
	assert.Equal(t, 4, n, "the line counts the three held back and itself")
	_, ok = l.note(t0.Add(compactLogEvery + time.Second))
	assert.False(t, ok)
}

func TestSubscriber_CompactsBetweenItsVacuumsWhileTheHorizonIsPinned(t *testing.T) {
	t.Parallel()
	pool, ob := newOutbox(t)
	ctx := context.Background()
	lanes := ob.q.table.derived("_lanes").quoted()
	pinHorizon(t, pool)

	const vacuumEvery = 10 * time.Second
	var logs testenv.LogBuffer
	sub, err := NewSubscriber(pool, SubscriberConfig{
		Table: ob.Table(), WorkerID: "relay", VacuumInterval: vacuumEvery, compactMinDead: 200,
	}, slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = sub.Close()
		if t.Failed() {
			t.Logf("the relay's log:\n%s", logs.String())
		}
	})

	// Lanes of a consumer group no relay of the outbox reads, each updated
	// 20 times: 400 dead versions the pinned horizon keeps from vacuum.
	_, err = pool.Exec(ctx, `INSERT INTO `+lanes+` (consumer_group, topic, partition_key, ready_at)
		SELECT 'elsewhere', 'c', 'k' || i, 'infinity' FROM generate_series(1, 20) i`)
	require.NoError(t, err)
	churn := func() {
		conn, err := pool.Acquire(ctx)
		require.NoError(t, err)
		defer conn.Release()
		for range 20 {
			_, err := conn.Exec(ctx, `UPDATE `+lanes+` SET blocked = NOT blocked WHERE consumer_group = 'elsewhere'`)
			require.NoError(t, err)
		}
		// The relay reads the dead versions from the statistics, which a
		// session reports when it goes idle, and when another holds the
		// database's entry, up to 10 s later (seen under make test):
		// report them now.
		_, err = conn.Exec(ctx, `SELECT pg_stat_force_next_flush()`)
		require.NoError(t, err)
	}
	file := func() (f uint32) {
		require.NoError(t, pool.QueryRow(ctx, `SELECT pg_relation_filenode($1::regclass)`, lanes).Scan(&f))
		return f
	}

	churn()
	first := file()
	testenv.Eventually(t, 2*vacuumEvery, func() bool { return file() != first },
		"the lanes table compacted after the relay's first vacuum")

	// The next vacuum is a whole interval away; the next look is a tenth.
	// The compaction's TRUNCATE zeroes the table's counts when the relay's
	// session reports it, up to 10 s later when the session sits idle, and
	// that wipes the versions made meanwhile from the counts too: keep
	// making them until the relay compacts again.
	second := file()
	var last time.Time
	testenv.Eventually(t, vacuumEvery/2, func() bool {
		if time.Since(last) > 200*time.Millisecond {
			churn()
			last = time.Now()
		}
		return file() != second
	}, "the lanes table compacted again within half a vacuum interval")
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+lanes+` WHERE consumer_group = 'elsewhere'`).Scan(&n))
	assert.Equal(t, 20, n, "every lane survived both compactions")
}

// A relay whose role may not TRUNCATE the lanes and notes tables cannot
// compact them: it says so once per vacuum interval, not at every look
// between vacuums, and delivers as before.
func TestSubscriber_WithoutTruncatePrivilegeWarnsOncePerVacuumAndDelivers(t *testing.T) {
	t.Parallel()
	admin, ob := newOutbox(t)
	ctx := context.Background()
	tn := ob.q.table
	lanes := tn.derived("_lanes").quoted()
	role := testenv.Name(t) + "_relay"
	_, err := admin.Exec(ctx, `CREATE ROLE `+quoteIdent(role)+` LOGIN`)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = admin.Exec(context.Background(), `DROP OWNED BY `+quoteIdent(role))
		_, _ = admin.Exec(context.Background(), `DROP ROLE `+quoteIdent(role))
	})
	for _, rel := range []string{tn.quoted(), lanes, tn.derived("_notes").quoted()} {
		_, err := admin.Exec(ctx, `GRANT SELECT, INSERT, UPDATE, DELETE ON `+rel+` TO `+quoteIdent(role))
		require.NoError(t, err)
	}
	cfg, err := pgxpool.ParseConfig(testenv.PostgresURL())
	require.NoError(t, err)
	cfg.ConnConfig.User = role
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	pinHorizon(t, admin)

	// 400 dead versions the pinned horizon keeps (see the test above),
	// reported at once.
	conn, err := admin.Acquire(ctx)
	require.NoError(t, err)
	for _, sql := range append([]string{`INSERT INTO ` + lanes + ` (consumer_group, topic, partition_key, ready_at)
		SELECT 'elsewhere', 'c', 'k' || i, 'infinity' FROM generate_series(1, 20) i`},
		slices.Repeat([]string{`UPDATE ` + lanes + ` SET blocked = NOT blocked WHERE consumer_group = 'elsewhere'`}, 20)...) {
		_, err := conn.Exec(ctx, sql)
		require.NoError(t, err)
	}
	_, err = conn.Exec(ctx, `SELECT pg_stat_force_next_flush()`)
	require.NoError(t, err)
	conn.Release()

	var logs testenv.LogBuffer
	const vacuumEvery = 2 * time.Second // looks between vacuums: every 0.5 s
	sub, err := NewSubscriber(pool, SubscriberConfig{
		Table: ob.Table(), WorkerID: "relay", VacuumInterval: vacuumEvery, compactMinDead: 200,
	}, slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo})))
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })
	msgs, err := sub.Subscribe(ctx, "c")
	require.NoError(t, err)

	failed := func() int { return strings.Count(logs.String(), "compaction of the lanes and notes tables failed") }
	testenv.Eventually(t, 3*vacuumEvery, func() bool { return failed() > 0 }, "the relay to say its compaction failed: %s", logs.String())
	assert.Contains(t, logs.String(), "SQLSTATE 42501", "the warning names the missing privilege")
	before := failed()
	enqueue(t, admin, ob, "c", event("k", "delivered"))
	select {
	case m := <-msgs:
		assert.Equal(t, "delivered", string(m.Payload))
		m.Ack()
	case <-time.After(10 * time.Second):
		t.Fatal("the relay delivered nothing without the TRUNCATE privilege")
	}
	time.Sleep(2 * vacuumEvery)
	assert.LessOrEqual(t, failed()-before, 4,
		"at most one warning per vacuum in two intervals and what the delivery took (a look every 0.5 s would make 8 or more)")
}

// TestDeleteEmptyLanes_LooksForPendingRowsFromTheFloor: deciding that a
// drained lane is empty reads the key index from the lane's floor, not from
// the key's first entry. Behind a pinned horizon the index keeps an entry
// for every completed row of the key, and each is a visit to the table.
func TestDeleteEmptyLanes_LooksForPendingRowsFromTheFloor(t *testing.T) {
	t.Parallel()
	pool, ob := newOutbox(t)
	ctx := context.Background()
	msgs := make([]*message.Message, 300)
	for i := range msgs {
		msgs[i] = event("k", fmt.Sprintf("r%d", i))
	}
	enqueue(t, pool, ob, "t", msgs...)
	takeNotes(t, pool, ob.q)
	pinHorizon(t, pool)
	table, lanes := ob.q.table.quoted(), ob.q.table.derived("_lanes").quoted()
	_, err := pool.Exec(ctx, `UPDATE `+table+` SET status = 'completed', completed_at = now()`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE `+lanes+` SET locked_by = 'relay', floor_id = (SELECT max(id) + 1 FROM `+table+`)`)
	require.NoError(t, err)

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	read := func() (n int64) {
		t.Helper()
		require.NoError(t, tx.QueryRow(ctx, `
SELECT coalesce(sum(pg_stat_get_xact_tuples_returned(i.indexrelid)), 0)::bigint FROM pg_index i
WHERE i.indrelid IN (SELECT relid FROM pg_partition_tree($1::regclass))`, table).Scan(&n))
		return n
	}
	before := read()
	rows, err := tx.Query(ctx, ob.q.deleteEmpty, []string{""}, []string{"t"}, []string{"k"})
	require.NoError(t, err)
	deleted, err := scanLanes(rows)
	require.NoError(t, err)
	assert.Len(t, deleted, 1, "the drained lane is deleted")
	assert.Less(t, read()-before, int64(30), "index entries of the key's 300 completed rows read")
}

// TestTakeNotes_ALaneMadeFromNotesStartsAtTheirFirstRow: a key that drained
// and lost its lane gets it back from its next writers' notes with its
// floor at the first of their rows, so no lookup of the new lane walks the
// rows the key completed before; a note below a lane's floor moves the
// floor down to it.
func TestTakeNotes_ALaneMadeFromNotesStartsAtTheirFirstRow(t *testing.T) {
	t.Parallel()
	pool, ob := newOutbox(t)
	ctx := context.Background()
	table, lanes, notes := ob.q.table.quoted(), ob.q.table.derived("_lanes").quoted(), ob.q.table.derived("_notes").quoted()
	exec := func(sql string) {
		t.Helper()
		_, err := pool.Exec(ctx, sql)
		require.NoError(t, err)
	}
	floor := func() (f int64) {
		t.Helper()
		require.NoError(t, pool.QueryRow(ctx, `SELECT floor_id FROM `+lanes+` WHERE partition_key = 'k'`).Scan(&f))
		return f
	}
	for i := range 50 {
		enqueue(t, pool, ob, "t", event("k", fmt.Sprintf("old%d", i)))
	}
	takeNotes(t, pool, ob.q)
	// The key drains: its rows complete and its lane goes, as a give-back does.
	exec(`UPDATE ` + table + ` SET status = 'completed', completed_at = now()`)
	exec(`DELETE FROM ` + lanes)

	enqueue(t, pool, ob, "t", event("k", "new0"), event("k", "new1"))
	var first int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT min(id) FROM `+table+` WHERE status = 'pending'`).Scan(&first))
	takeNotes(t, pool, ob.q)
	assert.Equal(t, first, floor(), "the lane made again starts at its first pending row")

	e := testEngine(pool, ob, "relay", 16)
	res, err := e.fetch(ctx, AllTopics, 10, 0)
	require.NoError(t, err)
	require.Len(t, res.units, 1)
	assert.Equal(t, []string{"new0", "new1"}, payloads(res.units[0].rows))

	// A note below the floor (a row whose writer committed after the lane
	// was made from the others) moves it down.
	exec(`INSERT INTO ` + notes + ` (topic, partition_key, ready_at, row_id) VALUES ('t', 'k', now(), 7)`)
	takeNotes(t, pool, ob.q)
	assert.EqualValues(t, 7, floor())
}

// TestPick_StartsAtANoteNotYetTakenBelowTheFloor: a writer that commits
// after a fetch took the notes but before it leased the key has a note the
// fetch did not take, and a row below the floor of the lane made from the
// others; the fetch hands that row out first.
func TestPick_StartsAtANoteNotYetTakenBelowTheFloor(t *testing.T) {
	t.Parallel()
	pool, ob := newOutbox(t)
	ctx := context.Background()
	table, lanes, notes := ob.q.table.quoted(), ob.q.table.derived("_lanes").quoted(), ob.q.table.derived("_notes").quoted()
	enqueue(t, pool, ob, "t", event("k", "first"), event("k", "second"))
	var first, second int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT min(id), max(id) FROM `+table).Scan(&first, &second))
	// The lane as a fetch made it from the second writer's note alone; the
	// first writer's note is still there.
	_, err := pool.Exec(ctx, `DELETE FROM `+notes)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO `+lanes+` (topic, partition_key, ready_at, floor_id) VALUES ('t', 'k', now(), $1)`, second)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO `+notes+` (topic, partition_key, ready_at, row_id) VALUES ('t', 'k', now(), $1)`, first)
	require.NoError(t, err)

	// Lease the lane and pick, without taking the note first.
	e := testEngine(pool, ob, "relay", 16)
	res, err := e.inTx(ctx, func(b *pgx.Batch) {
		b.Queue(ob.q.leaseLanes, 10, nil, e.group)
	}, nil, 0)
	require.NoError(t, err)
	require.Len(t, res.units, 1)
	assert.Equal(t, []string{"first", "second"}, payloads(res.units[0].rows), "the row below the floor goes first")
}
