package inboxbench

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

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

// insertTracer watches the inbox inserts of a pool (statements of nine or
// more arguments whose second is the array of message ids: the floor's
// insert has nine, Inbox.Store's ten): how many, how many rows each, and
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
	if len(d.Args) >= 9 {
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
