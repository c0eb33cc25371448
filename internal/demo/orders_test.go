package demo

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omnibus-go/omnibus/internal/sqlfile"
	"github.com/omnibus-go/omnibus/internal/testenv"
)

// Every statement of sql/orders.sql prepares against a real orders table, and
// every one is still used.
func TestOrders_EveryStatementPreparesAndIsUsed(t *testing.T) {
	t.Parallel()
	unused, err := sqlfile.Unreferenced(statements, ".")
	require.NoError(t, err)
	assert.Empty(t, unused, "statements in sql/orders.sql that nothing uses")

	pool := testenv.Postgres(t)
	ctx := context.Background()
	orders, err := NewOrders(testenv.Name(t))
	require.NoError(t, err)
	require.NoError(t, orders.Create(ctx, pool))
	t.Cleanup(func() { _ = orders.Drop(context.Background(), pool) })
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	for name, sql := range map[string]string{"CreateOrders": orders.create, "DropOrders": orders.drop,
		"UpsertOrder": orders.upsert, "AppendHandled": orders.appendHandled, "ListOrders": orders.list} {
		_, err := conn.Conn().PgConn().Prepare(ctx, "", sql, nil)
		assert.NoError(t, err, "%s does not prepare:\n%s", name, sql)
	}
}

// The statements keep what the demo checks: an order's status is upserted,
// and the handlers' steps come back per order in the order they were applied.
func TestOrders_HandledListsEachOrdersStepsInOrder(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	ctx := context.Background()
	orders, err := NewOrders(testenv.Name(t))
	require.NoError(t, err)
	require.NoError(t, orders.Create(ctx, pool))
	t.Cleanup(func() { _ = orders.Drop(context.Background(), pool) })
	for _, st := range [][2]string{{"order-2", "created"}, {"order-1", "created"}, {"order-1", "paid"}} {
		require.NoError(t, orders.Upsert(ctx, pool, st[0], st[1]))
		require.NoError(t, orders.AppendHandled(ctx, pool, st[0], st[1]))
	}
	ids, handled, err := orders.Handled(ctx, pool)
	require.NoError(t, err)
	assert.Equal(t, []string{"order-1", "order-2"}, ids)
	assert.Equal(t, [][]string{{"created", "paid"}, {"created"}}, handled)
}

func TestNewOrders_RefusesANameThatIsNotAnIdentifier(t *testing.T) {
	t.Parallel()
	_, err := NewOrders(`orders"; DROP TABLE x; --`)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "orders table")
}
