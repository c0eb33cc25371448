package processors_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/internal/testenv"
	"github.com/omnibus-go/omnibus/middleware"
	"github.com/omnibus-go/omnibus/processors"
	"github.com/omnibus-go/omnibus/transports/postgres"
)

// storeEvents stores typed events for group as if received from topic.
func storeEvents(t *testing.T, pool *pgxpool.Pool, in *postgres.Inbox, group string, msgs ...*message.Message) {
	t.Helper()
	fresh, err := in.StoreWith(context.Background(), pool, postgres.StoreOptions{Group: group, Topic: "orders"}, msgs...)
	require.NoError(t, err)
	for i, f := range fresh {
		require.True(t, f, "message %d new", i)
	}
}

func orderMsg(key, eventType, step string) *message.Message {
	payload, _ := json.Marshal(orderEvent{OrderID: key, Step: step})
	m := message.NewMessage(watermill.NewUUID(), payload)
	bus.SetPartitionKey(m, key)
	bus.SetEventType(m, eventType)
	return m
}

func TestDispatcher_PerKeyOrderWithAFailingHead(t *testing.T) {
	t.Parallel()
	pool, in := newInboxTable(t)
	created := orderMsg("order-1", "order.created", "created")
	storeEvents(t, pool, in, "billing",
		created, orderMsg("order-1", "order.paid", "paid"), orderMsg("order-1", "order.cancelled", "cancelled"))

	var (
		mu       sync.Mutex
		attempts []string
		tries    = map[string]int{}
	)
	handle := func(_ context.Context, ev orderEvent, _ *message.Message) error {
		mu.Lock()
		defer mu.Unlock()
		attempts = append(attempts, ev.Step)
		tries[ev.Step]++
		if ev.Step == "created" {
			switch tries[ev.Step] {
			case 1:
				return bus.Transient(errors.New("ledger unavailable"))
			case 2:
				return errors.New("ledger rejected the entry")
			}
		}
		return nil
	}
	startDispatcher(t, pool, processors.DispatcherConfig{
		Subscriber: postgres.SubscriberConfig{Table: in.Table(), ConsumerGroup: "billing"},
		Retry:      fastRetry,
	}, func(d *processors.Dispatcher) {
		for _, et := range []string{"order.created", "order.paid", "order.cancelled"} {
			processors.Handle(d, et, handle)
		}
	})
	testenv.Eventually(t, 20*time.Second, func() bool {
		return countRows(t, pool, in, "status = 'completed'") == 3
	}, "all three handled")
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, []string{"created", "created", "created", "paid", "cancelled"}, attempts,
		"nothing of the key may be handled while its head waits for its retry")
	r, _ := rowOf(t, pool, in, "billing", created.UUID)
	assert.Equal(t, 1, r.attempts, "the transient failure spent no attempt, the counted one spent one")
	require.NotNil(t, r.lastError)
	assert.Contains(t, *r.lastError, "ledger rejected the entry")
}

