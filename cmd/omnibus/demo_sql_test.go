package main

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omnibus-go/omnibus/internal/sqlfile"
	"github.com/omnibus-go/omnibus/internal/testenv"
)

// Every statement of sql/demo.sql prepares against a real orders table, and
// every one is still used by the demo.
func TestDemoSQL_EveryStatementPreparesAndIsUsed(t *testing.T) {
	t.Parallel()
	unused, err := sqlfile.Unreferenced(demoSQL, ".")
	require.NoError(t, err)
	assert.Empty(t, unused, "statements in sql/demo.sql that the demo no longer uses")

	pool := testenv.Postgres(t)
	ctx := context.Background()
	orders := newDemoOrders(testenv.Name(t))
	_, err = pool.Exec(ctx, orders.create)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), orders.drop) })
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	for name, sql := range map[string]string{"CreateOrders": orders.create, "DropOrders": orders.drop,
		"UpsertOrder": orders.upsert, "AppendHandled": orders.appendHandled, "ListOrders": orders.list} {
		_, err := conn.Conn().PgConn().Prepare(ctx, "", sql, nil)
		assert.NoError(t, err, "%s does not prepare:\n%s", name, sql)
	}
}
