package postgresbench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/internal/testenv"
	"github.com/omnibus-go/omnibus/processors"
	"github.com/omnibus-go/omnibus/transports/postgres"
)

// benchTopic is the topic of every seeded row.
const benchTopic = "bench"

// payloadBytes is the size of every seeded payload.
const payloadBytes = 100

// newPool opens a pool of its own for one benchmark and closes it at the end.
// tracer (may be nil) sees every statement the pool runs.
func newPool(b *testing.B, maxConns int32, tracer pgx.QueryTracer) *pgxpool.Pool {
	b.Helper()
	return testenv.NewTracedPostgresPool(b, maxConns, tracer)
}

// table is one migrated outbox table (and its lanes table) of a benchmark.
type table struct {
	name   string // unquoted, as given to omnibus
	quoted string
	lanes  string // quoted lanes table
}

// newTable migrates a fresh outbox table named bench_<scenario>_<random> and
// drops it, its lanes table and its functions when the benchmark ends.
func newTable(b *testing.B, pool *pgxpool.Pool, scenario string) table {
	b.Helper()
	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	name := "bench_" + scenario + "_" + hex.EncodeToString(rnd[:])
	ctx := context.Background()
	if err := postgres.Migrate(ctx, pool, postgres.OutboxTable(name)); err != nil {
		b.Fatalf("migrate %s: %v", name, err)
	}
	t := table{
		name:   name,
		quoted: pgx.Identifier{name}.Sanitize(),
		lanes:  pgx.Identifier{name + "_lanes"}.Sanitize(),
	}
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

// rows describes one bulk insert: n rows of topic benchTopic whose keys are
// prefix || (g % keys) for g in [0, n), so a key's rows are spread over the
// table in id order. keys = 1 gives every row the key prefix||"0".
type rows struct {
	n      int
	keys   int
	prefix string
	status string // "pending" (default) or "completed"
}

// seed inserts r in one statement. The table's trigger upserts the lanes of
// pending rows, exactly as it does for rows written by Outbox.Enqueue.
func seed(b *testing.B, pool *pgxpool.Pool, t table, r rows) {
	b.Helper()
	if r.status == "" {
		r.status = "pending"
	}
	_, err := pool.Exec(context.Background(), `
INSERT INTO `+t.quoted+` (event_id, topic, partition_key, payload, metadata, status, completed_at)
SELECT gen_random_uuid(), $1, k.key, $2, jsonb_build_object('partition_key', k.key), $3,
       CASE WHEN $3 = 'completed' THEN now() END
FROM generate_series(0, $4::int - 1) AS g
CROSS JOIN LATERAL (SELECT $5::text || (g % $6::int)::text AS key) AS k`,
		benchTopic, make([]byte, payloadBytes), r.status, r.n, r.prefix, r.keys)
	if err != nil {
		b.Fatalf("seed %d %s rows into %s: %v", r.n, r.status, t.name, err)
	}
}

// settle vacuums and analyzes the tables so every run starts from the same,
// planned-for state.
func settle(b *testing.B, pool *pgxpool.Pool, ts ...table) {
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

// sink is an in-memory message.Publisher that counts what it is given and
// signals when it has seen target messages (of the keys it counts).
type sink struct {
	target int64
	// skipKey, when set, is a partition key whose messages are counted apart.
	skipKey string
	// onPublish, when set, sees every message (latency measurement).
	onPublish func(*message.Message)

	n       atomic.Int64
	skipped atomic.Int64
	once    sync.Once
	done    chan struct{}
	doneAt  atomic.Pointer[time.Time]
}

func newSink(target int) *sink { return &sink{target: int64(target), done: make(chan struct{})} }

func (s *sink) Publish(_ string, msgs ...*message.Message) error {
	for _, m := range msgs {
		if s.onPublish != nil {
			s.onPublish(m)
		}
		if s.skipKey != "" && bus.PartitionKey(m) == s.skipKey {
			s.skipped.Add(1)
			continue
		}
		if s.n.Add(1) == s.target {
			now := time.Now()
			s.doneAt.Store(&now)
			s.once.Do(func() { close(s.done) })
		}
	}
	return nil
}

func (s *sink) Close() error { return nil }

// wait blocks until the sink reached its target, then returns when that
// was; it fails the benchmark after timeout.
func (s *sink) wait(b *testing.B, timeout time.Duration) time.Time {
	b.Helper()
	select {
	case <-s.done:
		return *s.doneAt.Load()
	case <-time.After(timeout):
		b.Fatalf("sink got %d of %d messages in %s", s.n.Load(), s.target, timeout)
		return time.Time{}
	}
}

// relay is a running processors.OutboxRelay.
type relay struct {
	cancel context.CancelFunc
	done   chan error
}

// startRelay builds and runs an OutboxRelay over t that publishes into pub.
func startRelay(b *testing.B, pool *pgxpool.Pool, t table, cfg postgres.SubscriberConfig, pub message.Publisher) *relay {
	b.Helper()
	cfg.Table = t.name
	r, err := processors.NewOutboxRelay(pool, processors.OutboxRelayConfig{Publisher: pub, Subscriber: cfg}, nil)
	if err != nil {
		b.Fatalf("new relay: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	rl := &relay{cancel: cancel, done: make(chan error, 1)}
	go func() { rl.done <- r.Run(ctx) }()
	return rl
}

// stop ends the relay and waits for its graceful shutdown.
func (r *relay) stop(b *testing.B) {
	b.Helper()
	r.cancel()
	select {
	case err := <-r.done:
		if err != nil && !errors.Is(err, context.Canceled) {
			b.Fatalf("relay: %v", err)
		}
	case <-time.After(45 * time.Second):
		b.Fatalf("relay did not stop within 45s")
	}
}

// tracer watches every statement of a pool (a pgx.QueryTracer). It keeps a
// profile of wall time per kind of statement, and for the subscriber's fetch
// statement also each duration (from sending it to closing its rows, as the
// relay sees it), how many fetches returned rows, and the first fetch's SQL
// and arguments. The fetch is recognized by its text: it is the one
// statement of the transport that starts by leasing lanes ("WITH lane AS").
type tracer struct {
	mu       sync.Mutex
	sql      string
	args     []any
	times    []time.Duration
	nonEmpty int
	profile  map[string]*stmtStat
}

type stmtStat struct {
	n     int
	total time.Duration
}

type traceStart struct {
	label string
	at    time.Time
}

type traceKey struct{}

func isFetch(sql string) bool { return strings.HasPrefix(strings.TrimSpace(sql), "WITH lane AS (") }

// label names a statement by its first words, with quoted names (tables,
// lanes, channels) folded to {T} so statements of different tables match.
func label(sql string) string {
	if isFetch(sql) {
		return "fetch (WITH lane AS …)"
	}
	words := strings.Fields(sql)
	for i, w := range words {
		if strings.HasPrefix(w, `"`) {
			words[i] = "{T}"
		}
	}
	return strings.Join(words[:min(len(words), 5)], " ")
}

func (t *tracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if isFetch(d.SQL) {
		t.mu.Lock()
		if t.sql == "" {
			t.sql, t.args = d.SQL, slices.Clone(d.Args)
		}
		t.mu.Unlock()
	}
	return context.WithValue(ctx, traceKey{}, traceStart{label: label(d.SQL), at: time.Now()})
}

func (t *tracer) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryEndData) {
	st, ok := ctx.Value(traceKey{}).(traceStart)
	if !ok {
		return
	}
	el := time.Since(st.at)
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.profile == nil {
		t.profile = map[string]*stmtStat{}
	}
	p := t.profile[st.label]
	if p == nil {
		p = &stmtStat{}
		t.profile[st.label] = p
	}
	p.n++
	p.total += el
	if strings.HasPrefix(st.label, "fetch") {
		t.times = append(t.times, el)
		if d.Err == nil && d.CommandTag.RowsAffected() > 0 {
			t.nonEmpty++
		}
	}
}

// reset forgets what was recorded (keeping the captured fetch statement).
func (t *tracer) reset() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.times, t.nonEmpty, t.profile = nil, 0, nil
}

// fetches returns how many fetch statements ran, how many returned rows, and
// their median duration.
func (t *tracer) fetches() (n, nonEmpty int, median time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.times), t.nonEmpty, percentile(t.times, 50)
}

// top returns the n statement kinds that took the most wall time, one line
// each: count, total and mean time, label.
func (t *tracer) top(n int) []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	type kv struct {
		label string
		s     stmtStat
	}
	var all []kv
	for l, s := range t.profile {
		all = append(all, kv{l, *s})
	}
	slices.SortFunc(all, func(a, b kv) int { return int(b.s.total - a.s.total) })
	var out []string
	for _, e := range all[:min(n, len(all))] {
		out = append(out, fmt.Sprintf("%5d × %-40q total %8.0f ms, mean %7.1f ms",
			e.s.n, e.label, ms(e.s.total), ms(e.s.total)/float64(e.s.n)))
	}
	return out
}

// percentile returns the p-th percentile (nearest rank) of ds.
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(float64(len(s))*p/100+0.5) - 1
	return s[max(0, min(i, len(s)-1))]
}

// loadAvg describes the machine's load averages, which bear on every figure
// of a 2-core machine shared with other work.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "load average unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "load average unknown"
	}
	return "load average " + strings.Join(f[:3], " ")
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// perSecond is n events over d, in events per second.
func perSecond(n int, d time.Duration) float64 { return float64(n) / d.Seconds() }
