package postgres

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omnibus-go/omnibus/internal/sqlfile"
	"github.com/omnibus-go/omnibus/internal/testenv"
)

// Statements that only one kind of table has the columns for.
var (
	outboxOnly = map[string]bool{"InsertOutbox": true}
	inboxOnly  = map[string]bool{"InsertInbox": true, "RemoveInbox": true, "ConsumerGroups": true}
)

// prepareAll prepares every statement of sql/ (fragments inside the
// statements that use them) for v, on a connection where v's tables exist.
// It returns how many it prepared.
func prepareAll(t *testing.T, conn *pgxpool.Conn, v vocab, partitioned bool) int {
	t.Helper()
	ctx := context.Background()
	// The statements of partitions.sql take a partition and its bounds per
	// call: the default partition stands in for one.
	r := strings.NewReplacer(append([]string{
		"{P}", v.t.qualifiedIdent("_default"), "{DEFAULT}", v.t.qualifiedIdent("_default"),
		"{FROM}", "2026-01-01T00:00:00Z", "{TO}", "2026-01-01T01:00:00Z", "{STORAGE}", partitionStorage,
	}, v.pairs()...)...)
	a := newAdminQueries(v.t, v.inbox, v.byGroup)
	every := FailedFilter{Topic: "t", PartitionKey: "k", ErrorContains: "e"}
	every.CreatedFrom, every.CreatedBefore = time.Now(), time.Now()
	n := 0
	for _, name := range statements.Names() {
		b := statements.Block(name)
		switch {
		case b.Fragment:
			continue // prepared inside the statements that use them
		case outboxOnly[name] && v.inbox, inboxOnly[name] && !v.inbox:
			continue
		case name == "CreateSchema" && v.t.schema == "":
			continue
		case b.File == "partitions.sql" && !partitioned:
			continue // they need the partitioned layout's objects
		}
		var sql string
		switch name {
		case "Listen", "Unlisten":
			sql = channelSQL(name, v.t.channel())
		case "ListFailed":
			sql = a.failedMatching(every)
		case "CountFailed":
			sql = a.countMatching(every)
		default:
			sql = statements.Render(name, r)
		}
		if strings.Contains(sql, "@") {
			// Admin's statements take pgx.NamedArgs, which pgx rewrites to
			// $n before the server sees them; do the same.
			var err error
			sql, _, err = pgx.NamedArgs{}.RewriteQuery(ctx, conn.Conn(), sql, nil)
			require.NoError(t, err, "rewrite the named arguments of %s", name)
		}
		_, err := conn.Conn().PgConn().Prepare(ctx, "", sql, nil)
		require.NoError(t, err, "statement %s (sql/%s) does not prepare against %s %s (group filter %v):\n%s",
			name, b.File, map[bool]string{false: "outbox", true: "inbox"}[v.inbox], v.t, v.byGroup, sql)
		n++
	}
	return n
}

// Every statement of every file parses and plans against real, migrated
// tables of each kind, in a schema of its own and not, for every consumer
// group and for one: PREPARE resolves every table, column, type and
// parameter, and refuses two statements in one block.
func TestSQLFiles_EveryStatementPreparesAgainstMigratedTables(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	ctx := context.Background()
	name := testenv.Name(t)
	if len(name) > 40 { // room for the suffixes
		name = name[len(name)-40:]
	}
	name = "q" + name
	schema := "s_" + name
	tables := []Table{OutboxTable(name + "_o"), InboxTable(name + "_i"),
		OutboxTable(schema + ".o"), InboxTable(schema + ".i"),
		{Name: name + "_po", Kind: KindOutbox, PartitionInterval: time.Hour},
		{Name: schema + ".pi", Kind: KindInbox, PartitionInterval: time.Hour}}
	require.NoError(t, Migrate(ctx, pool, tables...))
	t.Cleanup(func() {
		_ = Drop(context.Background(), pool, tables...)
		_, _ = pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+quoteIdent(schema)+` CASCADE`)
	})
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()

	prepared := 0
	for _, tb := range tables {
		tn, err := parseTableName(tb.Name)
		require.NoError(t, err)
		inbox := tb.Kind == KindInbox
		partitioned := tb.PartitionInterval > 0
		prepared += prepareAll(t, conn, vocab{t: tn, inbox: inbox}, partitioned)
		if inbox {
			prepared += prepareAll(t, conn, vocab{t: tn, inbox: true, byGroup: true}, partitioned)
		}
	}
	assert.Greater(t, prepared, 3*len(statements.Names()), "every statement was prepared for several tables")
}