func TestDispatcher_UnknownEventTypePolicies(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		policy     processors.UnknownTypePolicy
		wantStatus string
	}{
		{processors.UnknownFail, "failed"},
		{processors.UnknownSkip, "completed"},
		{processors.UnknownFallback, "completed"},
	} {
		t.Run(tc.policy.String(), func(t *testing.T) {
			t.Parallel()
			pool, in := newInboxTable(t)
			unknown := orderMsg("order-1", "order.refunded", "refunded")
			after := orderMsg("order-1", "order.paid", "paid")
			storeEvents(t, pool, in, "g", unknown, after)
			var known, fallback atomic.Int64
			cfg := processors.DispatcherConfig{
				Subscriber:  postgres.SubscriberConfig{Table: in.Table(), ConsumerGroup: "g"},
				Retry:       fastRetry,
				UnknownType: tc.policy,
			}
			if tc.policy == processors.UnknownFallback {
				cfg.Fallback = func(_ context.Context, m *message.Message) error {
					assert.Equal(t, "order.refunded", bus.EventType(m))
					fallback.Add(1)
					return nil
				}
			}
			startDispatcher(t, pool, cfg, func(d *processors.Dispatcher) {
				processors.Handle(d, "order.paid", func(context.Context, orderEvent, *message.Message) error {
					known.Add(1)
					return nil
				})
			})
			testenv.Eventually(t, 20*time.Second, func() bool {
				r, _ := rowOf(t, pool, in, "g", after.UUID)
				return r.status == "completed"
			}, "the known event after it handled")
			r, ok := rowOf(t, pool, in, "g", unknown.UUID)
			require.True(t, ok)
			assert.Equal(t, tc.wantStatus, r.status)
			assert.Equal(t, int64(1), known.Load())
			switch tc.policy {
			case processors.UnknownFail:
				require.NotNil(t, r.lastError)
				assert.Contains(t, *r.lastError, `"order.refunded"`, "the reason names the type")
				assert.Equal(t, 1, r.attempts, "failed at once")
			case processors.UnknownSkip:
				assert.Nil(t, r.lastError)
				assert.Zero(t, fallback.Load())
			case processors.UnknownFallback:
				assert.Equal(t, int64(1), fallback.Load())
			}
		})
	}
}

func TestDispatcher_MalformedPayloadFailsAtOnceWithoutRetries(t *testing.T) {
	t.Parallel()
	pool, in := newInboxTable(t)
	bad := message.NewMessage(watermill.NewUUID(), []byte(`{"order_id": 42`))
	bus.SetPartitionKey(bad, "order-1")
	bus.SetEventType(bad, "order.paid")
	wrongType := message.NewMessage(watermill.NewUUID(), []byte(`{"order_id": 42}`))
	bus.SetPartitionKey(wrongType, "order-2")
	bus.SetEventType(wrongType, "order.paid")
	good := orderMsg("order-1", "order.paid", "paid")
	storeEvents(t, pool, in, "g", bad, wrongType, good)
	var calls atomic.Int64
	startDispatcher(t, pool, processors.DispatcherConfig{
		Subscriber: postgres.SubscriberConfig{Table: in.Table(), ConsumerGroup: "g"},
		Retry:      fastRetry,
	}, func(d *processors.Dispatcher) {
		processors.Handle(d, "order.paid", func(context.Context, orderEvent, *message.Message) error {
			calls.Add(1)
			return nil
		})
	})
	testenv.Eventually(t, 20*time.Second, func() bool {
		r, _ := rowOf(t, pool, in, "g", good.UUID)
		return r.status == "completed"
	}, "the event behind the malformed one handled")
	testenv.Eventually(t, 10*time.Second, func() bool {
		return countRows(t, pool, in, "status = 'failed'") == 2
	}, "both malformed rows failed")
	for _, m := range []*message.Message{bad, wrongType} {
		r, _ := rowOf(t, pool, in, "g", m.UUID)
		assert.Equal(t, "failed", r.status)
		assert.Equal(t, 1, r.attempts, "no retries")
		require.NotNil(t, r.lastError)
		assert.Contains(t, *r.lastError, `decode "order.paid" payload into processors_test.orderEvent`)
	}
	assert.Equal(t, int64(1), calls.Load(), "the handler never sees a payload that does not decode")
}

