package console_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/omnibus-go/omnibus/console"
	"github.com/omnibus-go/omnibus/internal/testenv"
	"github.com/omnibus-go/omnibus/transports/postgres"
)

// BenchmarkPages measures each page's server time on an outbox of
// OMNIBUS_CONSOLE_BENCH_COMPLETED completed rows (default 1 000 000), plus
// 10 000 pending rows over 1 000 keys and 1 000 failed rows:
//
//	go test -run '^$' -bench Pages -benchtime 20x ./console/
func BenchmarkPages(b *testing.B) {
	completed := 1_000_000
	if s := os.Getenv("OMNIBUS_CONSOLE_BENCH_COMPLETED"); s != "" {
		n, err := strconv.Atoi(s)
		require.NoError(b, err, "OMNIBUS_CONSOLE_BENCH_COMPLETED")
		completed = n
	}
	pool := testenv.Postgres(b)
	name := testenv.Name(b)
	if len(name) > 34 {
		name = "c" + name[len(name)-33:]
	}
	testenv.DropPostgresPrefix(b, name)
	ctx := context.Background()
	require.NoError(b, postgres.Migrate(ctx, pool, postgres.OutboxTable(name)))
	table := pgx.Identifier{name}.Sanitize()
	// Seeding only: rows in every state, written straight into the table.
	for _, sql := range []string{
		`INSERT INTO ` + table + ` (event_id, topic, partition_key, payload, status, attempts, created_at, completed_at)
		 SELECT gen_random_uuid(), 'orders', 'k' || (i % 5000), '{"n":1}', 'completed', 1,
		        now() - (i % 7200) * interval '1 second', now() - (i % 7200) * interval '1 second'
		 FROM generate_series(1, ` + strconv.Itoa(completed) + `) i`,
		`INSERT INTO ` + table + ` (event_id, topic, partition_key, payload)
		 SELECT gen_random_uuid(), 'orders', 'k' || (i % 1000), '{"n":2}' FROM generate_series(1, 10000) i`,
		`INSERT INTO ` + table + ` (event_id, topic, partition_key, payload, status, attempts, max_attempts, last_error)
		 SELECT gen_random_uuid(), 'payments', 'p' || i, '{"n":3}', 'failed', 6, 6, 'broker refused row ' || i
		 FROM generate_series(1, 1000) i`,
		`ANALYZE ` + table,
	} {
		_, err := pool.Exec(ctx, sql)
		require.NoError(b, err)
	}
	adm, err := postgres.NewAdmin(pool, postgres.OutboxTable(name))
	require.NoError(b, err)
	rows, err := adm.ListFailed(ctx, 1, 0)
	require.NoError(b, err)
	c, err := console.New(console.Config{Tables: []*postgres.Admin{adm}}, nil)
	require.NoError(b, err)
	defer c.Close()

	for _, page := range []struct{ name, path string }{
		{"overview", "/"},
		{"live", "/live"},
		{"held", "/held"},
		{"failed", "/failed?t=" + name},
		{"failed_filtered", "/failed?t=" + name + "&error=row+99"},
		{"row", "/row?t=" + name + "&id=" + strconv.FormatInt(rows[0].ID, 10)},
		{"relays", "/relays"},
	} {
		b.Run(page.name, func(b *testing.B) {
			for b.Loop() {
				rec := httptest.NewRecorder()
				c.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, page.path, nil))
				if rec.Code != http.StatusOK {
					b.Fatalf("%s: status %d: %s", page.path, rec.Code, rec.Body.String())
				}
			}
		})
	}
}
