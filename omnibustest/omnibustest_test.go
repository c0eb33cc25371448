package omnibustest_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/internal/testenv"
	"github.com/omnibus-go/omnibus/middleware"
	"github.com/omnibus-go/omnibus/omnibustest"
	"github.com/omnibus-go/omnibus/processors"
	"github.com/omnibus-go/omnibus/transports/postgres"
)

// recorder is a omnibustest.TB that keeps the failure instead of failing.
type recorder struct {
	mu       sync.Mutex
	failure  string
	cleanups []func()
}

func (r *recorder) Helper() {}

func (r *recorder) Fatalf(format string, args ...any) {
	r.mu.Lock()
	r.failure = fmt.Sprintf(format, args...)
	r.mu.Unlock()
	runtime.Goexit()
}

func (r *recorder) Cleanup(f func()) { r.cleanups = append(r.cleanups, f) }

// failure runs f with a recorder as its TB, as a test's goroutine would, and
// returns the failure message ("" when f passed).
func failure(f func(t omnibustest.TB)) string {
	r := &recorder{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(r)
	}()
	<-done
	for i := len(r.cleanups) - 1; i >= 0; i-- {
		r.cleanups[i]()
	}
	return r.failure
}

func event(key, typ, payload string) *message.Message {
	msg := message.NewMessage(watermill.NewUUID(), []byte(payload))
	bus.SetPartitionKey(msg, key)
	bus.SetEventType(msg, typ)
	return msg
}

func TestNew_EachTestHasItsOwnTablesDroppedAtTheEnd(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	var schema string
	t.Run("a test", func(t *testing.T) {
		a, b := omnibustest.New(t, pool), omnibustest.New(t, pool)
		assert.NotEqual(t, a.Outbox.Table(), b.Outbox.Table())
		require.NoError(t, a.Outbox.Enqueue(context.Background(), pool, "orders", event("k", "t", `{}`)))
		assert.Len(t, a.Enqueued(t, pool), 1)
		assert.Empty(t, b.Enqueued(t, pool), "another test's outbox is another table")
		schema = a.Schema
	})
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_namespace WHERE nspname = $1`, schema).Scan(&n))
	assert.Zero(t, n, "the schema is dropped when the test ends")
}

func TestRequireEnqueued_SeesTheTransactionsOwnEventsOnEitherStack(t *testing.T) {
	t.Parallel()
	env := omnibustest.New(t, testenv.Postgres(t))
	ctx := context.Background()

	tx, err := env.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	require.NoError(t, env.Outbox.Enqueue(ctx, tx, "orders", event("order-1", "order.placed", `{"amount": 42, "id": "order-1"}`)))
	got := env.RequireEnqueued(t, tx, omnibustest.Match{Topic: "orders", Key: "order-1", Type: "order.placed",
		Payload: omnibustest.JSONPayload(map[string]any{"id": "order-1", "amount": 42})})
	assert.Equal(t, "order-1", got.Metadata[bus.KeyPartitionKey])
	env.RequireNoneEnqueued(t, env.Pool) // not committed: others see nothing

	db := stdlib.OpenDBFromPool(env.Pool)
	defer func() { _ = db.Close() }()
	sqlTx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer func() { _ = sqlTx.Rollback() }()
	require.NoError(t, env.Outbox.EnqueueSQL(ctx, sqlTx, "orders", event("order-2", "order.placed", `{}`)))
	env.RequireEnqueued(t, sqlTx, omnibustest.Match{Key: "order-2"})
	env.RequireNoneEnqueued(t, sqlTx, omnibustest.Match{Key: "order-1"})
}

func TestAssertions_FailWithWhatWasExpectedAndWhatWasFound(t *testing.T) {
	t.Parallel()
	env := omnibustest.New(t, testenv.Postgres(t))
	ctx := context.Background()
	require.NoError(t, env.Outbox.Enqueue(ctx, env.Pool, "orders",
		event("order-1", "order.placed", `{"n":1}`), event("order-1", "order.paid", `{"n":2}`)))

	assert.Equal(t, `omnibustest: no event enqueued matching key="order-2" type="order.placed"; enqueued: `+
		"\n\t"+`topic="orders" key="order-1" type="order.placed" payload="{\"n\":1}"`+
		"\n\t"+`topic="orders" key="order-1" type="order.paid" payload="{\"n\":2}"`,
		failure(func(t omnibustest.TB) {
			env.RequireEnqueued(t, env.Pool, omnibustest.Match{Key: "order-2", Type: "order.placed"})
		}))
	assert.Equal(t, `omnibustest: 2 events enqueued matching topic="orders", want exactly one: `+
		"\n\t"+`topic="orders" key="order-1" type="order.placed" payload="{\"n\":1}"`+
		"\n\t"+`topic="orders" key="order-1" type="order.paid" payload="{\"n\":2}"`,
		failure(func(t omnibustest.TB) { env.RequireEnqueued(t, env.Pool, omnibustest.Match{Topic: "orders"}) }))
	assert.Equal(t, `omnibustest: no event enqueued matching type="order.paid" payload accepted by the matcher; enqueued: `+
		"\n\t"+`topic="orders" key="order-1" type="order.placed" payload="{\"n\":1}"`+
		"\n\t"+`topic="orders" key="order-1" type="order.paid" payload="{\"n\":2}"`,
		failure(func(t omnibustest.TB) {
			env.RequireEnqueued(t, env.Pool, omnibustest.Match{Type: "order.paid", Payload: omnibustest.JSONPayload(`{"n":3}`)})
		}))
	assert.Equal(t, `omnibustest: want no event enqueued matching type="order.paid", found 1: `+
		"\n\t"+`topic="orders" key="order-1" type="order.paid" payload="{\"n\":2}"`,
		failure(func(t omnibustest.TB) { env.RequireNoneEnqueued(t, env.Pool, omnibustest.Match{Type: "order.paid"}) }))
	assert.Equal(t, `omnibustest: Enqueued: string is neither a postgres.DB (pgx) nor has database/sql's QueryContext`,
		failure(func(t omnibustest.TB) { env.Enqueued(t, "not a database") }))
	assert.Empty(t, failure(func(t omnibustest.TB) { env.RequireNoneEnqueued(t, env.Pool, omnibustest.Match{Key: "order-2"}) }))
}