func TestDispatcher_ExactlyOnceEffectsInTheTransaction(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		// first is the first call's misbehaviour, after its write.
		first func(ctx context.Context, t *testing.T, fxTx effectsTx) error
	}{
		{
			name: "handler fails after its write",
			first: func(context.Context, *testing.T, effectsTx) error {
				return errors.New("downstream said no")
			},
		},
		{
			name: "connection dies between write and commit",
			first: func(ctx context.Context, t *testing.T, fxTx effectsTx) error {
				// The process "dies": its connection goes away before commit.
				pid := fxTx.pid
				_, err := testenv.Postgres(t).Exec(context.Background(), `SELECT pg_terminate_backend($1, 10000)`, pid) // waits until it is gone
				assert.NoError(t, err)
				return nil
			},
		},
		{
			name: "transaction cancelled between write and commit",
			first: func(ctx context.Context, _ *testing.T, _ effectsTx) error {
				<-ctx.Done() // the Timeout middleware cancels it
				return ctx.Err()
			},
		},
	} {
		for _, stack := range []string{"pgx", "database/sql"} {
			t.Run(tc.name+"/"+stack, func(t *testing.T) {
				t.Parallel()
				pool, in := newInboxTable(t)
				fx := newEffects(t, pool)
				msg := orderMsg("order-1", "order.paid", "paid")
				next := orderMsg("order-1", "order.shipped", "shipped")
				storeEvents(t, pool, in, "g", msg, next)
				cfg := processors.DispatcherConfig{
					Subscriber:    postgres.SubscriberConfig{Table: in.Table(), ConsumerGroup: "g"},
					Retry:         fastRetry,
					Timeout:       500 * time.Millisecond,
					Transactional: true,
				}
				if stack == "database/sql" {
					cfg.SQLDB = stdlib.OpenDBFromPool(pool)
					t.Cleanup(func() { _ = cfg.SQLDB.Close() })
				}
				var calls atomic.Int64
				startDispatcher(t, pool, cfg, func(d *processors.Dispatcher) {
					processors.Handle(d, "order.paid", func(ctx context.Context, ev orderEvent, m *message.Message) error {
						tx, ok := handlerTx(ctx, stack)
						if !ok {
							return bus.Permanent(errors.New("no transaction"))
						}
						if err := fx.write(ctx, tx, m.UUID, ev.Step); err != nil {
							return err
						}
						if calls.Add(1) == 1 {
							return tc.first(ctx, t, effectsTx{pid: tx.pid(ctx, t)})
						}
						return nil
					})
					processors.Handle(d, "order.shipped", func(ctx context.Context, ev orderEvent, m *message.Message) error {
						tx, _ := handlerTx(ctx, stack)
						return fx.write(ctx, tx, m.UUID, ev.Step)
					})
				})
				testenv.Eventually(t, 20*time.Second, func() bool {
					return countRows(t, pool, in, "status = 'completed'") == 2
				}, "both events handled")
				assert.Equal(t, int64(2), calls.Load(), "handled again after the failed first call")
				assert.Equal(t, 2, fx.count(t), "exactly one effect per event: the first call's write was rolled back")
				r, _ := rowOf(t, pool, in, "g", msg.UUID)
				require.NotNil(t, r.lastError, "the first call's failure was recorded on the row")
			})
		}
	}
}

// handlerTx is the transaction a transactional handler gets on stack:
// postgres.TxFromContext for pgx, postgres.SQLTxFromContext for
// database/sql.
func handlerTx(ctx context.Context, stack string) (effectsDB, bool) {
	if stack == "pgx" {
		tx, ok := postgres.TxFromContext(ctx)
		return pgxEffectsDB{tx}, ok
	}
	tx, ok := postgres.SQLTxFromContext(ctx)
	return sqlEffectsDB{tx}, ok
}

// effectsTx tells a test hook about the handler's transaction.
type effectsTx struct{ pid uint32 }

