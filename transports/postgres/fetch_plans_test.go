package postgres

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A fetch reads its rows through indexes even when its plans were made while
// the table was empty. pgx prepares the fetch's statements and PostgreSQL
// keeps a generic plan per connection until the table's statistics change;
// on a table analysed while empty (a freshly migrated one, on a server whose
// autovacuum has just come by) Pick's plan read the table sequentially for
// each lane and each picked row, at every fetch (BenchmarkNotifyLatency:
// commit→delivery p50 1.4–1.5 ms with sequential scans off, 2.9–4.0 ms with
// them on). Every transaction of the engine starts with Bookkeeping, which
// turns sequential scans off.
func TestFetch_PlansReadRowsByIndexEvenWhenPlannedOnAnEmptyTable(t *testing.T) {
	t.Parallel()
	pool, ob := newOutbox(t)
	ctx := context.Background()
	table := ob.q.table.quoted()
	keys := make([]string, 100)
	for i := range keys {
		keys[i] = fmt.Sprintf("k%d", i)
	}
	args := `'w', '1s', array_fill(''::text, ARRAY[100]), array_fill('t'::text, ARRAY[100]), '{` + strings.Join(keys, ",") + `}',
		16, 100, NULL, '', false, array_fill(0::bigint, ARRAY[100]), false`
	plan := planAfterGrowth(t, pool, ob, ob.q.bookkeeping, ob.q.pick, args, func() {
		_, err := pool.Exec(ctx, `INSERT INTO `+table+` (event_id, topic, partition_key, payload)
			SELECT gen_random_uuid(), 't', 'k' || (g % 1000), '\x00' FROM generate_series(1, 20000) g`)
		require.NoError(t, err)
	})
	rows, err := pool.Query(ctx, `SELECT DISTINCT tableoid::regclass::text FROM `+table)
	require.NoError(t, err)
	holders, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	assertNoSeqScan(t, plan, append(holders, ob.q.table.derived("_lanes").quoted())...)
}

// Lease renewal reads a relay's lanes by key even when its plan was made
// while the lanes table was empty: planned then, it scanned the whole lanes
// table at every renewal (48 ms and 11,494 buffers per renewal after four
// minutes of the pinned-horizon stand). The lookups of the lanes a renewal
// did not renew, and of starved lanes, go the same way (IndexPlans).
func TestExtendLanes_PlansReadLanesByKeyEvenWhenPlannedOnAnEmptyTable(t *testing.T) {
	t.Parallel()
	pool, ob := newOutbox(t)
	ctx := context.Background()
	lanes := ob.q.table.derived("_lanes").quoted()
	keys := make([]string, 100)
	for i := range keys {
		keys[i] = fmt.Sprintf("k%d", i)
	}
	grow := func() {
		_, err := pool.Exec(ctx, `INSERT INTO `+lanes+` (consumer_group, topic, partition_key, ready_at, locked_by)
			SELECT '', 't', 'k' || g, now(), 'w' FROM generate_series(1, 20000) g ON CONFLICT DO NOTHING`)
		require.NoError(t, err)
	}
	arrays := `array_fill(''::text, ARRAY[100]), array_fill('t'::text, ARRAY[100]), '{` + strings.Join(keys, ",") + `}'`
	for name, c := range map[string]struct{ stmt, args string }{
		"ExtendLanes":  {ob.q.extendLanes, `'w', '30s', ` + arrays},
		"OwnedLanes":   {ob.q.ownedLanes, `'w', ` + arrays},
		"StarvedLanes": {ob.q.starved, `'50ms', NULL, '', 10`},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := pool.Exec(ctx, `DELETE FROM `+lanes)
			require.NoError(t, err)
			assertNoSeqScan(t, planAfterGrowth(t, pool, ob, ob.q.indexPlans, c.stmt, c.args, grow), lanes)
		})
	}
}

