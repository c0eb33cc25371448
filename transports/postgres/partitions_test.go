package postgres

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/internal/testenv"
)

// newPartitioned migrates a fresh table of kind in the partitioned layout
// with one-hour partitions, and drops it after the test.
func newPartitioned(t *testing.T, kind Kind) (*pgxpool.Pool, Table, *partitioner) {
	t.Helper()
	pool := testenv.Postgres(t)
	name := testenv.Name(t)
	tb := Table{Name: name, Kind: kind, PartitionInterval: time.Hour}
	require.NoError(t, Migrate(context.Background(), pool, tb))
	dropAfter(t, pool, name)
	tn, err := tb.parse()
	require.NoError(t, err)
	return pool, tb, newPartitioner(pool, tn, kind == KindInbox)
}

// partitionsOf lists the table's partitions, the default one aside.
func partitionsOf(t *testing.T, p *partitioner) []string {
	t.Helper()
	names, err := p.partitions(context.Background(), p.pool)
	require.NoError(t, err)
	return names
}

// dbNow is the database's clock.
func dbNow(t *testing.T, pool *pgxpool.Pool) time.Time {
	t.Helper()
	var now time.Time
	require.NoError(t, pool.QueryRow(context.Background(), "SELECT now()").Scan(&now))
	return now
}

// createFrom creates the partitions from the one holding at to
// PartitionsAhead after it.
func createFrom(t *testing.T, p *partitioner, at time.Time) {
	t.Helper()
	have := map[string]bool{}
	for _, n := range partitionsOf(t, p) {
		have[n] = true
	}
	var rep PartitionReport
	require.NoError(t, p.createAhead(context.Background(), p.pool, time.Hour, at, have, &rep))
	require.Empty(t, rep.Deferred)
}

// partitionOfRow is the partition a row of the table is stored in.
func partitionOfRow(t *testing.T, pool *pgxpool.Pool, tb Table, where string, args ...any) string {
	t.Helper()
	var part string
	require.NoError(t, pool.QueryRow(context.Background(),
		`SELECT tableoid::regclass::text FROM `+quoteIdent(tb.Name)+` WHERE `+where, args...).Scan(&part))
	return part
}

func TestMigrate_PartitionedLayoutCreatesTheCurrentPartitionAndThreeAhead(t *testing.T) {
	t.Parallel()
	pool, tb, p := newPartitioned(t, KindOutbox)
	ctx := context.Background()

	var kind string
	require.NoError(t, pool.QueryRow(ctx, `SELECT relkind::text FROM pg_class WHERE oid = to_regclass($1)`, tb.Name).Scan(&kind))
	assert.Equal(t, "p", kind, "the table is partitioned")
	now := dbNow(t, pool)
	var want []string
	for i := range PartitionsAhead + 1 {
		want = append(want, tb.Name+"_p"+partitionStart(now, time.Hour).Add(time.Duration(i)*time.Hour).Format(partitionTimeFormat))
	}
	assert.Equal(t, want, partitionsOf(t, p))

	ob, err := NewOutbox(OutboxConfig{Table: tb.Name})
	require.NoError(t, err)
	enqueue(t, pool, ob, "orders", event("k", "a"))
	assert.Equal(t, quoteIdent(want[0]), quoteIdent(partitionOfRow(t, pool, tb, "true")), "a row lands in the current partition")

	require.NoError(t, Migrate(ctx, pool, tb), "migrating again is a no-op")
	assert.Equal(t, want, partitionsOf(t, p))

	other := tb
	other.PartitionInterval = 24 * time.Hour
	err = Migrate(ctx, pool, other)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "partition interval 24h0m0s: the table is partitioned by 1h0m0s, which cannot change")
}

