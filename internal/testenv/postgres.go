package testenv

import (
	"context"
	"errors"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// DefaultPostgresURL is used when OMNIBUS_TEST_POSTGRES_URL is not set.
const DefaultPostgresURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// PostgresURL returns the connection string tests use.
func PostgresURL() string {
	if u := os.Getenv("OMNIBUS_TEST_POSTGRES_URL"); u != "" {
		return u
	}
	return DefaultPostgresURL
}

var (
	pgOnce sync.Once
	pgPool *pgxpool.Pool
	pgErr  error
)

// Postgres returns a pool shared by every test of the package (the server
// allows 100 connections; one pool per package keeps the suite under that).
// The pool is never closed by tests; it lives as long as the test binary.
func Postgres(t testing.TB) *pgxpool.Pool {
	t.Helper()
	pgOnce.Do(func() {
		cfg, err := pgxpool.ParseConfig(PostgresURL())
		if err != nil {
			pgErr = err
			return
		}
		cfg.MaxConns = 16
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err == nil {
			err = pool.Ping(ctx)
		}
		if err != nil {
			if pool != nil {
				pool.Close()
			}
			pgErr = err
			return
		}
		pgPool = pool
	})
	if pgErr != nil {
		t.Fatalf("PostgreSQL is not reachable at %s: %v\n"+
			"Start it with `make services` (or set OMNIBUS_TEST_POSTGRES_URL to a server you run).",
			PostgresURL(), pgErr)
	}
	return pgPool
}

// NewPostgresPool opens a separate pool of at most maxConns connections and
// closes it when the test ends. Use it only where a test needs a pool of its
// own (for instance to hold connections apart from the shared pool).
func NewPostgresPool(tb testing.TB, maxConns int32) *pgxpool.Pool {
	tb.Helper()
	return NewTracedPostgresPool(tb, maxConns, nil)
}

// NewTracedPostgresPool is NewPostgresPool with a tracer (nil for none) that
// sees every statement the pool runs; benchmarks use it to profile queries.
func NewTracedPostgresPool(tb testing.TB, maxConns int32, tracer pgx.QueryTracer) *pgxpool.Pool {
	tb.Helper()
	cfg, err := pgxpool.ParseConfig(PostgresURL())
	if err != nil {
		tb.Fatalf("parse OMNIBUS_TEST_POSTGRES_URL %q: %v", PostgresURL(), err)
	}
	cfg.MaxConns = maxConns
	cfg.ConnConfig.Tracer = tracer
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err == nil {
		err = pool.Ping(ctx)
	}
	if err != nil {
		if pool != nil {
			pool.Close()
		}
		tb.Fatalf("PostgreSQL is not reachable at %s: %v\n"+
			"Start it with `make services` (or set OMNIBUS_TEST_POSTGRES_URL to a server you run).",
			PostgresURL(), err)
	}
	tb.Cleanup(pool.Close)
	return pool
}

// DropPostgresPrefix drops, when the test ends, every table and function
// of the public schema whose name starts with prefix, and their rows in
// omnibus_schema_migrations: for tests that run something (the CLI, the
// demo) that makes its own tables under names the test chose. prefix must
// be at least 8 characters, so it cannot match another test's objects.
func DropPostgresPrefix(t testing.TB, prefix string) {
	t.Helper()
	if len(prefix) < 8 {
		t.Fatalf("DropPostgresPrefix: prefix %q is too short to be the test's own", prefix)
	}
	t.Cleanup(func() {
		pool := Postgres(t)
		// The test's Close calls return once their goroutines end, but a
		// query they canceled may still be ending on the server, holding a
		// lock on one of these tables: dropping them all in one statement
		// could then deadlock with it (seen once in the console's tests).
		// So wait for other sessions to let go of the tables, and try again
		// if the drop is still picked as a deadlock victim.
		var err error
		for attempt := 1; attempt <= 5; attempt++ {
			waitForOtherSessions(pool, prefix, 10*time.Second)
			if err = dropPrefix(pool, prefix); !isDeadlock(err) {
				break
			}
			time.Sleep(time.Duration(attempt) * 100 * time.Millisecond)
		}
		if err != nil {
			t.Errorf("drop the test's tables %s*: %v", prefix, err)
		}
	})
}

// waitForOtherSessions waits, at most max, until no session but ours holds
// or waits for a lock on a relation whose name starts with prefix.
func waitForOtherSessions(pool *pgxpool.Pool, prefix string, max time.Duration) {
	deadline := time.Now().Add(max)
	for time.Now().Before(deadline) {
		var n int
		err := pool.QueryRow(context.Background(), `
SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
WHERE l.pid <> pg_backend_pid() AND starts_with(c.relname, $1)`, prefix).Scan(&n)
		if err != nil || n == 0 {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func isDeadlock(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "40P01"
}

// dropPrefix drops what DropPostgresPrefix drops, in one statement.
func dropPrefix(pool *pgxpool.Pool, prefix string) error {
	_, err := pool.Exec(context.Background(), `
DO $$
DECLARE r record;
BEGIN
    FOR r IN SELECT tablename FROM pg_tables WHERE schemaname = 'public' AND starts_with(tablename, `+quoteLiteral(prefix)+`) LOOP
        EXECUTE format('DROP TABLE IF EXISTS public.%I CASCADE', r.tablename);
    END LOOP;
    FOR r IN SELECT p.oid::regprocedure AS fn FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
             WHERE n.nspname = 'public' AND starts_with(p.proname, `+quoteLiteral(prefix)+`) LOOP
        EXECUTE format('DROP FUNCTION IF EXISTS %s CASCADE', r.fn);
    END LOOP;
    IF to_regclass('public.omnibus_schema_migrations') IS NOT NULL THEN
        DELETE FROM public.omnibus_schema_migrations WHERE starts_with(table_name, `+quoteLiteral(prefix)+`);
    END IF;
END $$`)
	return err
}

// quoteLiteral quotes s as an SQL string literal.
func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
