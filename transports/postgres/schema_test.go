package postgres

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omnibus-go/omnibus/internal/testenv"
)

func TestMigrate_IsIdempotentAndCreatesIndexes(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	ctx := context.Background()
	schema := testenv.Name(t)
	out, in := schema+".outbox", schema+".inbox"
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), `DROP SCHEMA `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)
	})
	require.NoError(t, Migrate(ctx, pool, OutboxTable(out), InboxTable(in)))
	require.NoError(t, Migrate(ctx, pool, OutboxTable(out), InboxTable(in)), "running Migrate again is a no-op")

	indexes := func(table string) []string {
		rows, err := pool.Query(ctx, `SELECT indexname FROM pg_indexes WHERE schemaname = $1 AND tablename = $2 ORDER BY 1`, schema, table)
		require.NoError(t, err)
		names, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return names
	}
	assert.Subset(t, indexes("outbox"), []string{"outbox_event_uidx", "outbox_fetch_idx", "outbox_key_idx", "outbox_failed_idx", "outbox_completed_idx"})
	assert.Subset(t, indexes("inbox"), []string{"inbox_message_uidx", "inbox_fetch_idx", "inbox_key_idx", "inbox_failed_idx", "inbox_completed_idx"})
	assert.Subset(t, indexes("outbox_lanes"), []string{"outbox_lanes_ready_idx", "outbox_lanes_pkey"})
	assert.Subset(t, indexes("inbox_lanes"), []string{"inbox_lanes_ready_idx", "inbox_lanes_pkey"})

	var versions int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+pgx.Identifier{schema, "omnibus_schema_migrations"}.Sanitize()).Scan(&versions))
	assert.Equal(t, 2*len(migrations), versions, "each migration recorded once per table")
}