// A statement that no code names any more is dead: it must leave the files,
// not linger there unreviewed. Every name in sql/ is spelled out by a string
// literal of the package's Go code, and the components look them up when
// they are built.
func TestSQLFiles_EveryStatementIsUsed(t *testing.T) {
	unused, err := sqlfile.Unreferenced(statements, ".")
	require.NoError(t, err)
	assert.Empty(t, unused, "statements in sql/ that no Go file of the package looks up")

	tn, err := parseTableName("used_check")
	require.NoError(t, err)
	newQueries(tn, false)
	newQueries(tn, true)
	newAdminQueries(tn, false, false)
	newAdminQueries(tn, true, false)
	newAdminQueries(tn, true, true)
	looked := statements.LookedUp()
	for _, name := range []string{"InsertOutbox", "InsertInbox", "Pick", "Settle", "CompleteRow", "Overview",
		"CompletedCapped", "CompletedNotCounted", "FilterTopic", "ConsumerGroups", "AppliedVersion"} {
		assert.True(t, looked[name], "building the components looks up %s", name)
	}
}

// Looking up a statement that no file defines is a programming error, and it
// fails loudly, naming the statement.
func TestSQLFiles_MissingStatementPanics(t *testing.T) {
	assert.PanicsWithValue(t, `sqlfile: no statement named "NoSuchStatement" (the .sql files define `+
		strings.Join(statements.Names(), ", ")+`)`,
		func() { vocab{}.renderer().sql("NoSuchStatement") })
}

// The settlement's plan (pgx prepares it, and PostgreSQL switches a
// prepared statement to its generic plan, which estimates the arrays at 10
// elements) never re-reads the ack array for each row: a nested loop with
// a join filter, quadratic in the batch, was 157 ms for 1,000 acks instead
// of 14, the relay's bottleneck in BenchmarkRelayDrain (6.9k events/s
// before, 22k after). The statistics are those of a table analysed while
// no row was leased (locked_by all NULL), which made the planner expect one
// leased row; the engine runs SettlePlans before Settle.
func TestSettle_PlanHashesTheAcksAgainstTheirRows(t *testing.T) {
	t.Parallel()
	pool, ob := newOutbox(t)
	ids, _ := seedLeased(t, pool, ob, 20000)
	ones := "{" + strings.Repeat("1,", 999) + "1}"
	for _, mode := range []string{"force_generic_plan", "force_custom_plan"} {
		plan := explainAfterSettlePlans(t, pool, ob, ob.q.settle, mode,
			`'w', '`+ids+`', '{}', '{}', '{}', '{}', '{}', '{}', '{}', '{}', '{}', '`+ones+`', '{t}', '{k1}', '', '`+ones+`'`)
		assert.NotContains(t, plan, "Join Filter: (t.id = u.id)", "%s: a join filter re-reads the acks for each row:\n%s", mode, plan)
		assert.NotContains(t, plan, "Nested Loop", "%s: no nested loop over the arrays:\n%s", mode, plan)
	}
}

// The settlement reads its rows through the primary key even when its plan
// was made while the table was empty. pgx prepares it and PostgreSQL keeps
// a generic plan per connection until the table's statistics change; on a
// table nobody analyses (autovacuum off, or a partition created ahead and
// not yet analysed) a plan made at the start, when a sequential scan was
// the cheapest, read the whole table (partition) for every settlement, and
// each one took longer as the table grew (found in the partitioned
// layout's soak: 97 ms per settlement of 10 rows after two minutes).
func TestSettle_PlanReadsRowsByIdEvenWhenPlannedOnAnEmptyTable(t *testing.T) {
	t.Parallel()
	pool, ob := newOutbox(t)
	for _, mode := range []string{"force_generic_plan", "force_custom_plan"} {
		plan := explainAfterSettlePlans(t, pool, ob, ob.q.settle, mode,
			`'w', '{1,2,3}', '{4}', '{5}', '{n}', '{1}', '{false}', '{NULL}', '{e}', '{1}', '{1}', '{1,1,1}', '{t}', '{k}', '', '{1,1,0}'`)
		assert.NotContains(t, plan, "Seq Scan on "+ob.q.table.name, "%s: a settlement reads the whole table:\n%s", mode, plan)
	}
}

