package postgres

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/internal/testenv"
)

// newOutbox migrates a fresh outbox table for the test and drops it after.
func newOutbox(t *testing.T) (*pgxpool.Pool, *Outbox) {
	t.Helper()
	pool := testenv.Postgres(t)
	name := testenv.Name(t)
	ctx := context.Background()
	require.NoError(t, Migrate(ctx, pool, testTable(OutboxTable(name))))
	dropAfter(t, pool, name)
	ob, err := NewOutbox(OutboxConfig{Table: name})
	require.NoError(t, err)
	return pool, ob
}

// testTable is t in the layout this run of the package's tests uses: the
// single table, or with OMNIBUS_TEST_LAYOUT=partitioned the partitioned
// layout (one-hour partitions), so that the suites that build their tables
// through newOutbox and newInbox run on both (make test runs both).
func testTable(t Table) Table {
	if testPartitioned() {
		t.PartitionInterval = time.Hour
	}
	return t
}

func testPartitioned() bool { return os.Getenv("OMNIBUS_TEST_LAYOUT") == "partitioned" }

// event builds a keyed message.
func event(key, payload string) *message.Message {
	msg := message.NewMessage(watermill.NewUUID(), []byte(payload))
	if key != "" {
		bus.SetPartitionKey(msg, key)
	}
	return msg
}

// testEngine is an engine over the outbox for cycle-by-cycle tests.
func testEngine(pool *pgxpool.Pool, ob *Outbox, worker string, run int) *engine {
	return &engine{pool: pool, q: ob.q, worker: worker, lease: 30 * time.Second, run: run}
}

func enqueue(t *testing.T, pool *pgxpool.Pool, ob *Outbox, topic string, msgs ...*message.Message) {
	t.Helper()
	require.NoError(t, ob.Enqueue(context.Background(), pool, topic, msgs...))
}

func payloads(rs []row) []string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = string(r.payload)
	}
	return out
}

// cycle is one relay cycle driven by hand: fetch, let decide settle each
// delivered row (nil → ack), settle, give the lanes back. It returns the
// rows delivered in this cycle, run by run.
func cycle(t *testing.T, e *engine, batch int, decide func(r row) *settleOp) []row {
	t.Helper()
	ctx := context.Background()
	res, err := e.fetch(ctx, AllTopics, batch, batch)
	require.NoError(t, err)
	var (
		out   []row
		ops   []settleOp
		lanes = append([]laneKey(nil), res.idle...)
		// nacked: lanes whose run had a row not acked
		nacked = map[laneKey]bool{}
	)
	for _, r := range res.cut {
		ops = append(ops, r.settle('r'))
	}
	for _, u := range res.units {
		for i, r := range u.rows {
			out = append(out, r)
			var op *settleOp
			if decide != nil {
				op = decide(r)
			}
			if op == nil {
				ops = append(ops, r.settle('a'))
				continue
			}
			op.id, op.lease = r.id, r.attempts+1
			ops = append(ops, *op)
			if u.lane != nil {
				nacked[*u.lane] = true
			}
			for _, rest := range u.rows[i+1:] {
				ops = append(ops, rest.settle('r'))
			}
			break
		}
		if u.lane != nil {
			lanes = append(lanes, *u.lane)
		}
	}
	_, err = e.settle(ctx, ops)
	require.NoError(t, err)
	// As the flusher does: each lane with a run gives back the highest id
	// its fetch handed out, so the lane's floor moves, and a lane whose run
	// was all acked and shorter than RunLength is given back as drained
	// (subscription.deliver).
	lasts := map[laneKey]int64{}
	drained := map[laneKey]bool{}
	for _, u := range res.units {
		if u.lane != nil {
			lasts[*u.lane] = u.rows[len(u.rows)-1].id
			drained[*u.lane] = len(u.rows) < e.run && !nacked[*u.lane]
		}
	}
	retry, _, err := e.reconcile(ctx, lanes, lasts, drained)
	require.NoError(t, err)
	require.Empty(t, retry, "no writer holds a lane here, so every lane must be given back")
	return out
}

// rowState reads one row's bookkeeping by payload.
type rowState struct {
	status      string
	attempts    int
	lastError   *string
	scheduledAt time.Time
	lockedBy    *string
}

func stateOf(t *testing.T, pool *pgxpool.Pool, ob *Outbox, payload string) rowState {
	t.Helper()
	var s rowState
	require.NoError(t, pool.QueryRow(context.Background(),
		`SELECT status, attempts, last_error, scheduled_at, locked_by FROM `+ob.q.table.quoted()+` WHERE payload = $1`,
		[]byte(payload)).Scan(&s.status, &s.attempts, &s.lastError, &s.scheduledAt, &s.lockedBy))
	return s
}

func failWith(class bus.Class, retryAt time.Time) func(row) *settleOp {
	return func(row) *settleOp {
		op := &settleOp{op: 'n', err: "boom", inc: 1}
		switch class {
		case bus.ClassTransient:
			op.inc = 0
		case bus.ClassPermanent:
			op.giveUp = true
		}
		if !retryAt.IsZero() {
			op.retryAt = &retryAt
		}
		return op
	}
}

// takeNotes turns the writers' lane notes into lanes, as the first statement
// of every relay fetch does, so a test can shape lane rows by hand.
func takeNotes(t *testing.T, pool *pgxpool.Pool, q *queries) {
	t.Helper()
	_, err := pool.Exec(context.Background(), q.takeNotes)
	require.NoError(t, err)
}

// dropAfter drops the table called name, with everything Migrate made for
// it, when the test ends.
func dropAfter(t *testing.T, pool *pgxpool.Pool, name string) {
	t.Helper()
	t.Cleanup(func() {
		_ = Drop(context.Background(), pool, OutboxTable(name))
	})
}