func TestDrop_RemovesWhatMigrateMadeSoMigrateStartsOver(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	ctx := context.Background()
	schema := testenv.Name(t)
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), `DROP SCHEMA `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)
	})
	tables := []Table{OutboxTable(schema + ".outbox"), InboxTable(schema + ".inbox")}
	require.NoError(t, Migrate(ctx, pool, tables...))
	objects := func() (n int) {
		require.NoError(t, pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM pg_tables WHERE schemaname = $1 AND tablename <> 'omnibus_schema_migrations')
			+ (SELECT count(*) FROM pg_proc p JOIN pg_namespace s ON s.oid = p.pronamespace WHERE s.nspname = $1)
			+ (SELECT count(*) FROM `+pgx.Identifier{schema, "omnibus_schema_migrations"}.Sanitize()+`)`, schema).Scan(&n))
		return n
	}
	require.Equal(t, 6+6+2*len(migrations), objects(), "two tables, two lanes tables, two lane notes tables, four trigger functions and two lane lock functions, the migration records")

	require.NoError(t, Drop(ctx, pool, tables...))
	assert.Zero(t, objects(), "Drop leaves no table, function or migration record of its tables")
	require.NoError(t, Drop(ctx, pool, tables...), "dropping what is not there is a no-op")
	require.NoError(t, Migrate(ctx, pool, tables...))
	assert.Equal(t, 6+6+2*len(migrations), objects(), "Migrate starts over after Drop")
	assert.Error(t, Drop(ctx, pool), "Drop needs its tables named")
}

func TestMigrationSQL_PrintsQuotedIdentifiers(t *testing.T) {
	t.Parallel()
	sql, err := MigrationSQL(OutboxTable("events.Outbox"))
	require.NoError(t, err)
	assert.Contains(t, sql, `CREATE TABLE IF NOT EXISTS "events"."Outbox"`)
	assert.Contains(t, sql, `"events"."Outbox_lanes"`)
}

func TestTableNames_InvalidAreRefusedBeforeAnySQL(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	for _, name := range []string{"bad name", "x; DROP TABLE y", `"quoted"`, "a.b.c", "1abc", strings.Repeat("x", 60), ".x", "x."} {
		t.Run(name, func(t *testing.T) {
			err := Migrate(context.Background(), pool, OutboxTable(name))
			require.Error(t, err)
			assert.Contains(t, err.Error(), "outbox table")
			_, err = NewOutbox(OutboxConfig{Table: name})
			require.ErrorContains(t, err, "invalid config: Table")
			_, err = NewSubscriber(pool, SubscriberConfig{Table: name}, nil)
			require.ErrorContains(t, err, "invalid config: Table")
		})
	}
}

func TestSubscriberConfig_BadValuesNameTheField(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	for _, tc := range []struct {
		field string
		cfg   SubscriberConfig
	}{
		{"BatchSize", SubscriberConfig{BatchSize: -1}},
		{"RunLength", SubscriberConfig{RunLength: -3}},
		{"MaxInFlight", SubscriberConfig{MaxInFlight: -1}},
		{"Lease", SubscriberConfig{Lease: -time.Second}},
		{"Lease", SubscriberConfig{Lease: time.Millisecond}},
		{"PollInterval", SubscriberConfig{PollInterval: -time.Second}},
		{"SettleInterval", SubscriberConfig{SettleInterval: -time.Second}},
		{"CloseTimeout", SubscriberConfig{CloseTimeout: -time.Second}},
		{"TransientDelay", SubscriberConfig{TransientDelay: -time.Second}},
		{"ConsumerGroup", SubscriberConfig{Kind: KindInbox}},
		{"ConsumerGroup", SubscriberConfig{ConsumerGroup: "g"}},
		{"FailedPolicy", SubscriberConfig{FailedPolicy: 7}},
	} {
		_, err := NewSubscriber(pool, tc.cfg, nil)
		require.Error(t, err, "%+v", tc.cfg)
		assert.Contains(t, err.Error(), "invalid config: "+tc.field, "%+v", tc.cfg)
	}
	_, err := NewSubscriber(nil, SubscriberConfig{}, nil)
	assert.ErrorContains(t, err, "pool")
}

func countRows(t *testing.T, ob *Outbox) int {
	t.Helper()
	var n int
	require.NoError(t, testenv.Postgres(t).QueryRow(context.Background(), `SELECT count(*) FROM `+ob.q.table.quoted()).Scan(&n))
	return n
}

func TestEnqueue_BadInputNamesTheFieldAndWritesNothing(t *testing.T) {
	t.Parallel()
	pool, ob := newOutbox(t)
	ctx := context.Background()
	big := message.NewMessage(watermill.NewUUID(), make([]byte, DefaultMaxPayloadBytes+1))
	hugeMeta := event("k", "x")
	hugeMeta.Metadata.Set("blob", strings.Repeat("m", DefaultMaxMetadataBytes))
	farFuture := event("k", "x")
	SetDeliverAt(farFuture, time.Now().Add(400*24*time.Hour))
	badAttempts := event("k", "x")
	SetMaxAttempts(badAttempts, 0)
	notUUID := message.NewMessage("order-1", []byte("x"))
	for _, tc := range []struct {
		field string
		msg   *message.Message
	}{
		{"Payload", big},
		{"Metadata", hugeMeta},
		{MetaDeliverAt, farFuture},
		{MetaMaxAttempts, badAttempts},
		{"UUID", notUUID},
	} {
		// A good message first: nothing of the call may be written.
		err := ob.Enqueue(ctx, pool, "t", event("k", "good"), tc.msg)
		require.Error(t, err, tc.field)
		assert.Contains(t, err.Error(), tc.field)
		var invalid *InvalidMessageError
		assert.ErrorAs(t, err, &invalid)
	}
	assert.ErrorContains(t, ob.Enqueue(ctx, pool, "", event("k", "x")), "topic")
	assert.Zero(t, countRows(t, ob), "a refused call writes nothing")
	_, err := NewOutbox(OutboxConfig{MaxPayloadBytes: -1})
	assert.ErrorContains(t, err, "invalid config: MaxPayloadBytes")
	_, err = NewOutbox(OutboxConfig{MaxDeliverAhead: -time.Hour})
	assert.ErrorContains(t, err, "invalid config: MaxDeliverAhead")
}

func TestEnqueue_SameEventTwiceIsANoOpInsideTheCallersTransaction(t *testing.T) {
	t.Parallel()
	pool, ob := newOutbox(t)
	ctx := context.Background()
	msg := event("k", "once")
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := ob.Enqueue(ctx, tx, "t", msg); err != nil {
			return err
		}
		if err := ob.Enqueue(ctx, tx, "t", msg); err != nil {
			return fmt.Errorf("second enqueue: %w", err)
		}
		_, err := tx.Exec(ctx, "SELECT 1") // the transaction is still usable
		return err
	})
	require.NoError(t, err)
	require.NoError(t, ob.Enqueue(ctx, pool, "t", msg))
	assert.Equal(t, 1, countRows(t, ob))
}

func TestEnqueue_RolledBackTransactionLeavesNothing(t *testing.T) {
	t.Parallel()
	pool, ob := newOutbox(t)
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, ob.Enqueue(ctx, tx, "t", event("k", "x")))
	require.NoError(t, tx.Rollback(ctx))
	assert.Zero(t, countRows(t, ob))
	var lanes int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+ob.q.table.derived("_lanes").quoted()).Scan(&lanes))
	assert.Zero(t, lanes, "the lane upsert rolls back with the event")
}

func TestEnqueue_OptionsLandInColumns(t *testing.T) {
	t.Parallel()
	pool, ob := newOutbox(t)
	ctx := context.Background()
	msg := event("order-7", "x")
	msg.Metadata.Set("event_type", "order.paid")
	msg.Metadata.Set("custom", "kept")
	at := time.Now().Add(time.Hour).Truncate(time.Microsecond)
	SetDeliverAt(msg, at)
	SetMaxAttempts(msg, 3)
	require.NoError(t, ob.Enqueue(ctx, pool, "orders", msg))
	var (
		key, typ string
		maxAtt   int
		sched    time.Time
		meta     map[string]string
	)
	require.NoError(t, pool.QueryRow(ctx, `SELECT partition_key, event_type, max_attempts, scheduled_at, metadata FROM `+ob.q.table.quoted()).
		Scan(&key, &typ, &maxAtt, &sched, &meta))
	assert.Equal(t, "order-7", key)
	assert.Equal(t, "order.paid", typ)
	assert.Equal(t, 3, maxAtt)
	assert.True(t, at.Equal(sched), "scheduled_at %s, want %s", sched, at)
	assert.Equal(t, "kept", meta["custom"])
	assert.NotContains(t, meta, MetaDeliverAt, "steering metadata is not stored with the event")
}

// The candidate query must use the per-key index and the lanes, not scan
// the table, on a realistically sized outbox.
func TestFetch_QueryPlanUsesIndexes(t *testing.T) {
	t.Parallel()
	pool, ob := newOutbox(t)
	ctx := context.Background()
	tbl := ob.q.table.quoted()
	_, err := pool.Exec(ctx, `INSERT INTO `+tbl+` (event_id, topic, partition_key, payload, status, completed_at)
		SELECT gen_random_uuid(), 't', 'k' || (g % 1000), '\x00', CASE WHEN g <= 90000 THEN 'completed' ELSE 'pending' END,
		       CASE WHEN g <= 90000 THEN now() END
		FROM generate_series(1, 100000) g`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `ANALYZE `+tbl+`; ANALYZE `+ob.q.table.derived("_lanes").quoted())
	require.NoError(t, err)
	var topic *string
	keys := make([]string, 100)
	for i := range keys {
		keys[i] = fmt.Sprintf("k%d", i)
	}
	g, tp := make([]string, 100), make([]string, 100)
	for i := range tp {
		tp[i] = "t"
	}
	rows, err := pool.Query(ctx, "EXPLAIN "+ob.q.pick, "w", time.Second, g, tp, keys, 16, 100, topic, "", false, make([]int64, 100), false)
	require.NoError(t, err)
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	plan := strings.Join(lines, "\n")
	// The index that serves the rows: the table's, or in the partitioned
	// layout the one of the partition that holds them (every row is in the
	// current partition).
	index := func(idx string) string {
		if !testPartitioned() {
			return ob.q.table.name + idx
		}
		var name string
		require.NoError(t, pool.QueryRow(ctx, `
SELECT i.relid::regclass::text FROM pg_partition_tree($1::regclass) i
JOIN pg_index x ON x.indexrelid = i.relid
WHERE x.indrelid = (SELECT tableoid FROM `+tbl+` LIMIT 1)`, ob.q.table.derived(idx).quoted()).Scan(&name))
		return name
	}
	table := ob.q.table.name
	if testPartitioned() {
		require.NoError(t, pool.QueryRow(ctx, `SELECT tableoid::regclass::text FROM `+tbl+` LIMIT 1`).Scan(&table))
	}
	assert.Contains(t, plan, "using "+index("_key_idx")+" ", "the per-key candidate scan uses the per-key index:\n%s", plan)
	assert.Contains(t, plan, "using "+index("_fetch_idx")+" ", "the unkeyed fetch uses the fetch index:\n%s", plan)
	assert.NotContains(t, plan, "Seq Scan on "+table+" ", "no sequential scan of the outbox:\n%s", plan)
}

// The fetch leases the rows it picked through the primary key, on a table
// (or partition) nobody has analysed yet: by id alone on a partition, whose
// primary key is (id, created_at), the planner read each picked row through
// the key index with only its id to go by, a scan of the whole index per
// row (found in the partitioned layout's BenchmarkWALPerEvent: 90-130 ms
// per fetch, the writers of its keys waiting for it).
func TestFetch_LeasesPickedRowsThroughThePrimaryKey(t *testing.T) {
	t.Parallel()
	pool, ob := newOutbox(t)
	ctx := context.Background()
	_, err := pool.Exec(ctx, `INSERT INTO `+ob.q.table.quoted()+` (event_id, topic, partition_key, payload)
		SELECT gen_random_uuid(), 't', 'k' || (g % 1000), '\x00' FROM generate_series(1, 20000) g`)
	require.NoError(t, err)
	keys := make([]string, 100)
	g, tp := make([]string, 100), make([]string, 100)
	for i := range keys {
		keys[i], tp[i] = fmt.Sprintf("k%d", i), "t"
	}
	for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, `SELECT set_config('plan_cache_mode', $1, true)`, mode)
		require.NoError(t, err)
		rows, err := tx.Query(ctx, "EXPLAIN "+ob.q.pick, "w", time.Second, g, tp, keys, 16, 100, (*string)(nil), "", false, make([]int64, 100), false)
		require.NoError(t, err)
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		require.NoError(t, tx.Rollback(ctx))
		// Every lookup by id, of every partition (the empty ones fill
		// later, under a plan made now), goes through a primary key.
		for i, line := range lines[:len(lines)-1] {
			next := lines[i+1]
			if strings.Contains(line, "Index Scan using ") && (strings.Contains(next, "Index Cond: (id = ") || strings.Contains(next, "Index Cond: ((id = ")) {
				assert.Regexp(t, `_pkey\d* on `, line, "%s: a row looked up by id through another index than the primary key:\n%s", mode, strings.Join(lines, "\n"))
			}
		}
	}
}