// Lease renewal reads the rows of a relay in flight by id: joined with the
// rows it locks by id alone, on a partition nobody had analysed, the
// planner hashed the join over a scan of the whole partition, at every
// renewal (seen in the partitioned layout's soak).
func TestExtendRows_PlanReadsRowsById(t *testing.T) {
	t.Parallel()
	pool, ob := newOutbox(t)
	ids, holder := seedLeased(t, pool, ob, 50000)
	plan := explainAfterSettlePlans(t, pool, ob, ob.q.extendRows, "auto", `'w', '30s', '`+ids+`'`) // as engine.extend sends it
	assert.NotContains(t, plan, "Seq Scan on "+strings.Trim(holder, `"`)+" ", "lease renewal reads the whole table:\n%s", plan)
}

// seedLeased inserts n keyed rows, analyses the table while none is leased,
// then leases the first thousand to worker "w" (a relay's rows in flight:
// statistics that expect one leased row). It returns their ids as an array
// literal and the table, or the partition, that holds them.
func seedLeased(t *testing.T, pool *pgxpool.Pool, ob *Outbox, n int) (ids, holder string) {
	t.Helper()
	ctx := context.Background()
	table := ob.q.table.quoted()
	_, err := pool.Exec(ctx, `INSERT INTO `+table+` (event_id, topic, partition_key, payload)
		SELECT gen_random_uuid(), 't', 'k' || (i % 1000), '\x00' FROM generate_series(1, $1) i`, n)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `ANALYZE `+table)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE `+table+` SET locked_by = 'w', attempts = 1 WHERE id IN (SELECT id FROM `+table+` ORDER BY id LIMIT 1000)`)
	require.NoError(t, err)
	require.NoError(t, pool.QueryRow(ctx, `SELECT array_agg(id)::text, min(tableoid::regclass::text) FROM `+table+` WHERE locked_by = 'w'`).Scan(&ids, &holder))
	return ids, holder
}

// explainAfterSettlePlans prepares stmt and returns the plan of executing
// it with args under plan_cache_mode mode, after SettlePlans, in a
// transaction it rolls back: as the engine sends Settle and ExtendRows.
func explainAfterSettlePlans(t *testing.T, pool *pgxpool.Pool, ob *Outbox, stmt, mode, args string) string {
	t.Helper()
	ctx := context.Background()
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, `PREPARE omnibus_plan_under_test AS `+stmt)
	require.NoError(t, err)
	defer func() { _, _ = conn.Exec(ctx, `DEALLOCATE omnibus_plan_under_test`) }()
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `SELECT set_config('plan_cache_mode', $1, true)`, mode)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, ob.q.settlePlans)
	require.NoError(t, err)
	rows, err := tx.Query(ctx, `EXPLAIN EXECUTE omnibus_plan_under_test(`+args+`)`)
	require.NoError(t, err)
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return strings.Join(lines, "\n")
}

// PlanJoins puts back the planner settings SettlePlans turned off, as the
// session had them (a session that turned sequential scans off itself keeps
// them off), for the statements after the settlement in engine.next.
func TestPlanJoins_PutsBackWhatSettlePlansChanged(t *testing.T) {
	t.Parallel()
	pool, ob := newOutbox(t)
	ctx := context.Background()
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	defer func() { _, _ = conn.Exec(ctx, `RESET enable_nestloop; RESET enable_seqscan`) }()
	for _, session := range []struct{ nestloop, seqscan string }{{"on", "on"}, {"on", "off"}, {"off", "on"}} {
		_, err := conn.Exec(ctx, `SELECT set_config('enable_nestloop', $1, false), set_config('enable_seqscan', $2, false)`,
			session.nestloop, session.seqscan)
		require.NoError(t, err)
		tx, err := conn.Begin(ctx)
		require.NoError(t, err)
		var nestloop, seqscan string
		_, err = tx.Exec(ctx, ob.q.settlePlans)
		require.NoError(t, err)
		require.NoError(t, tx.QueryRow(ctx, `SELECT current_setting('enable_nestloop'), current_setting('enable_seqscan')`).Scan(&nestloop, &seqscan))
		assert.Equal(t, []string{"off", "off"}, []string{nestloop, seqscan}, "after SettlePlans")
		_, err = tx.Exec(ctx, ob.q.planJoins)
		require.NoError(t, err)
		require.NoError(t, tx.QueryRow(ctx, `SELECT current_setting('enable_nestloop'), current_setting('enable_seqscan')`).Scan(&nestloop, &seqscan))
		assert.Equal(t, []string{session.nestloop, session.seqscan}, []string{nestloop, seqscan}, "after PlanJoins, the session's")
		require.NoError(t, tx.Rollback(ctx))
	}
}
