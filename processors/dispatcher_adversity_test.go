package processors_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omnibus-go/omnibus/internal/testenv"
	"github.com/omnibus-go/omnibus/middleware"
	"github.com/omnibus-go/omnibus/processors"
	"github.com/omnibus-go/omnibus/transports/postgres"
)

// The Dispatcher obeys the relay's rules (DESIGN §3): a handler that fails
// one key's head every time spends exactly max_attempts tries with the
// default budget and breaker, never opens the breaker, and the other keys
// are handled.
func TestDispatcher_PoisonHeadFailsAfterExactlyMaxAttempts(t *testing.T) {
	t.Parallel()
	pool, in := newInboxTable(t)
	msgs := []*message.Message{orderMsg("poisoned", "order.created", "poison"), orderMsg("poisoned", "order.created", "after")}
	for k := range 5 {
		for i := range 5 {
			msgs = append(msgs, orderMsg("order-"+string(rune('a'+k)), "order.created", string(rune('0'+i))))
		}
	}
	storeEvents(t, pool, in, "billing", msgs...)
	var (
		mu     sync.Mutex
		tries  int
		opened atomic.Bool
	)
	d := startDispatcher(t, pool, processors.DispatcherConfig{
		Subscriber: postgres.SubscriberConfig{Table: in.Table(), ConsumerGroup: "billing"},
		// Default budget and breaker; a short backoff so the test takes seconds.
		Retry: middleware.RetryConfig{Base: 20 * time.Millisecond, Cap: 200 * time.Millisecond},
		Breaker: middleware.CircuitBreakerConfig{OnStateChange: func(_, to middleware.BreakerState) {
			if to == middleware.BreakerOpen {
				opened.Store(true)
			}
		}},
	}, func(d *processors.Dispatcher) {
		processors.Handle(d, "order.created", func(_ context.Context, ev orderEvent, _ *message.Message) error {
			if ev.Step == "poison" {
				mu.Lock()
				tries++
				mu.Unlock()
				return errors.New("ledger rejects this entry, always")
			}
			return nil
		})
	})
	testenv.Eventually(t, 30*time.Second, func() bool {
		return countRows(t, pool, in, "status = 'failed'") == 1 && countRows(t, pool, in, "status = 'completed'") == len(msgs)-1
	}, "the poison row failed and every other row completed")
	var attempts, budget int
	require.NoError(t, pool.QueryRow(context.Background(),
		`SELECT attempts, max_attempts FROM `+quoted(in)+` WHERE status = 'failed'`).Scan(&attempts, &budget))
	assert.Equal(t, postgres.DefaultMaxAttempts, budget, "precondition: the default budget")
	assert.Equal(t, budget, attempts)
	mu.Lock()
	assert.Equal(t, budget, tries, "the handler saw the poison row exactly max_attempts times")
	mu.Unlock()
	assert.False(t, opened.Load(), "one poison message must not open the breaker")
	assert.Equal(t, middleware.BreakerClosed, d.Breaker().State())
}

// A user's router running the Dispatcher's handler without our Retry (so a
// failure is a plain Nack) sees a failing row about once per TransientDelay,
// never in a hot loop.
func TestDispatcher_PlainNackInAUsersRouterBacksOff(t *testing.T) {
	t.Parallel()
	pool, in := newInboxTable(t)
	storeEvents(t, pool, in, "billing", orderMsg("order-1", "order.created", "always fails"))
	d, err := processors.NewDispatcher(pool, processors.DispatcherConfig{
		Subscriber: postgres.SubscriberConfig{Table: in.Table(), ConsumerGroup: "billing",
			PollInterval: 20 * time.Millisecond, TransientDelay: 500 * time.Millisecond},
	}, nil)
	require.NoError(t, err)
	var calls atomic.Int64
	processors.Handle(d, "order.created", func(context.Context, orderEvent, *message.Message) error {
		calls.Add(1)
		return errors.New("fails")
	})
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	require.NoError(t, err)
	router.AddConsumerHandler("dispatch-without-retry", postgres.AllTopics, d.Subscriber(), d.HandleMessage)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	require.NoError(t, router.Run(ctx))
	n := calls.Load()
	assert.GreaterOrEqual(t, n, int64(2), "the row is handled again")
	assert.LessOrEqual(t, n, int64(6), "a plain Nack must not refetch the row in a hot loop (%d calls in 2 s)", n)
}

