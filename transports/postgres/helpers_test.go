package postgres

import (
	"context"
	"fmt"
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
	require.NoError(t, Migrate(ctx, pool, OutboxTable(name)))
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), fmt.Sprintf(`DROP TABLE IF EXISTS %q, %q CASCADE; DROP FUNCTION IF EXISTS %q, %q CASCADE;
			DELETE FROM omnibus_schema_migrations WHERE table_name = '%s'`,
			name, name+"_lanes", name+"_lane_fn", name+"_notify_fn", name))
	})
	ob, err := NewOutbox(OutboxConfig{Table: name})
	require.NoError(t, err)
	return pool, ob
}

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

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func payloads(rs []row) []string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = string(r.payload)
	}
	return out
}
