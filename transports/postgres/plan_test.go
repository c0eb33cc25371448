package postgres

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestPlans_OneKeyHoldingTheTableIsReadThroughTheKeyIndex builds the table
// that made the planner walk the primary key: one key holds every row, the
// statistics were taken while all of them were pending, and half of them
// have completed since. Looked up by equalities and ORDER BY id, the key's
// head came from a primary-key scan from the start of the table that
// filtered out every completed row, so each fetch and each lane
// reconciliation of a draining backlog read more than the one before (a
// 36,000-row key drained at 1.6k events/s instead of 6.7k). The fetch and
// the reconciliation must read a lane's rows through the key index only.
func TestPlans_OneKeyHoldingTheTableIsReadThroughTheKeyIndex(t *testing.T) {
	t.Parallel()
	hot := func(base int) []*message.Message {
		msgs := make([]*message.Message, 0, 500)
		for j := range 500 {
			msgs = append(msgs, received("t", "hot", "", fmt.Sprint(base+j)))
		}
		return msgs
	}
	t.Run("outbox", func(t *testing.T) {
		t.Parallel()
		pool, ob := newOutbox(t)
		for i := 0; i < 4000; i += 500 {
			enqueue(t, pool, ob, "t", hot(i)...)
		}
		assertKeyIndexPlans(t, pool, ob.q, "")
	})
	t.Run("inbox", func(t *testing.T) {
		t.Parallel()
		pool, in := newInbox(t)
		for i := 0; i < 4000; i += 500 {
			_, err := in.Store(context.Background(), pool, "g", hot(i)...)
			require.NoError(t, err)
		}
		assertKeyIndexPlans(t, pool, in.q, "g")
	})
}

// assertKeyIndexPlans analyzes q's table while every row is pending,
// completes the older half, and checks the plans of the fetch and the
// reconciliation of the key "hot" on topic "t" (group g).
func assertKeyIndexPlans(t *testing.T, pool *pgxpool.Pool, q *queries, g string) {
	t.Helper()
	ctx := context.Background()
	table := q.table.quoted()
	_, err := pool.Exec(ctx, "ANALYZE "+table)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE `+table+` SET status = 'completed', completed_at = now()
		WHERE id IN (SELECT id FROM `+table+` ORDER BY id LIMIT (SELECT count(*) / 2 FROM `+table+`))`)
	require.NoError(t, err)

	pkey := q.table.derived("_pkey").quoted()
	for name, stmt := range map[string]struct {
		sql  string
		args []any
	}{
		"fetch":     {q.fetch, []any{"w", "30 seconds", 10, 16, 0, "t", g, false}},
		"reconcile": {q.reconcile, []any{[]string{g}, []string{"t"}, []string{"hot"}, false, false}},
	} {
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		rows, err := tx.Query(ctx, "EXPLAIN "+stmt.sql, stmt.args...)
		require.NoError(t, err, name)
		var plan []string
		for rows.Next() {
			var line string
			require.NoError(t, rows.Scan(&line))
			plan = append(plan, line)
		}
		require.NoError(t, rows.Err())
		require.NoError(t, tx.Rollback(ctx))
		text := strings.Join(plan, "\n")
		// The primary key may look rows up by id (the lease update does),
		// never serve a scan of a key's rows.
		for i, line := range plan {
			if strings.Contains(line, strings.Trim(pkey, `"`)+" on") {
				next := ""
				if i+1 < len(plan) {
					next = plan[i+1]
				}
				assert.Contains(t, next, "Index Cond: (id = ", "%s walks the table's primary key:\n%s", name, text)
			}
		}
		assert.Contains(t, text, "_key_idx", "%s must read the lane's rows through the key index:\n%s", name, text)
	}
}
