// Package pgbench holds the helpers that the PostgreSQL benchmarks of omnibus
// (bench/postgres and bench/inbox) share: a pool per benchmark, fresh tables
// that are dropped when the benchmark ends, VACUUM (ANALYZE) before a run,
// counting queries, rates, the machine's load average for the log, and an
// in-memory publisher that counts down to a target.
//
// It is a helper package for benchmarks only: its functions take a
// *testing.B and fail the benchmark on any error.
package pgbench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/omnibus-go/omnibus/internal/testenv"
	"github.com/omnibus-go/omnibus/transports/postgres"
)

// NewPool opens a pool of its own for one benchmark and closes it at the end.
// tracer (may be nil) sees every statement the pool runs.
func NewPool(b *testing.B, maxConns int32, tracer pgx.QueryTracer) *pgxpool.Pool {
	b.Helper()
	return testenv.NewTracedPostgresPool(b, maxConns, tracer)
}

// Table is one migrated outbox or inbox table of a benchmark, with its lanes
// table.
type Table struct {
	// Name is the table's name unquoted, as given to omnibus.
	Name string
	// Quoted is the table's name quoted for use in SQL.
	Quoted string
	// Lanes is the name of the table's lanes table, quoted for use in SQL.
	Lanes string
	// Notes is the name of the table's lane notes table, quoted for use in
	// SQL.
	Notes string
}

// NewTable migrates a fresh table of kind named bench_<scenario>_<random> and
// drops it, its lanes table, its two functions and its row in
// omnibus_schema_migrations when the benchmark ends.
func NewTable(b *testing.B, pool *pgxpool.Pool, kind postgres.Kind, scenario string) Table {
	b.Helper()
	return NewPartitionedTable(b, pool, kind, scenario, 0)
}

// NewPartitionedTable is NewTable in the partitioned layout, with partitions
// of interval (0: the single table).
func NewPartitionedTable(b *testing.B, pool *pgxpool.Pool, kind postgres.Kind, scenario string, interval time.Duration) Table {
	b.Helper()
	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	name := "bench_" + scenario + "_" + hex.EncodeToString(rnd[:])
	spec := postgres.OutboxTable(name)
	if kind == postgres.KindInbox {
		spec = postgres.InboxTable(name)
	}
	spec.PartitionInterval = interval
	if err := postgres.Migrate(context.Background(), pool, spec); err != nil {
		b.Fatalf("migrate %s: %v", name, err)
	}
	t := Table{
		Name:   name,
		Quoted: pgx.Identifier{name}.Sanitize(),
		Lanes:  pgx.Identifier{name + "_lanes"}.Sanitize(),
		Notes:  pgx.Identifier{name + "_notes"}.Sanitize(),
	}
	b.Cleanup(func() { Drop(b, pool, t) })
	return t
}

// Drop drops each table, its lanes, notes and dedup tables, its functions and
// its row in omnibus_schema_migrations. NewTable's cleanup does it when the
// benchmark ends; a benchmark of several rounds calls it at the end of each,
// so that a round does not run beside the leftovers of the ones before it
// (their vacuum, their share of the cache). Dropping twice is harmless.
func Drop(b *testing.B, pool *pgxpool.Pool, ts ...Table) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, t := range ts {
		_, err := pool.Exec(ctx, fmt.Sprintf(`DROP TABLE IF EXISTS %s, %s, %s, %s CASCADE`, t.Quoted, t.Lanes, t.Notes,
			pgx.Identifier{t.Name + "_dedup"}.Sanitize()))
		if err == nil {
			var fns []string
			for _, suffix := range []string{"_lane_fn", "_notify_fn", "_lane_lock_fn", "_dedup_fn", "_interval_fn", "_created_fn"} {
				fns = append(fns, pgx.Identifier{t.Name + suffix}.Sanitize())
			}
			_, err = pool.Exec(ctx, `DROP FUNCTION IF EXISTS `+strings.Join(fns, ", ")+` CASCADE`)
		}
		if err == nil {
			_, err = pool.Exec(ctx, `DELETE FROM omnibus_schema_migrations WHERE table_name = $1`, t.Name)
		}
		if err != nil {
			b.Logf("drop %s: %v", t.Name, err)
		}
	}
}

// Vacuum makes the lanes the seeded rows' writers asked for (their notes),
// as a relay's first fetch would, and runs VACUUM (ANALYZE) on each table and
// its lanes table, so every run starts from the same, planned-for state:
// the lanes of the seeded keys exist before the clock starts, as they did
// when writers created them themselves (before issue 25).
func Vacuum(b *testing.B, pool *pgxpool.Pool, ts ...Table) {
	b.Helper()
	for _, t := range ts {
		if _, err := pool.Exec(context.Background(), `WITH n AS (DELETE FROM `+t.Notes+` RETURNING consumer_group, topic, partition_key, ready_at)
INSERT INTO `+t.Lanes+` (consumer_group, topic, partition_key, ready_at)
SELECT consumer_group, topic, partition_key, min(ready_at) FROM n GROUP BY 1, 2, 3
ON CONFLICT DO NOTHING`); err != nil {
			b.Fatalf("lanes of %s: %v", t.Name, err)
		}
	}
	for _, t := range ts {
		for _, tab := range []string{t.Quoted, t.Lanes} {
			if _, err := pool.Exec(context.Background(), `VACUUM (ANALYZE) `+tab); err != nil {
				b.Fatalf("vacuum %s: %v", tab, err)
			}
		}
	}
}

// Count runs query, which must return one integer (such as a count(*)), and
// returns that integer.
func Count(b *testing.B, pool *pgxpool.Pool, query string) int {
	b.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), query).Scan(&n); err != nil {
		b.Fatalf("%s: %v", query, err)
	}
	return n
}

// PerSecond is n events over d, in events per second.
func PerSecond(n int, d time.Duration) float64 { return float64(n) / d.Seconds() }