func TestDispatcher_CountedFailureInTheTransactionWaitsForBackoff(t *testing.T) {
	t.Parallel()
	pool, in := newInboxTable(t)
	fx := newEffects(t, pool)
	msg := orderMsg("order-1", "order.paid", "paid")
	storeEvents(t, pool, in, "g", msg)
	var (
		calls  atomic.Int64
		failed = make(chan struct{})
	)
	startDispatcher(t, pool, processors.DispatcherConfig{
		Subscriber: postgres.SubscriberConfig{Table: in.Table(), ConsumerGroup: "g"},
		// An hour of backoff: the retry happens only when the test moves it.
		Retry:         middleware.RetryConfig{Base: time.Hour, Cap: time.Hour},
		Transactional: true,
	}, func(d *processors.Dispatcher) {
		processors.Handle(d, "order.paid", func(ctx context.Context, ev orderEvent, m *message.Message) error {
			tx, _ := postgres.TxFromContext(ctx)
			if err := fx.write(ctx, pgxEffectsDB{tx}, m.UUID, ev.Step); err != nil {
				return err
			}
			if calls.Add(1) == 1 {
				close(failed)
				return errors.New("insufficient funds")
			}
			return nil
		})
	})
	<-failed
	testenv.Eventually(t, 10*time.Second, func() bool {
		// attempts is 1 from the lease on; the settlement releases the row.
		return countRows(t, pool, in, "message_id = $1 AND attempts = 1 AND locked_by IS NULL", msg.UUID) == 1
	}, "the failure settled with a retry time")
	var retryIn time.Duration
	require.NoError(t, pool.QueryRow(context.Background(),
		`SELECT scheduled_at - now() FROM `+quoted(in)+` WHERE message_id = $1`, msg.UUID).Scan(&retryIn))
	assert.Greater(t, retryIn, 29*time.Minute, "a counted failure waits for its backoff (half to all of Base)")
	assert.Zero(t, fx.count(t), "the failed call's effect was rolled back")

	_, err := pool.Exec(context.Background(), `UPDATE `+quoted(in)+` SET scheduled_at = now() WHERE message_id = $1`, msg.UUID)
	require.NoError(t, err)
	// Bring the retry time forward; the lane carries it too.
	_, err = pool.Exec(context.Background(), `UPDATE `+quotedLanes(in)+` SET ready_at = now()`)
	require.NoError(t, err)
	testenv.Eventually(t, 20*time.Second, func() bool {
		r, _ := rowOf(t, pool, in, "g", msg.UUID)
		return r.status == "completed"
	}, "the retry to complete the row")
	assert.Equal(t, 1, fx.count(t), "exactly one effect after the retry")
	assert.Equal(t, int64(2), calls.Load())
}

func quoted(in *postgres.Inbox) string { return `"` + in.Table() + `"` }

func quotedLanes(in *postgres.Inbox) string { return `"` + in.Table() + `_lanes"` }

func TestDispatcher_WithoutTheTransactionalOptionThereIsNoTx(t *testing.T) {
	t.Parallel()
	pool, in := newInboxTable(t)
	msg := orderMsg("order-1", "order.paid", "paid")
	storeEvents(t, pool, in, "g", msg)
	hadTx := make(chan bool, 1)
	startDispatcher(t, pool, processors.DispatcherConfig{
		Subscriber: postgres.SubscriberConfig{Table: in.Table(), ConsumerGroup: "g"},
	}, func(d *processors.Dispatcher) {
		processors.Handle(d, "order.paid", func(ctx context.Context, _ orderEvent, _ *message.Message) error {
			_, ok := postgres.TxFromContext(ctx)
			hadTx <- ok
			return nil
		})
	})
	select {
	case ok := <-hadTx:
		assert.False(t, ok)
	case <-time.After(20 * time.Second):
		t.Fatal("not handled within 20s")
	}
}