// The partitioned outbox keeps no index of its rows' event ids: the dedup
// table recognises a repeat, and nothing reads rows by event id, so every
// write to that index (random ids, a page anywhere) was waste. A table
// migrated before migration 0009 loses it too.
func TestMigrate_PartitionedOutboxKeepsNoIndexOfEventIDs(t *testing.T) {
	t.Parallel()
	pool, tb, _ := newPartitioned(t, KindOutbox)
	ctx := context.Background()
	eventIndexes := func() int {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_index i
WHERE (i.indrelid = $1::regclass OR i.indrelid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = $1::regclass))
  AND pg_get_indexdef(i.indexrelid) LIKE '%event_id%'`, quoteIdent(tb.Name)).Scan(&n))
		return n
	}
	assert.Zero(t, eventIndexes(), "no index of the table or its partitions holds event_id")

	// A table from before 0009: the index, on the parent and so on every partition.
	_, err := pool.Exec(ctx, `CREATE INDEX `+quoteIdent(tb.Name+"_event_idx")+` ON `+quoteIdent(tb.Name)+` (event_id, topic)`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `DELETE FROM omnibus_schema_migrations WHERE table_name = $1 AND version >= 9`, tb.Name)
	require.NoError(t, err)
	require.Equal(t, 1+PartitionsAhead+1+1, eventIndexes(), "the parent's, each partition's and the default partition's")
	require.NoError(t, Migrate(ctx, pool, tb))
	assert.Zero(t, eventIndexes(), "migration 0009 drops it from the parent and every partition")

	ob, err := NewOutbox(OutboxConfig{Table: tb.Name})
	require.NoError(t, err)
	e := event("k", "a")
	enqueue(t, pool, ob, "orders", e)
	enqueue(t, pool, ob, "orders", e)
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+quoteIdent(tb.Name)).Scan(&n))
	assert.Equal(t, 1, n, "an event enqueued twice is still stored once")
}

func TestMigrate_PartitionIntervalOnASingleTableIsRefused(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	name := testenv.Name(t)
	require.NoError(t, Migrate(context.Background(), pool, OutboxTable(name)))
	dropAfter(t, pool, name)
	err := Migrate(context.Background(), pool, Table{Name: name, Kind: KindOutbox, PartitionInterval: time.Hour})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "the table exists as a single table")
}

func TestTable_PartitionIntervalOutOfRangeIsRefusedByName(t *testing.T) {
	t.Parallel()
	for _, d := range []time.Duration{-time.Hour, 30 * time.Second, 90 * time.Second, 32 * 24 * time.Hour} {
		err := Migrate(context.Background(), nil, Table{Name: "x", Kind: KindInbox, PartitionInterval: d})
		require.Error(t, err, "%s", d)
		assert.Contains(t, err.Error(), `inbox table "x": partition interval: must be`, "%s", d)
	}
	sql, err := MigrationSQL(Table{Name: "x", Kind: KindOutbox, PartitionInterval: 31 * 24 * time.Hour})
	require.NoError(t, err, "31 days is the longest interval")
	assert.Contains(t, sql, "PARTITION BY RANGE (created_at)")
}

// A duplicate must be recognised whichever partition holds the first copy:
// a unique index of a partitioned table only sees its own partition.
func TestPartitioned_OutboxDedupSpansPartitions(t *testing.T) {
	t.Parallel()
	pool, tb, p := newPartitioned(t, KindOutbox)
	ctx := context.Background()
	now := dbNow(t, pool)
	createFrom(t, p, now.Add(-time.Hour))
	ob, err := NewOutbox(OutboxConfig{Table: tb.Name})
	require.NoError(t, err)

	// The first copy was written an hour ago, into the previous partition;
	// the copy written now goes to another one.
	first := event("k", "first")
	_, err = pool.Exec(ctx, `INSERT INTO `+quoteIdent(tb.Name)+` (event_id, topic, partition_key, payload, created_at)
VALUES ($1, 'orders', 'k', 'first', now() - interval '1 hour')`, first.UUID)
	require.NoError(t, err)
	prev := tb.Name + "_p" + partitionStart(now, time.Hour).Add(-time.Hour).Format(partitionTimeFormat)
	require.Equal(t, prev, partitionOfRow(t, pool, tb, "true"))

	again := event("k", "again")
	again.UUID = first.UUID
	enqueue(t, pool, ob, "orders", again, event("k", "new"))
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+quoteIdent(tb.Name)+` WHERE event_id = $1`, first.UUID).Scan(&n))
	assert.Equal(t, 1, n, "the same event enqueued in the next partition is stored once")
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+quoteIdent(tb.Name)).Scan(&n))
	assert.Equal(t, 2, n, "a new event is stored")

	// The same event for another topic is another row, as on the single table.
	enqueue(t, pool, ob, "invoices", again)
	_, err = pool.Exec(ctx, `UPDATE `+quoteIdent(tb.Name)+` SET created_at = now() - interval '2 hours'`)
	require.ErrorContains(t, err, "cannot change", "a row never moves between partitions")
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+quoteIdent(tb.Name)+` WHERE event_id = $1`, first.UUID).Scan(&n))
	assert.Equal(t, 2, n)
}

func TestPartitioned_InboxRecognisesARedeliveryAfterTheRollover(t *testing.T) {
	t.Parallel()
	pool, tb, p := newPartitioned(t, KindInbox)
	ctx := context.Background()
	createFrom(t, p, dbNow(t, pool).Add(-time.Hour))
	in, err := NewInbox(InboxConfig{Table: tb.Name})
	require.NoError(t, err)
	ids := map[string]string{"m-1": uuid.NewString(), "m-2": uuid.NewString(), "m-3": uuid.NewString()}
	copyOf := func(id string) *message.Message {
		msg := received("orders", "k", "", id)
		msg.UUID = ids[id]
		return msg
	}

	// The first copy was stored an hour ago, in the previous partition.
	_, err = pool.Exec(ctx, `INSERT INTO `+quoteIdent(tb.Name)+` (message_id, consumer_group, topic, partition_key, payload, created_at)
VALUES ($1, 'billing', 'orders', 'k', 'x', now() - interval '1 hour')`, ids["m-1"])
	require.NoError(t, err)
	before := partitionOfRow(t, pool, tb, "true")

	isNew, err := in.Store(ctx, pool, "billing", copyOf("m-1"), copyOf("m-2"))
	require.NoError(t, err)
	assert.Equal(t, []bool{false, true}, isNew, "the redelivery is a duplicate; the new message is not")
	assert.NotEqual(t, before, partitionOfRow(t, pool, tb, "message_id = $1", ids["m-2"]), "the two copies would be in different partitions")
	isNew, err = in.Store(ctx, pool, "audit", copyOf("m-1"))
	require.NoError(t, err)
	assert.Equal(t, []bool{true}, isNew, "another consumer group stores its own copy")

	// A row the inline consumer removes is forgotten, as on the single table.
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	_, err = in.Store(ctx, tx, "billing", copyOf("m-3"))
	require.NoError(t, err)
	require.NoError(t, in.Remove(ctx, tx, "billing", copyOf("m-3")))
	require.NoError(t, tx.Commit(ctx))
	isNew, err = in.Store(ctx, pool, "billing", copyOf("m-3"))
	require.NoError(t, err)
	assert.Equal(t, []bool{true}, isNew)
}

// insertAt writes an unkeyed row with the given status and creation time
// into the outbox table, as if it had been written then.
func insertAt(t *testing.T, pool *pgxpool.Pool, tb Table, status string, at time.Time) {
	t.Helper()
	_, err := pool.Exec(context.Background(), `INSERT INTO `+quoteIdent(tb.Name)+
		` (event_id, topic, payload, status, created_at) VALUES (gen_random_uuid(), 'orders', 'x', $1, $2)`, status, at)
	require.NoError(t, err)
}

func TestPartitions_MaintenanceDropsOnlyOldPartitionsWithNothingLeftToDeliver(t *testing.T) {
	t.Parallel()
	pool, tb, p := newPartitioned(t, KindOutbox)
	ctx := context.Background()
	now := dbNow(t, pool)
	start := partitionStart(now, time.Hour)
	createFrom(t, p, now.Add(-5*time.Hour)) // five hours back to two hours back
	name := func(h int) string {
		return tb.Name + "_p" + start.Add(time.Duration(-h)*time.Hour).Format(partitionTimeFormat)
	}
	insertAt(t, pool, tb, "completed", start.Add(-5*time.Hour+time.Minute)) // dropped
	insertAt(t, pool, tb, "pending", start.Add(-4*time.Hour+time.Minute))   // kept
	insertAt(t, pool, tb, "completed", start.Add(-4*time.Hour+2*time.Minute))
	insertAt(t, pool, tb, "failed", start.Add(-3*time.Hour+time.Minute)) // kept
	// two hours back: empty, dropped; one hour back was never created.

	admin, err := NewAdmin(pool, tb)
	require.NoError(t, err)
	rep, err := admin.MaintainPartitions(ctx, 30*time.Minute)
	require.NoError(t, err)
	assert.Equal(t, []string{name(5), name(2)}, rep.Dropped)
	assert.Equal(t, []string{name(4), name(3)}, rep.Kept)
	assert.Empty(t, rep.Created, "the current partition and three ahead were there")
	assert.Equal(t, 2+PartitionsAhead+1, rep.Partitions)
	assert.Equal(t, start.Add((PartitionsAhead+1)*time.Hour), rep.CoveredUntil)
	assert.Equal(t, int64(1), rep.DedupForgotten, "the dropped row's dedup entry; those of rows still stored stay")

	var rows int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+quoteIdent(tb.Name)).Scan(&rows))
	assert.Equal(t, 3, rows, "the pending and failed rows and the completed row beside the pending one are kept")

	h, err := admin.Health(ctx)
	require.NoError(t, err)
	assert.True(t, h.Partitioned)
	assert.Equal(t, rep.Partitions, h.Partitions)
	assert.Equal(t, rep.CoveredUntil, h.CoveredUntil)

	// Retention 0 drops nothing.
	insertAt(t, pool, tb, "completed", start.Add(-4*time.Hour+3*time.Minute))
	_, err = pool.Exec(ctx, `UPDATE `+quoteIdent(tb.Name)+` SET status = 'completed' WHERE status <> 'completed'`)
	require.NoError(t, err)
	rep, err = admin.MaintainPartitions(ctx, 0)
	require.NoError(t, err)
	assert.Empty(t, rep.Dropped)
	rep, err = admin.MaintainPartitions(ctx, 30*time.Minute)
	require.NoError(t, err)
	assert.Equal(t, []string{name(4), name(3)}, rep.Dropped, "once their rows are delivered")
}

func TestPartitions_TwoMaintainersAtOnceNeitherFailsNorDropsTwice(t *testing.T) {
	t.Parallel()
	pool, tb, p := newPartitioned(t, KindOutbox)
	ctx := context.Background()
	now := dbNow(t, pool)
	createFrom(t, p, now.Add(-8*time.Hour))
	createFrom(t, p, now.Add(-4*time.Hour))
	old := len(partitionsOf(t, p)) - (PartitionsAhead + 1)
	require.Equal(t, 8, old)

	var (
		mu      sync.Mutex
		dropped []string
		wg      sync.WaitGroup
	)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			other := newPartitioner(pool, p.tn, false)
			for range 5 {
				rep, err := other.maintain(ctx, time.Hour)
				assert.NoError(t, err)
				mu.Lock()
				dropped = append(dropped, rep.Dropped...)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	sort.Strings(dropped)
	assert.Len(t, dropped, 7, "every partition that ended more than an hour ago, once: %v", dropped)
	assert.Len(t, partitionsOf(t, p), 1+PartitionsAhead+1)
	ob, err := NewOutbox(OutboxConfig{Table: tb.Name})
	require.NoError(t, err)
	enqueue(t, pool, ob, "orders", event("k", "after"))
}

// A maintainer that dies while it drops a partition (its backend terminated
// while the detach waits for a lock) leaves a working table: the partition
// is still attached with its rows, writers and relays carry on, and the
// next round drops it.
func TestPartitions_AMaintainerKilledMidDropLeavesAWorkingTable(t *testing.T) {
	t.Parallel()
	pool, tb, p := newPartitioned(t, KindOutbox)
	ctx := context.Background()
	now := dbNow(t, pool)
	createFrom(t, p, now.Add(-3*time.Hour))
	insertAt(t, pool, tb, "completed", partitionStart(now, time.Hour).Add(-3*time.Hour+time.Minute))
	old := tb.Name + "_p" + partitionStart(now, time.Hour).Add(-3*time.Hour).Format(partitionTimeFormat)

	// A reader holds the table: the detach waits for it.
	blocker, err := pool.Begin(ctx)
	require.NoError(t, err)
	_, err = blocker.Exec(ctx, `SELECT count(*) FROM `+quoteIdent(tb.Name))
	require.NoError(t, err)

	done := make(chan error, 1)
	go func() {
		_, err := p.maintain(ctx, time.Minute)
		done <- err
	}()
	var killed bool
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline) && !killed; {
		require.NoError(t, pool.QueryRow(ctx, `
SELECT count(pg_terminate_backend(pid)) > 0 FROM pg_stat_activity
WHERE query LIKE 'ALTER TABLE%DETACH PARTITION%' AND query LIKE '%' || $1 || '%' AND wait_event_type = 'Lock'`, old).Scan(&killed))
		time.Sleep(5 * time.Millisecond)
	}
	require.True(t, killed, "the maintainer's detach was seen waiting")
	require.Error(t, <-done)
	require.NoError(t, blocker.Rollback(ctx))

	assert.Contains(t, partitionsOf(t, p), old, "the partition is still attached")
	ob, err := NewOutbox(OutboxConfig{Table: tb.Name})
	require.NoError(t, err)
	enqueue(t, pool, ob, "orders", event("k", "after the crash"))
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+quoteIdent(tb.Name)).Scan(&n))
	assert.Equal(t, 2, n)

	rep, err := p.maintain(ctx, time.Minute)
	require.NoError(t, err)
	assert.False(t, rep.Skipped, "the dead maintainer's lock went with its connection")
	assert.Contains(t, rep.Dropped, old)
}

// A long transaction that read the table holds a detach back: the round
// gives up after its lock timeout instead of queueing every writer behind
// it for as long as the transaction runs, and says so.
func TestPartitions_ADropALongTransactionHoldsBackIsDeferred(t *testing.T) {
	t.Parallel()
	pool, tb, p := newPartitioned(t, KindOutbox)
	ctx := context.Background()
	now := dbNow(t, pool)
	createFrom(t, p, now.Add(-3*time.Hour))
	blocker, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = blocker.Rollback(ctx) }()
	_, err = blocker.Exec(ctx, `SELECT count(*) FROM `+quoteIdent(tb.Name))
	require.NoError(t, err)

	rep, err := p.maintain(ctx, time.Minute)
	require.NoError(t, err)
	assert.NotEmpty(t, rep.Deferred)
	assert.Empty(t, rep.Dropped)
}

func TestSubscriber_CreatesPartitionsAhead(t *testing.T) {
	t.Parallel()
	pool, tb, p := newPartitioned(t, KindOutbox)
	ctx := context.Background()
	names := partitionsOf(t, p)
	last := names[len(names)-1]
	_, err := pool.Exec(ctx, `DROP TABLE `+quoteIdent(last))
	require.NoError(t, err)

	sub, err := NewSubscriber(pool, SubscriberConfig{Table: tb.Name, SweepInterval: -1}, nil)
	require.NoError(t, err)
	defer func() { require.NoError(t, sub.Close()) }()
	require.Eventually(t, func() bool {
		got := partitionsOf(t, p)
		return len(got) == len(names) && strings.HasSuffix(got[len(got)-1], last[len(tb.Name):])
	}, 10*time.Second, 50*time.Millisecond, "the subscriber created the missing partition")
}

// deliverAll subscribes to table and acks n messages, returning their
// payloads per key in delivery order.
func deliverAll(t *testing.T, pool *pgxpool.Pool, table string, n int) map[string][]string {
	t.Helper()
	sub, err := NewSubscriber(pool, SubscriberConfig{Table: table, PollInterval: 50 * time.Millisecond, SweepInterval: -1}, nil)
	require.NoError(t, err)
	defer func() { require.NoError(t, sub.Close()) }()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ch, err := sub.Subscribe(ctx, AllTopics)
	require.NoError(t, err)
	got := map[string][]string{}
	for range n {
		select {
		case m := <-ch:
			key := string(m.Payload[:strings.IndexByte(string(m.Payload), '-')])
			got[key] = append(got[key], string(m.Payload))
			m.Ack()
		case <-ctx.Done():
			t.Fatalf("delivered %v of %d", got, n)
		}
	}
	return got
}

// The conversion path of docs/operations.md ("Converting a single table"):
// writers move to a new partitioned table while the old one still holds
// pending rows; the old table's relay drains it before the new table's
// relay starts. Nothing is lost and every key keeps its order across the
// two tables.
func TestConvert_SingleToPartitionedKeepsEveryRowAndTheOrder(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	ctx := context.Background()
	oldName := testenv.Name(t)
	newName := oldName[:len(oldName)-1] + "p"
	require.NoError(t, Migrate(ctx, pool, OutboxTable(oldName)))
	dropAfter(t, pool, oldName)
	require.NoError(t, Migrate(ctx, pool, Table{Name: newName, Kind: KindOutbox, PartitionInterval: 24 * time.Hour}))
	dropAfter(t, pool, newName)
	oldOB, err := NewOutbox(OutboxConfig{Table: oldName})
	require.NoError(t, err)
	newOB, err := NewOutbox(OutboxConfig{Table: newName})
	require.NoError(t, err)

	keys := []string{"a", "b", "c"}
	want := map[string][]string{}
	write := func(ob *Outbox, from, to int) {
		for i := from; i < to; i++ {
			for _, k := range keys {
				p := k + "-" + fmt.Sprintf("%03d", i)
				enqueue(t, pool, ob, "orders", event(k, p))
				want[k] = append(want[k], p)
			}
		}
	}
	write(oldOB, 0, 20)  // 1. the old table's backlog
	write(newOB, 20, 40) // 2. writers switched; no relay of the new table yet

	got := deliverAll(t, pool, oldName, 60) // 3. the old relay drains its table
	admin, err := NewAdmin(pool, OutboxTable(oldName))
	require.NoError(t, err)
	st, err := admin.Stats(ctx)
	require.NoError(t, err)
	require.Zero(t, st.Pending, "the old table is drained")
	for k, ps := range deliverAll(t, pool, newName, 60) { // 4. the new relay starts
		got[k] = append(got[k], ps...)
	}
	assert.Equal(t, want, got, "every event, in order per key, across the two tables")
}

// The configuration reaches the subscribers: each maintains its table with
// its kind's retention.
func TestSubscriberFromConfig_PartitionRetentionIsTheTablesRetention(t *testing.T) {
	t.Parallel()
	cfg := bus.Config{Outbox: bus.OutboxConfig{Retention: 48 * time.Hour}, Inbox: bus.InboxConfig{Retention: 72 * time.Hour}}
	assert.Equal(t, 48*time.Hour, SubscriberFromConfig(cfg, SubscriberConfig{}).PartitionRetention)
	assert.Equal(t, 72*time.Hour, SubscriberFromConfig(cfg, SubscriberConfig{Kind: KindInbox}).PartitionRetention)
	assert.Equal(t, bus.DefaultRetention, SubscriberFromConfig(bus.Config{}, SubscriberConfig{}).PartitionRetention)
}
