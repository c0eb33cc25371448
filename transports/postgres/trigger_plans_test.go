package postgres

import (
	"context"
	"fmt"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The writer path (the lane trigger's dedup check on the single table, its
// lookups of the key's lane and notes, the dedup trigger of the partitioned
// layout) reads through indexes even when its plans were made while the
// tables were empty. PL/pgSQL keeps a generic plan per connection for each
// statement of a trigger; made on a freshly migrated table (empty, or
// vacuumed while empty) it was a sequential scan, and every row a writer
// inserted on that connection read the whole table, longer as it grew:
// found in BenchmarkInboxIngest (the dedup check at 0.55 ms per row by
// 90,000 rows, the ingest at 27 % of its floor).
func TestWriterTrigger_ReadsByIndexEvenWhenPlannedOnAnEmptyTable(t *testing.T) {
	t.Parallel()
	t.Run("outbox", func(t *testing.T) {
		t.Parallel()
		pool, ob := newOutbox(t)
		assertWritesReadByIndex(t, pool, ob.q.table, func(ctx context.Context, db DB, keys ...string) error {
			msgs := make([]*message.Message, len(keys))
			for i, k := range keys {
				msgs[i] = event(k, "x")
			}
			return ob.Enqueue(ctx, db, "t", msgs...)
		})
	})
	t.Run("inbox", func(t *testing.T) {
		t.Parallel()
		pool, in := newInbox(t)
		assertWritesReadByIndex(t, pool, in.q.table, func(ctx context.Context, db DB, keys ...string) error {
			msgs := make([]*message.Message, len(keys))
			for i, k := range keys {
				msgs[i] = received("t", k, "e", "x")
			}
			_, err := in.Store(ctx, db, "g", msgs...)
			return err
		})
	})
}

// assertWritesReadByIndex warms one connection's plans of the writer path
// on the empty table (vacuumed and analysed as a migration leaves it, then
// written to a few times), grows the table from another connection, and
// asserts that one more write on the warm connection scans none of the
// table's relations sequentially.
func assertWritesReadByIndex(t *testing.T, pool *pgxpool.Pool, table tableName, write func(context.Context, DB, ...string) error) {
	t.Helper()
	ctx := context.Background()
	var rels []string
	rows, err := pool.Query(ctx, `SELECT c.oid::regclass::text FROM pg_class c
		WHERE c.relkind IN ('r', 'p') AND starts_with(c.relname, $1) AND c.relnamespace = current_schema()::regnamespace`, table.name)
	require.NoError(t, err)
	rels, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.NotEmpty(t, rels)
	for _, r := range rels {
		_, err := pool.Exec(ctx, `VACUUM (ANALYZE) `+r)
		require.NoError(t, err)
	}

	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	for i := range 10 { // past PL/pgSQL's five custom plans
		require.NoError(t, write(ctx, conn, fmt.Sprintf("warm-%d", i)))
	}
	grow := make([]string, 3000)
	for i := range grow {
		grow[i] = fmt.Sprintf("grow-%d", i)
	}
	require.NoError(t, write(ctx, pool, grow...))

	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	// The counts of pg_stat_xact_user_tables are those this connection has
	// not reported yet, which may include its earlier transactions': the
	// write's are the difference.
	const seqScans = `SELECT coalesce(jsonb_object_agg(relid::regclass::text, seq_scan), '{}') FROM pg_stat_xact_user_tables
		WHERE relid::regclass::text = ANY($1)`
	var before, after map[string]int64
	require.NoError(t, tx.QueryRow(ctx, seqScans, rels).Scan(&before))
	require.NoError(t, write(ctx, tx, "probe"))
	require.NoError(t, tx.QueryRow(ctx, seqScans, rels).Scan(&after))
	var scanned []string
	for r, n := range after {
		if n > before[r] {
			scanned = append(scanned, r)
		}
	}
	assert.Empty(t, scanned, "a write of one row read these tables sequentially (plans made while they were empty)")
}
