package omnibustest_test

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/internal/testenv"
	"github.com/omnibus-go/omnibus/middleware"
	"github.com/omnibus-go/omnibus/omnibustest"
	"github.com/omnibus-go/omnibus/processors"
	"github.com/omnibus-go/omnibus/transports/postgres"
)

// exampleT stands in for the *testing.T of a user's test, which is what
// the helpers are given there.
type exampleT struct{ cleanups []func() }

func (*exampleT) Helper() {}
func (*exampleT) Fatalf(format string, args ...any) {
	fmt.Printf("FAIL: "+format+"\n", args...)
	os.Exit(1)
}
func (t *exampleT) Cleanup(f func()) { t.cleanups = append(t.cleanups, f) }
func (t *exampleT) done() {
	for i := len(t.cleanups) - 1; i >= 0; i-- {
		t.cleanups[i]()
	}
}

func examplePool() *pgxpool.Pool {
	pool, err := pgxpool.New(context.Background(), testenv.PostgresURL())
	if err != nil {
		panic(err)
	}
	return pool
}

// placeOrder is the code under test: it writes an order's event in the
// caller's transaction.
func placeOrder(ctx context.Context, tx pgx.Tx, outbox *postgres.Outbox, id string, amount int) error {
	msg := message.NewMessage(watermill.NewUUID(), fmt.Appendf(nil, `{"id":%q,"amount":%d}`, id, amount))
	bus.SetPartitionKey(msg, id)
	bus.SetEventType(msg, "order.placed")
	return outbox.Enqueue(ctx, tx, "orders", msg)
}

// A test of code that enqueues: New gives the test its own outbox, and
// RequireEnqueued finds the event in the transaction before it commits.
func ExampleEnv_RequireEnqueued() {
	t := &exampleT{} // in a test: the *testing.T
	defer t.done()
	pool := examplePool()
	defer pool.Close()
	env := omnibustest.New(t, pool)
	ctx := context.Background()

	tx, _ := pool.Begin(ctx)
	defer func() { _ = tx.Rollback(ctx) }()
	if err := placeOrder(ctx, tx, env.Outbox, "order-1", 4200); err != nil {
		t.Fatalf("place order: %v", err)
	}
	ev := env.RequireEnqueued(t, tx, omnibustest.Match{
		Topic: "orders", Key: "order-1", Type: "order.placed",
		Payload: omnibustest.JSONPayload(map[string]any{"id": "order-1", "amount": 4200}),
	})
	env.RequireNoneEnqueued(t, tx, omnibustest.Match{Key: "order-2"})
	fmt.Println(ev)
	// Output: topic="orders" key="order-1" type="order.placed" payload="{\"id\":\"order-1\",\"amount\":4200}"
}

// Drain shows what a relay publishes from what the code under test
// committed.
func ExampleEnv_Drain() {
	t := &exampleT{}
	defer t.done()
	pool := examplePool()
	defer pool.Close()
	env := omnibustest.New(t, pool)
	ctx := context.Background()
	for i, id := range []string{"order-1", "order-2", "order-1"} {
		_ = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return placeOrder(ctx, tx, env.Outbox, id, i) })
	}
	for _, p := range env.Drain(t) {
		if bus.PartitionKey(p.Message) == "order-1" {
			fmt.Println(p)
		}
	}
	// Output:
	// topic="orders" key="order-1" type="order.placed" payload="{\"id\":\"order-1\",\"amount\":0}"
	// topic="orders" key="order-1" type="order.placed" payload="{\"id\":\"order-1\",\"amount\":2}"
}

// Handle feeds messages to a dispatcher and reports what became of each;
// the test then checks the handler's effects.
func ExampleEnv_Handle() {
	t := &exampleT{}
	defer t.done()
	pool := examplePool()
	defer pool.Close()
	env := omnibustest.New(t, pool)
	d, err := processors.NewDispatcher(pool, processors.DispatcherConfig{
		Subscriber: postgres.SubscriberConfig{Table: env.Inbox.Table(), ConsumerGroup: "billing"},
		Retry:      middleware.RetryConfig{Base: time.Millisecond, Cap: 10 * time.Millisecond},
	}, nil)
	if err != nil {
		t.Fatalf("dispatcher: %v", err)
	}
	var billed []int
	processors.Handle(d, "order.placed", func(_ context.Context, ev struct{ Amount int }, _ *message.Message) error {
		if ev.Amount <= 0 {
			return bus.Permanent(fmt.Errorf("amount %d is not positive", ev.Amount))
		}
		billed = append(billed, ev.Amount)
		return nil
	})
	good := message.NewMessage(watermill.NewUUID(), []byte(`{"amount":4200}`))
	bad := message.NewMessage(watermill.NewUUID(), []byte(`{"amount":0}`))
	for _, m := range []*message.Message{good, bad} {
		bus.SetEventType(m, "order.placed")
	}
	for _, r := range env.Handle(t, d, "orders", good, bad) {
		fmt.Println(r.Status, r.LastError != "")
	}
	fmt.Println("billed:", billed)
	// Output:
	// completed false
	// failed true
	// billed: [4200]
}

// New gives each test an outbox and an inbox of its own, so tests run in
// parallel; the code under test gets env.Outbox (or its table name).
func ExampleNew() {
	t := &exampleT{}
	defer t.done()
	pool := examplePool()
	defer pool.Close()
	env := omnibustest.New(t, pool)
	fmt.Println(env.Outbox.Table() == env.Schema+".omnibus_outbox", env.Inbox.Table() == env.Schema+".omnibus_inbox")
	// Output: true true
}

// Enqueued lists what a transaction (or the pool) sees in the outbox.
func ExampleEnv_Enqueued() {
	t := &exampleT{}
	defer t.done()
	pool := examplePool()
	defer pool.Close()
	env := omnibustest.New(t, pool)
	ctx := context.Background()
	_ = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return placeOrder(ctx, tx, env.Outbox, "order-7", 1) })
	for _, ev := range env.Enqueued(t, pool) {
		fmt.Println(ev.Key, ev.Type)
	}
	// Output: order-7 order.placed
}

// RequireNoneEnqueued checks that a path enqueues nothing — here, a
// transaction that was rolled back.
func ExampleEnv_RequireNoneEnqueued() {
	t := &exampleT{}
	defer t.done()
	pool := examplePool()
	defer pool.Close()
	env := omnibustest.New(t, pool)
	ctx := context.Background()
	tx, _ := pool.Begin(ctx)
	_ = placeOrder(ctx, tx, env.Outbox, "order-8", 1)
	_ = tx.Rollback(ctx)
	env.RequireNoneEnqueued(t, pool)
	fmt.Println("nothing enqueued")
	// Output: nothing enqueued
}

// JSONPayload compares JSON, not bytes: key order and spacing do not matter.
func ExampleJSONPayload() {
	match := omnibustest.JSONPayload(map[string]any{"id": "order-1", "amount": 4200})
	fmt.Println(match([]byte(`{ "amount": 4200, "id": "order-1" }`)), match([]byte(`{"id":"order-1","amount":1}`)))
	// Output: true false
}
