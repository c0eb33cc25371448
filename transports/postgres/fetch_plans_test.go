package postgres

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// A fetch reads its rows through indexes even when its plans were made while
// the table was empty. pgx prepares the fetch's statements and PostgreSQL
// keeps a generic plan per connection until the table's statistics change;
// on a table analysed while empty (a freshly migrated one, on a server whose
// autovacuum has not come by) Pick's plan leased the picked rows by a hash
// join over a sequential scan of the whole table, at every fetch
// (BenchmarkNotifyLatency: commit→delivery p50 1.5–2.4 ms before, 2.9–4.0
// after, on a table of a few thousand rows). Every engine transaction starts
// with Bookkeeping, which turns sequential scans off.
func TestFetch_PlansReadRowsByIndexEvenWhenPlannedOnAnEmptyTable(t *testing.T) {
	t.Parallel()
	pool, ob := newOutbox(t)
	ctx := context.Background()
	table := ob.q.table.quoted()
	keys := make([]string, 100)
	tp := make([]string, 100)
	for i := range keys {
		keys[i], tp[i] = fmt.Sprintf("k%d", i), "t"
	}
	// Analysed while empty, as a freshly migrated table on a server whose
	// autovacuum has just come by. One connection prepares Pick and plans
	// it then, as a relay's connection does at its first fetches.
	_, err := pool.Exec(ctx, `VACUUM (ANALYZE) `+table)
	require.NoError(t, err)
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, `PREPARE omnibus_pick_under_test AS `+ob.q.pick)
	require.NoError(t, err)
	defer func() { _, _ = conn.Exec(ctx, `DEALLOCATE omnibus_pick_under_test`) }()
	args := `'w', '1s', array_fill(''::text, ARRAY[100]), '{` + strings.Join(tp, ",") + `}', '{` + strings.Join(keys, ",") + `}',
		16, 100, NULL, '', false, '{` + strings.TrimSuffix(strings.Repeat("0,", 100), ",") + `}', false`
	explain := func() string {
		tx, err := conn.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		_, err = tx.Exec(ctx, ob.q.bookkeeping) // as every transaction of the engine starts
		require.NoError(t, err)
		_, err = tx.Exec(ctx, `SELECT set_config('plan_cache_mode', 'force_generic_plan', true)`)
		require.NoError(t, err)
		rows, err := tx.Query(ctx, `EXPLAIN EXECUTE omnibus_pick_under_test(`+args+`)`)
		require.NoError(t, err)
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return strings.Join(lines, "\n")
	}
	explain()

	_, err = pool.Exec(ctx, `INSERT INTO `+table+` (event_id, topic, partition_key, payload)
		SELECT gen_random_uuid(), 't', 'k' || (g % 1000), '\x00' FROM generate_series(1, 20000) g`)
	require.NoError(t, err)
	rows, err := pool.Query(ctx, `SELECT DISTINCT tableoid::regclass::text FROM `+table)
	require.NoError(t, err)
	holders, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	plan := explain()
	for _, h := range append(holders, ob.q.table.derived("_lanes").quoted()) {
		if scan := "Seq Scan on " + strings.Trim(h, `"`) + " "; strings.Contains(plan, scan) {
			t.Errorf("the fetch reads the whole of %s:\n%s", h, plan)
		}
	}
}
