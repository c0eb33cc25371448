package testenv

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
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