// A handler error whose text PostgreSQL cannot store (a NUL byte, invalid
// UTF-8) must not stop the settlement of the other rows.
func TestDispatcher_ErrorTextWithNULDoesNotStallOtherRows(t *testing.T) {
	t.Parallel()
	pool, in := newInboxTable(t)
	msgs := []*message.Message{orderMsg("k-nul", "order.created", "nul"), orderMsg("k-utf8", "order.created", "utf8")}
	for _, k := range []string{"a", "b", "c", "d"} {
		msgs = append(msgs, orderMsg("k-"+k, "order.created", "ok"))
	}
	storeEvents(t, pool, in, "billing", msgs...)
	var failedOnce sync.Map
	startDispatcher(t, pool, processors.DispatcherConfig{
		Subscriber: postgres.SubscriberConfig{Table: in.Table(), ConsumerGroup: "billing", Lease: 5 * time.Minute},
		Retry:      middleware.RetryConfig{Base: time.Hour},
	}, func(d *processors.Dispatcher) {
		processors.Handle(d, "order.created", func(_ context.Context, ev orderEvent, _ *message.Message) error {
			if _, done := failedOnce.LoadOrStore(ev.Step, true); done {
				return nil
			}
			switch ev.Step {
			case "nul":
				return errors.New("ledger said \x00 no")
			case "utf8":
				return errors.New("ledger said \xff\xfe")
			}
			return nil
		})
	})
	testenv.Eventually(t, 15*time.Second, func() bool {
		return countRows(t, pool, in, "status = 'completed'") == 4 &&
			countRows(t, pool, in, "status = 'pending' AND attempts = 1 AND locked_by IS NULL") == 2
	}, "every ack written next to failures with bad text")
	assert.Equal(t, 1, countRows(t, pool, in, "last_error LIKE '%ledger said%no%'"), "the NUL is replaced, the text kept")
}

// The ingest obeys the same rule: one broker message whose inline handling
// fails every time is retried by the broker with each failure counted, and
// it never opens the ingest's breaker, so the other messages keep being
// stored.
func TestInboxIngest_PoisonMessageDoesNotOpenTheBreaker(t *testing.T) {
	t.Parallel()
	pool, in := newInboxTable(t)
	b := newRedisBroker(t)
	pub := b.publisher()
	sub := b.subscriber("billing")
	var (
		poisonTries atomic.Int64
		opened      atomic.Bool
	)
	g := startIngest(t, pool, processors.InboxIngestConfig{
		Subscriber: sub, Topic: "orders", ConsumerGroup: "billing",
		Inbox: postgres.InboxConfig{Table: in.Table()}, Retry: fastRetry,
		Breaker: middleware.CircuitBreakerConfig{OnStateChange: func(_, to middleware.BreakerState) {
			if to == middleware.BreakerOpen {
				opened.Store(true)
			}
		}},
		Inline: func(m *message.Message) error {
			if string(m.Payload) == `"poison"` {
				poisonTries.Add(1)
				return errors.New("the ledger refuses this one, always")
			}
			return nil
		},
	})
	require.NoError(t, pub.Publish("orders", message.NewMessage(watermill.NewUUID(), []byte(`"poison"`))))
	for i := range 10 {
		m := message.NewMessage(watermill.NewUUID(), []byte(`"ok"`))
		m.Metadata.Set("n", string(rune('0'+i)))
		require.NoError(t, pub.Publish("orders", m))
	}
	testenv.Eventually(t, 30*time.Second, func() bool {
		return poisonTries.Load() > int64(middleware.DefaultFailureThreshold) && countRows(t, pool, in, "true") == 10
	}, "the poison message failed more often than the breaker's threshold while the others were stored")
	assert.False(t, opened.Load(), "one poison message must not open the breaker")
	assert.Equal(t, middleware.BreakerClosed, g.Breaker().State())
}