// planAfterGrowth analyses the table and its lanes table, prepares stmt on
// one connection and plans it (generic plan) after prelude, as the engine's
// transactions start, then calls grow and returns the plan the same
// connection uses for stmt now, explained after prelude in a transaction it
// rolls back.
func planAfterGrowth(t *testing.T, pool *pgxpool.Pool, ob *Outbox, prelude, stmt, args string, grow func()) string {
	t.Helper()
	ctx := context.Background()
	for _, rel := range []string{ob.q.table.quoted(), ob.q.table.derived("_lanes").quoted()} {
		_, err := pool.Exec(ctx, `VACUUM (ANALYZE) `+rel)
		require.NoError(t, err)
	}
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, `PREPARE omnibus_stale_plan_under_test AS `+stmt)
	require.NoError(t, err)
	defer func() { _, _ = conn.Exec(ctx, `DEALLOCATE omnibus_stale_plan_under_test`) }()
	explain := func() string {
		tx, err := conn.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		_, err = tx.Exec(ctx, prelude)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, `SELECT set_config('plan_cache_mode', 'force_generic_plan', true)`)
		require.NoError(t, err)
		rows, err := tx.Query(ctx, `EXPLAIN EXECUTE omnibus_stale_plan_under_test(`+args+`)`)
		require.NoError(t, err)
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return strings.Join(lines, "\n")
	}
	explain()
	grow()
	return explain()
}

func assertNoSeqScan(t *testing.T, plan string, rels ...string) {
	t.Helper()
	for _, rel := range rels {
		if strings.Contains(plan, "Seq Scan on "+strings.Trim(rel, `"`)+" ") {
			t.Errorf("the plan reads the whole of %s:\n%s", rel, plan)
		}
	}
}

// The engine's statements run without JIT compilation. Their costs, inflated
// by the disabled sequential scans and the settlement's per-row lookups of
// lanes, passed jit_above_cost on a partitioned outbox, and each settlement
// was compiled: 630 ms of a statement that runs in 10. Here every statement
// would be compiled (jit_above_cost = 0) but for what the engine's first
// statements set.
func TestEngine_StatementsAreNotJITCompiled(t *testing.T) {
	t.Parallel()
	pool, ob := newOutbox(t)
	ctx := context.Background()
	jitted := func(first string) bool {
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		_, err = tx.Exec(ctx, `SET LOCAL jit_above_cost = 0`)
		require.NoError(t, err)
		if first != "" {
			_, err = tx.Exec(ctx, first)
			require.NoError(t, err)
		}
		var plan string
		require.NoError(t, tx.QueryRow(ctx, `EXPLAIN (ANALYZE, FORMAT JSON) SELECT count(*) FROM `+ob.q.table.quoted()).Scan(&plan))
		return strings.Contains(plan, `"JIT"`)
	}
	require.True(t, jitted(""), "this server compiles with JIT when asked (jit = on and llvmjit installed); the test needs it to mean anything")
	for name, first := range map[string]string{"Bookkeeping": ob.q.bookkeeping, "IndexPlans": ob.q.indexPlans} {
		assert.False(t, jitted(first), "a statement after %s is compiled", name)
	}
}

// A fetch plans its statements once per connection, not at every fetch:
// left to choose (plan_cache_mode auto), PostgreSQL planned Pick anew at
// every fetch, about 5 % of the server's CPU in BenchmarkRelayDrain.
// GenericPlans, in every fetch's first round trip, makes it keep one plan.
// On one connection, ten fetches that each lease lanes and pick rows must
// show in pg_prepared_statements as generic plans only.
func TestFetch_PlansPickOncePerConnection(t *testing.T) {
	t.Parallel()
	shared, ob := newOutbox(t)
	ctx := context.Background()
	cfg := shared.Config().Copy()
	cfg.MaxConns, cfg.MinConns = 1, 0
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer pool.Close()
	e := testEngine(pool, ob, "relay", 16)
	const fetches = 10
	for i := range fetches {
		enqueue(t, pool, ob, "t", event(fmt.Sprintf("k%d", i), "a"), event(fmt.Sprintf("k%d", i), "b"))
		got := cycle(t, e, 10, nil)
		require.Equal(t, []string{"a", "b"}, payloads(got), "fetch %d", i)
	}
	var generic, custom int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT coalesce(sum(generic_plans), 0), coalesce(sum(custom_plans), 0)
		FROM pg_prepared_statements WHERE statement LIKE '%WITH lane AS%'`).Scan(&generic, &custom))
	assert.Zero(t, custom, "Pick planned for its parameters' values (anew at each fetch)")
	assert.GreaterOrEqual(t, generic, int64(fetches), "Pick ran with its one generic plan at each fetch")
}
