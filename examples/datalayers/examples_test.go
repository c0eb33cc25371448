// Package datalayers_test runs each data-layer example the way a user would
// and checks what it prints, and tests Outbox.EnqueueSQL and the
// Dispatcher's database/sql transaction from each stack.
package datalayers_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omnibus-go/omnibus/internal/testenv"
)

// The examples, one per stack.
var examples = []string{"sql-pgx", "sql-pq", "sqlx", "gorm", "bun", "ent"}

func TestExamples(t *testing.T) {
	t.Parallel()
	testenv.Postgres(t) // a clear failure when PostgreSQL is down
	bin := t.TempDir()
	build := exec.Command("go", "build", "-o", bin+string(filepath.Separator), "./...")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "build the examples: %s", out)
	for _, name := range examples {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, filepath.Join(bin, name))
			cmd.Env = append(withoutOmnibusVars(), "OMNIBUS_POSTGRES_URL="+testenv.PostgresURL())
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			require.NoError(t, cmd.Run(), "%s failed\nstdout:\n%s\nstderr:\n%s", name, stdout.String(), stderr.String())
			assert.Contains(t, stdout.String(), name+": committed order-1 with its event, rolled order-2 back: 1 order and 1 event stored")
			assert.Contains(t, stdout.String(), name+`: received order-1 order.placed {"order":"order-1","amount":4200}`)
		})
	}
	t.Cleanup(func() {
		assert.Empty(t, leftBehind(t, "omnibus_datalayer_outbox_", "datalayer_"), "the examples drop what they created")
	})
}

// withoutOmnibusVars is the environment without OMNIBUS_* variables.
func withoutOmnibusVars() []string {
	var out []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "OMNIBUS_") {
			out = append(out, kv)
		}
	}
	return out
}

// leftBehind lists the tables and schemas whose name starts with one of
// prefixes.
func leftBehind(t *testing.T, prefixes ...string) []string {
	t.Helper()
	rows, err := testenv.Postgres(t).Query(context.Background(), `
		SELECT 'table ' || tablename FROM pg_tables, unnest($1::text[]) AS p(prefix) WHERE starts_with(tablename, p.prefix)
		UNION ALL
		SELECT 'schema ' || nspname FROM pg_namespace, unnest($1::text[]) AS p(prefix) WHERE starts_with(nspname, p.prefix)`, prefixes)
	require.NoError(t, err)
	left, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return left
}
