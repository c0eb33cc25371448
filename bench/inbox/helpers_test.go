package inboxbench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/omnibus-go/omnibus/internal/testenv"
	"github.com/omnibus-go/omnibus/transports/postgres"
)

// newPool opens a pool of its own for one benchmark and closes it at the end.
// tracer (may be nil) sees every statement the pool runs.
func newPool(b *testing.B, maxConns int32, tracer pgx.QueryTracer) *pgxpool.Pool {
	b.Helper()
	return testenv.NewTracedPostgresPool(b, maxConns, tracer)
}

// table is one migrated outbox or inbox table of a benchmark.
type table struct {
	name   string // unquoted, as given to omnibus
	quoted string
	lanes  string
}

// newTable migrates a fresh table named bench_<scenario>_<random> of kind
// and drops it when the benchmark ends.
func newTable(b *testing.B, pool *pgxpool.Pool, kind postgres.Kind, scenario string) table {
	b.Helper()
	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	name := "bench_" + scenario + "_" + hex.EncodeToString(rnd[:])
	spec := postgres.OutboxTable(name)
	if kind == postgres.KindInbox {
		spec = postgres.InboxTable(name)
	}
	if err := postgres.Migrate(context.Background(), pool, spec); err != nil {
		b.Fatalf("migrate %s: %v", name, err)
	}
	t := table{name: name, quoted: pgx.Identifier{name}.Sanitize(), lanes: pgx.Identifier{name + "_lanes"}.Sanitize()}
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, err := pool.Exec(ctx, fmt.Sprintf(`DROP TABLE IF EXISTS %s, %s CASCADE`, t.quoted, t.lanes))
		if err == nil {
			_, err = pool.Exec(ctx, fmt.Sprintf(`DROP FUNCTION IF EXISTS %s, %s CASCADE`,
				pgx.Identifier{name + "_lane_fn"}.Sanitize(), pgx.Identifier{name + "_notify_fn"}.Sanitize()))
		}
		if err == nil {
			_, err = pool.Exec(ctx, `DELETE FROM omnibus_schema_migrations WHERE table_name = $1`, name)
		}
		if err != nil {
			b.Logf("drop %s: %v", name, err)
		}
	})
	return t
}

// vacuum analyzes the tables so every run starts from a planned-for state.
func vacuum(b *testing.B, pool *pgxpool.Pool, ts ...table) {
	b.Helper()
	for _, t := range ts {
		for _, tab := range []string{t.quoted, t.lanes} {
			if _, err := pool.Exec(context.Background(), `VACUUM (ANALYZE) `+tab); err != nil {
				b.Fatalf("vacuum %s: %v", tab, err)
			}
		}
	}
}

func count(b *testing.B, pool *pgxpool.Pool, query string) int {
	b.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), query).Scan(&n); err != nil {
		b.Fatalf("%s: %v", query, err)
	}
	return n
}

func perSecond(n int, d time.Duration) float64 { return float64(n) / d.Seconds() }

// countdown closes done when it has been hit target times and remembers when.
type countdown struct {
	target int64
	n      atomic.Int64
	first  atomic.Pointer[time.Time]
	doneAt atomic.Pointer[time.Time]
	done   chan struct{}
}

func newCountdown(target int) *countdown {
	return &countdown{target: int64(target), done: make(chan struct{})}
}

// start records the first event's time (once).
func (c *countdown) start() {
	if c.first.Load() == nil {
		now := time.Now()
		c.first.CompareAndSwap(nil, &now)
	}
}

func (c *countdown) hit() {
	if c.n.Add(1) == c.target {
		now := time.Now()
		c.doneAt.Store(&now)
		close(c.done)
	}
}

// wait blocks until the target is reached and returns when that was.
func (c *countdown) wait(b *testing.B, timeout time.Duration) time.Time {
	b.Helper()
	select {
	case <-c.done:
		return *c.doneAt.Load()
	case <-time.After(timeout):
		b.Fatalf("reached %d of %d in %s", c.n.Load(), c.target, timeout)
		return time.Time{}
	}
}

// sink is an in-memory publisher that counts down.
type sink struct{ c *countdown }

func (s sink) Publish(_ string, msgs ...*message.Message) error {
	for range msgs {
		s.c.hit()
	}
	return nil
}

func (s sink) Close() error { return nil }

// runner is something with Run(ctx), running in the background.
type runner struct {
	cancel context.CancelFunc
	done   chan error
}

func start(r interface{ Run(context.Context) error }) *runner {
	ctx, cancel := context.WithCancel(context.Background())
	rn := &runner{cancel: cancel, done: make(chan error, 1)}
	go func() { rn.done <- r.Run(ctx) }()
	return rn
}

func (r *runner) stop(b *testing.B) {
	b.Helper()
	r.cancel()
	select {
	case err := <-r.done:
		if err != nil {
			b.Fatalf("stop: %v", err)
		}
	case <-time.After(45 * time.Second):
		b.Fatalf("did not stop within 45s")
	}
}

// insertTracer watches the inbox inserts of a pool (statements whose second
// argument is the array of message ids): how many, how many rows each, and
// how long each took from sending to its result.
type insertTracer struct {
	mu    sync.Mutex
	n     int
	rows  int
	total time.Duration
}

type insertStart struct {
	rows int
	at   time.Time
}

type insertKey struct{}

func (t *insertTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if len(d.Args) == 9 {
		if ids, ok := d.Args[1].([]string); ok {
			return context.WithValue(ctx, insertKey{}, insertStart{rows: len(ids), at: time.Now()})
		}
	}
	return ctx
}

func (t *insertTracer) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	if s, ok := ctx.Value(insertKey{}).(insertStart); ok {
		t.mu.Lock()
		t.n++
		t.rows += s.rows
		t.total += time.Since(s.at)
		t.mu.Unlock()
	}
}

// take returns what was seen since the last take and starts over.
func (t *insertTracer) take() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.n == 0 {
		return "no inserts"
	}
	s := fmt.Sprintf("%d inserts, %.1f rows and %.1f ms each on average", t.n, float64(t.rows)/float64(t.n),
		float64(t.total.Microseconds())/1000/float64(t.n))
	t.n, t.rows, t.total = 0, 0, 0
	return s
}

// loadAvg reads the 1-minute load average (Linux), for the log.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "load average unknown"
	}
	var one string
	_, _ = fmt.Sscan(string(b), &one)
	return "load average " + one
}
