package postgresbench

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/omnibus-go/omnibus/bench/internal/pgbench"
	"github.com/omnibus-go/omnibus/processors"
	"github.com/omnibus-go/omnibus/transports/postgres"
)

// benchTopic is the topic of every seeded row.
const benchTopic = "bench"

// payloadBytes is the size of every seeded payload.
const payloadBytes = 100

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
func seed(b *testing.B, pool *pgxpool.Pool, t pgbench.Table, r rows) {
	b.Helper()
	if r.status == "" {
		r.status = "pending"
	}
	_, err := pool.Exec(context.Background(), `
INSERT INTO `+t.Quoted+` (event_id, topic, partition_key, payload, metadata, status, completed_at)
SELECT gen_random_uuid(), $1, k.key, $2, jsonb_build_object('partition_key', k.key), $3,
       CASE WHEN $3 = 'completed' THEN now() END
FROM generate_series(0, $4::int - 1) AS g
CROSS JOIN LATERAL (SELECT $5::text || (g % $6::int)::text AS key) AS k`,
		benchTopic, make([]byte, payloadBytes), r.status, r.n, r.prefix, r.keys)
	if err != nil {
		b.Fatalf("seed %d %s rows into %s: %v", r.n, r.status, t.Name, err)
	}
}

// relay is a running processors.OutboxRelay.
type relay struct {
	cancel context.CancelFunc
	done   chan error
}

// startRelay builds and runs an OutboxRelay over t that publishes into pub.
func startRelay(b *testing.B, pool *pgxpool.Pool, t pgbench.Table, cfg postgres.SubscriberConfig, pub message.Publisher) *relay {
	b.Helper()
	cfg.Table = t.Name
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
	mu   sync.Mutex
	sql  string
	args []any
	// leaseSQL, leaseArgs: the fetch's first statement (it leases lanes).
	leaseSQL  string
	leaseArgs []any
	times     []time.Duration
	nonEmpty  int
	profile   map[string]*stmtStat
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

// isLease tells the fetch's first statement, which takes lanes: it tries
// their advisory locks and deals with runs a lost lease left (the give-back's
// LockEmptyLanes tries the locks too, and LeaseLane, a turn on one lane,
// takes no lock with a try).
func isLease(sql string) bool {
	return strings.Contains(sql, "pg_try_advisory_xact_lock") && strings.Contains(sql, "lost AS (")
}

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
	t.capture(d.SQL, d.Args)
	return context.WithValue(ctx, traceKey{}, traceStart{label: label(d.SQL), at: time.Now()})
}

func (t *tracer) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryEndData) {
	st, ok := ctx.Value(traceKey{}).(traceStart)
	if !ok {
		return
	}
	t.record(st.label, time.Since(st.at), d.CommandTag, d.Err)
}

// batchClock times the statements of one batch: each is charged the time
// since the previous one's result was read (the first, since the batch was
// sent), so the round trip is charged to the first.
type batchClock struct{ last time.Time }

type batchKey struct{}

func (t *tracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return context.WithValue(ctx, batchKey{}, &batchClock{last: time.Now()})
}

func (t *tracer) TraceBatchQuery(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	t.capture(d.SQL, d.Args)
	c, ok := ctx.Value(batchKey{}).(*batchClock)
	if !ok {
		return
	}
	if strings.HasPrefix(strings.TrimSpace(d.SQL), "SELECT set_config(") {
		// The engine's batches open with set_config statements; PostgreSQL
		// answers a batch as a whole, so charge its round trip to the
		// statement that does the work.
		return
	}
	now := time.Now()
	el := now.Sub(c.last)
	c.last = now
	t.record(label(d.SQL), el, d.CommandTag, d.Err)
}

func (t *tracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// capture keeps the first fetch statement and the first lane lease seen.
func (t *tracer) capture(sql string, args []any) {
	if !isFetch(sql) && !isLease(sql) {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if isFetch(sql) && t.sql == "" {
		t.sql, t.args = sql, slices.Clone(args)
	}
	if isLease(sql) && t.leaseSQL == "" {
		t.leaseSQL, t.leaseArgs = sql, slices.Clone(args)
	}
}

// record adds one statement's time to the profile.
func (t *tracer) record(label string, el time.Duration, tag pgconn.CommandTag, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.profile == nil {
		t.profile = map[string]*stmtStat{}
	}
	p := t.profile[label]
	if p == nil {
		p = &stmtStat{}
		t.profile[label] = p
	}
	p.n++
	p.total += el
	if strings.HasPrefix(label, "fetch") {
		t.times = append(t.times, el)
		if err == nil && tag.RowsAffected() > 0 {
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

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