func TestDispatcher_RegistrationAndConfigErrors(t *testing.T) {
	t.Parallel()
	pool, in := newInboxTable(t)
	sub := postgres.SubscriberConfig{Table: in.Table(), ConsumerGroup: "g"}
	fallback := func(context.Context, *message.Message) error { return nil }
	for _, tc := range []struct {
		name  string
		cfg   processors.DispatcherConfig
		field string
	}{
		{"no group", processors.DispatcherConfig{Subscriber: postgres.SubscriberConfig{Table: in.Table()}}, "ConsumerGroup"},
		{"fallback policy without fallback", processors.DispatcherConfig{Subscriber: sub, UnknownType: processors.UnknownFallback}, "Fallback"},
		{"fallback with another policy", processors.DispatcherConfig{Subscriber: sub, Fallback: fallback}, "Fallback"},
		{"unknown policy", processors.DispatcherConfig{Subscriber: sub, UnknownType: 7}, "UnknownType"},
		{"negative timeout", processors.DispatcherConfig{Subscriber: sub, Timeout: -time.Second}, "Timeout"},
		{"database/sql without transactions", processors.DispatcherConfig{Subscriber: sub, SQLDB: stdlib.OpenDBFromPool(pool)}, "SQLDB: set, but Transactional is false"},
	} {
		_, err := processors.NewDispatcher(pool, tc.cfg, nil)
		require.Error(t, err, tc.name)
		assert.Contains(t, err.Error(), "invalid config: ", tc.name)
		assert.Contains(t, err.Error(), tc.field, tc.name)
	}

	d, err := processors.NewDispatcher(pool, processors.DispatcherConfig{Subscriber: sub}, nil)
	require.NoError(t, err)
	defer func() { _ = d.Close() }()
	h := func(context.Context, orderEvent, *message.Message) error { return nil }
	processors.Handle(d, "order.paid", h)
	assert.PanicsWithValue(t, `processors.Handle: event type "order.paid" already has a handler`, func() { processors.Handle(d, "order.paid", h) })
	assert.Panics(t, func() { processors.Handle(d, "", h) })
	assert.Panics(t, func() { processors.Handle[orderEvent](d, "x", nil) })
	assert.Equal(t, []string{"order.paid"}, d.EventTypes())

	// Dispatch reports the unknown type without a subscriber in sight.
	m := orderMsg("k", "order.lost", "lost")
	err = d.Dispatch(m)
	var unknown *processors.UnknownEventTypeError
	require.ErrorAs(t, err, &unknown)
	assert.Equal(t, "order.lost", unknown.EventType)
	assert.ErrorIs(t, err, processors.ErrUnknownEventType)
	assert.Equal(t, bus.ClassPermanent, bus.ClassOf(err))
	assert.True(t, strings.Contains(err.Error(), `"order.lost"`), "the error names the type: %v", err)
}

func TestDispatcher_DeadLetterTakesAnUndecodableMessageAndTheKeyMovesOn(t *testing.T) {
	t.Parallel()
	pool, in := newInboxTable(t)
	bad := orderMsg("order-1", "order.paid", "paid")
	bad.Payload = []byte("not json")
	next := orderMsg("order-1", "order.shipped", "shipped")
	storeEvents(t, pool, in, "g", bad, next)
	letters := newTarget(nil)
	dl, err := middleware.NewDeadLetter(middleware.DeadLetterConfig{Publisher: letters, Topic: "billing.dlq"}, nil)
	require.NoError(t, err)
	handled := newCounter()
	startDispatcher(t, pool, processors.DispatcherConfig{
		Subscriber: postgres.SubscriberConfig{Table: in.Table(), ConsumerGroup: "g"},
		Retry:      fastRetry,
		DeadLetter: dl,
	}, func(d *processors.Dispatcher) {
		for _, typ := range []string{"order.paid", "order.shipped"} {
			processors.Handle(d, typ, func(_ context.Context, ev orderEvent, m *message.Message) error {
				handled.add(ev.Step)
				return nil
			})
		}
	})
	testenv.Eventually(t, 20*time.Second, func() bool {
		return countRows(t, pool, in, "status = 'completed'") == 2
	}, "both rows completed")
	assert.Equal(t, []string{"shipped"}, handled.snapshot(), "the undecodable message never reached a handler")
	_, dead := letters.snapshot()
	require.Len(t, dead, 1)
	assert.Equal(t, bad.UUID, dead[0].UUID)
	assert.Equal(t, "not json", string(dead[0].Payload))
	assert.Equal(t, "permanent", dead[0].Metadata.Get(middleware.MetaDeadLetterClass))
	assert.Zero(t, countRows(t, pool, in, "status = 'failed'"), "nothing left failed in the inbox")
}