func TestDrain_ReturnsWhatTheRelayPublishedInOrderPerKey(t *testing.T) {
	t.Parallel()
	env := omnibustest.New(t, testenv.Postgres(t))
	ctx := context.Background()
	require.NoError(t, env.Outbox.Enqueue(ctx, env.Pool, "orders",
		event("a", "order.placed", `1`), event("b", "order.placed", `2`), event("a", "order.paid", `3`)))
	later := event("c", "order.placed", `later`)
	postgres.SetDeliverAt(later, time.Now().Add(time.Hour))
	require.NoError(t, env.Outbox.Enqueue(ctx, env.Pool, "orders", later))
	open, err := env.Pool.Begin(ctx) // uncommitted: not the relay's to see
	require.NoError(t, err)
	defer func() { _ = open.Rollback(ctx) }()
	require.NoError(t, env.Outbox.Enqueue(ctx, open, "orders", event("d", "order.placed", `open`)))

	got := env.Drain(t)
	perKey := map[string][]string{}
	for _, p := range got {
		assert.Equal(t, "orders", p.Topic)
		perKey[bus.PartitionKey(p.Message)] = append(perKey[bus.PartitionKey(p.Message)], string(p.Message.Payload))
	}
	assert.Equal(t, map[string][]string{"a": {"1", "3"}, "b": {"2"}}, perKey, "the due, committed events, in order per key")
}

type placed struct {
	Amount int `json:"amount"`
}

func TestHandle_RunsTheDispatcherUntilEachMessageIsSettled(t *testing.T) {
	t.Parallel()
	env := omnibustest.New(t, testenv.Postgres(t))
	ctx := context.Background()
	_, err := env.Pool.Exec(ctx, `CREATE TABLE `+env.Schema+`.payments (id text PRIMARY KEY, amount int NOT NULL)`)
	require.NoError(t, err)
	d, err := processors.NewDispatcher(env.Pool, processors.DispatcherConfig{
		Subscriber:    postgres.SubscriberConfig{Table: env.Inbox.Table(), ConsumerGroup: "payments", PollInterval: 10 * time.Millisecond},
		Retry:         middleware.RetryConfig{Base: time.Millisecond, Cap: 5 * time.Millisecond},
		Transactional: true,
	}, nil)
	require.NoError(t, err)
	var tried sync.Map // message ids called once
	processors.Handle(d, "order.placed", func(ctx context.Context, ev placed, m *message.Message) error {
		tx, _ := postgres.TxFromContext(ctx)
		if _, err := tx.Exec(ctx, `INSERT INTO `+env.Schema+`.payments VALUES ($1, $2)`, m.UUID, ev.Amount); err != nil {
			return err
		}
		if _, again := tried.LoadOrStore(m.UUID, true); !again {
			return errors.New("flaky downstream") // rolled back with the write
		}
		if ev.Amount < 0 {
			return bus.Permanent(errors.New("negative amount"))
		}
		return nil
	})
	ok, bad := event("order-1", "order.placed", `{"amount":42}`), event("order-2", "order.placed", `{"amount":-1}`)
	results := env.Handle(t, d, "orders", ok, bad)

	require.Len(t, results, 2)
	assert.Equal(t, omnibustest.Result{MessageID: ok.UUID, Status: "completed", Attempts: 1, LastError: results[0].LastError}, results[0],
		"completed after one failed attempt")
	assert.Contains(t, results[0].LastError, "flaky downstream")
	assert.Equal(t, bad.UUID, results[1].MessageID)
	assert.Equal(t, "failed", results[1].Status)
	assert.Equal(t, 2, results[1].Attempts, "a flaky failure, then the permanent one")
	assert.Contains(t, results[1].LastError, "negative amount")
	var amounts []int
	rows, err := env.Pool.Query(ctx, `SELECT amount FROM `+env.Schema+`.payments`)
	require.NoError(t, err)
	amounts, err = pgx.CollectRows(rows, pgx.RowTo[int])
	require.NoError(t, err)
	assert.Equal(t, []int{42}, amounts, "one effect: the failed calls' writes were rolled back")
}
