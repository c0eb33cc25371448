package processors_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/internal/testenv"
	"github.com/omnibus-go/omnibus/middleware"
	"github.com/omnibus-go/omnibus/processors"
	"github.com/omnibus-go/omnibus/transports/postgres"
)

// target is a scripted publisher: fail decides, per attempt, what publishing
// returns; it records every attempt and every successful delivery.
type target struct {
	mu        sync.Mutex
	fail      func(payload string, attempt int) error
	tries     map[string]int
	attempts  []string
	delivered []*message.Message
}

func newTarget(fail func(payload string, attempt int) error) *target {
	return &target{fail: fail, tries: map[string]int{}}
}

func (p *target) Publish(_ string, msgs ...*message.Message) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, m := range msgs {
		pl := string(m.Payload)
		p.tries[pl]++
		p.attempts = append(p.attempts, pl)
		if p.fail != nil {
			if err := p.fail(pl, p.tries[pl]); err != nil {
				return err
			}
		}
		p.delivered = append(p.delivered, m)
	}
	return nil
}

func (p *target) Close() error { return nil }

func (p *target) snapshot() (attempts []string, delivered []*message.Message) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.attempts...), append([]*message.Message(nil), p.delivered...)
}

func newTable(t *testing.T) (*pgxpool.Pool, *postgres.Outbox) {
	t.Helper()
	pool := testenv.Postgres(t)
	name := testenv.Name(t)
	require.NoError(t, postgres.Migrate(context.Background(), pool, postgres.OutboxTable(name)))
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), fmt.Sprintf(`DROP TABLE IF EXISTS %q, %q CASCADE`, name, name+"_lanes"))
	})
	ob, err := postgres.NewOutbox(postgres.OutboxConfig{Table: name})
	require.NoError(t, err)
	return pool, ob
}

func keyed(key, payload string) *message.Message {
	m := message.NewMessage(watermill.NewUUID(), []byte(payload))
	bus.SetPartitionKey(m, key)
	return m
}

func startRelay(t *testing.T, pool *pgxpool.Pool, cfg processors.OutboxRelayConfig) *processors.OutboxRelay {
	t.Helper()
	relay, err := processors.NewOutboxRelay(pool, cfg, nil)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- relay.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		assert.NoError(t, <-done)
	})
	return relay
}

// waitForCompleted waits until n rows of table are completed: a delivery's
// ack is written a moment after the publisher saw it.
func waitForCompleted(t *testing.T, pool *pgxpool.Pool, table string, n int) {
	t.Helper()
	testenv.Eventually(t, 10*time.Second, func() bool {
		var done int
		require.NoError(t, pool.QueryRow(context.Background(),
			`SELECT count(*) FROM `+pgx.Identifier{table}.Sanitize()+` WHERE status = 'completed'`).Scan(&done))
		return done >= n
	}, "%d rows completed", n)
}

func payloadsOf(ms []*message.Message) []string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = string(m.Payload)
	}
	return out
}

func TestOutboxRelay_FailingHeadHoldsItsKeyAndOrderIsKept(t *testing.T) {
	t.Parallel()
	for _, base := range []time.Duration{30 * time.Millisecond, middleware.NoDelay} {
		t.Run(fmt.Sprintf("base=%v", base), func(t *testing.T) {
			t.Parallel()
			pool, ob := newTable(t)
			tgt := newTarget(func(payload string, attempt int) error {
				if payload != "created" {
					return nil
				}
				switch attempt {
				case 1:
					return bus.Transient(errors.New("broker unavailable"))
				case 2:
					return errors.New("rejected")
				}
				return nil
			})
			require.NoError(t, ob.Enqueue(context.Background(), pool, "orders",
				keyed("order-1", "created"), keyed("order-1", "paid"), keyed("order-1", "cancelled")))
			startRelay(t, pool, processors.OutboxRelayConfig{
				Publisher:  tgt,
				Subscriber: postgres.SubscriberConfig{Table: ob.Table(), PollInterval: 20 * time.Millisecond},
				Retry:      middleware.RetryConfig{Base: base, TransientDelay: 30 * time.Millisecond},
			})
			testenv.Eventually(t, 20*time.Second, func() bool {
				_, d := tgt.snapshot()
				return len(d) >= 3
			}, "all three events delivered")
			attempts, delivered := tgt.snapshot()
			assert.Equal(t, []string{"created", "paid", "cancelled"}, payloadsOf(delivered))
			assert.Equal(t, []string{"created", "created", "created", "paid", "cancelled"}, attempts,
				"nothing of the key may be tried while its head waits")
			waitForCompleted(t, pool, ob.Table(), 3)
			var spent int
			require.NoError(t, pool.QueryRow(context.Background(),
				`SELECT attempts FROM `+pgx.Identifier{ob.Table()}.Sanitize()+` WHERE payload = 'created'`).Scan(&spent))
			assert.Equal(t, 1, spent, "the transient failure spent no attempt, the counted one spent one")
		})
	}
}

func TestOutboxRelay_BrokerOutageSpendsNoAttempts(t *testing.T) {
	t.Parallel()
	pool, ob := newTable(t)
	var (
		mu   sync.Mutex
		down = true
	)
	tgt := newTarget(func(string, int) error {
		mu.Lock()
		defer mu.Unlock()
		if down {
			// As a transport reports a connection-level error.
			return bus.Transient(fmt.Errorf("dial broker: %w", errors.New("connection refused")))
		}
		return nil
	})
	for i := 0; i < 5; i++ {
		require.NoError(t, ob.Enqueue(context.Background(), pool, "orders", keyed("k", strconv.Itoa(i))))
	}
	relay := startRelay(t, pool, processors.OutboxRelayConfig{
		Publisher:  tgt,
		Subscriber: postgres.SubscriberConfig{Table: ob.Table(), PollInterval: 20 * time.Millisecond},
		Retry:      middleware.RetryConfig{Base: middleware.NoDelay, TransientDelay: 20 * time.Millisecond},
		Breaker:    middleware.CircuitBreakerConfig{FailureThreshold: 1, OpenTimeout: 50 * time.Millisecond},
	})
	testenv.Eventually(t, 10*time.Second, func() bool { return relay.Breaker().State() != middleware.BreakerClosed }, "the breaker to open")
	testenv.Eventually(t, 10*time.Second, func() bool {
		a, _ := tgt.snapshot()
		return len(a) >= 4
	}, "several probes while the broker is down")
	mu.Lock()
	down = false
	mu.Unlock()
	testenv.Eventually(t, 20*time.Second, func() bool {
		_, d := tgt.snapshot()
		return len(d) >= 5
	}, "all five delivered after the outage")
	_, delivered := tgt.snapshot()
	assert.Equal(t, []string{"0", "1", "2", "3", "4"}, payloadsOf(delivered))
	waitForCompleted(t, pool, ob.Table(), 5)
	var spent int
	require.NoError(t, pool.QueryRow(context.Background(),
		`SELECT coalesce(sum(attempts), 0) FROM `+pgx.Identifier{ob.Table()}.Sanitize()).Scan(&spent))
	assert.Zero(t, spent, "an outage of the broker must not spend attempts")
}

// A poison head (a publish that fails with a plain error every time) spends
// exactly max_attempts tries and then fails, with the default breaker and
// attempt budget, and never makes the breaker hold the other keys back.
func TestOutboxRelay_PoisonHeadFailsAfterExactlyMaxAttempts(t *testing.T) {
	t.Parallel()
	pool, ob := newTable(t)
	ctx := context.Background()
	tgt := newTarget(func(payload string, _ int) error {
		if payload == "poison" {
			return errors.New("rejected: always")
		}
		return nil
	})
	var msgs []*message.Message
	msgs = append(msgs, keyed("p", "poison"), keyed("p", "after-poison"))
	for k := range 10 {
		for i := range 10 {
			msgs = append(msgs, keyed(fmt.Sprint("k", k), fmt.Sprint("k", k, "-", i)))
		}
	}
	require.NoError(t, ob.Enqueue(ctx, pool, "orders", msgs...))
	var opened sync.Map
	relay := startRelay(t, pool, processors.OutboxRelayConfig{
		Publisher:  tgt,
		Subscriber: postgres.SubscriberConfig{Table: ob.Table(), PollInterval: 20 * time.Millisecond},
		// The default budget (6 attempts) and breaker (5 failures); only the
		// backoff is short so the test does not wait minutes.
		Retry: middleware.RetryConfig{Base: 20 * time.Millisecond, Cap: 200 * time.Millisecond},
		Breaker: middleware.CircuitBreakerConfig{OnStateChange: func(_, to middleware.BreakerState) {
			opened.Store(to, true)
		}},
	})
	require.Equal(t, middleware.DefaultFailureThreshold, 5, "precondition: the default breaker")
	table := pgx.Identifier{ob.Table()}.Sanitize()
	testenv.Eventually(t, 30*time.Second, func() bool {
		var status string
		require.NoError(t, pool.QueryRow(ctx, `SELECT status FROM `+table+` WHERE payload = 'poison'`).Scan(&status))
		return status == "failed"
	}, "the poison row failed after its budget")
	testenv.Eventually(t, 30*time.Second, func() bool {
		_, d := tgt.snapshot()
		return len(d) == len(msgs)-1
	}, "every other row delivered")
	var spent, budget int
	require.NoError(t, pool.QueryRow(ctx, `SELECT attempts, max_attempts FROM `+table+` WHERE payload = 'poison'`).Scan(&spent, &budget))
	assert.Equal(t, postgres.DefaultMaxAttempts, budget, "precondition: the default budget")
	assert.Equal(t, budget, spent, "the attempts column equals the tries")
	tgt.mu.Lock()
	tries := tgt.tries["poison"]
	tgt.mu.Unlock()
	assert.Equal(t, budget, tries, "the poison row is tried exactly max_attempts times")
	_, wasOpen := opened.Load(middleware.BreakerOpen)
	assert.False(t, wasOpen, "one poison message must not open the breaker")
	assert.Equal(t, middleware.BreakerClosed, relay.Breaker().State())
}

// The stand test: many relays, concurrent writers, a flaky target; nothing
// lost, nothing duplicated, nothing out of order per key.
func TestOutboxRelay_StandTest(t *testing.T) {
	t.Parallel()
	pool, ob := newTable(t)
	const (
		keys   = 25
		events = 600
	)
	var rngMu sync.Mutex
	rng := rand.New(rand.NewPCG(1, 2))
	tgt := newTarget(func(string, int) error {
		rngMu.Lock()
		r := rng.Float64()
		rngMu.Unlock()
		switch {
		case r < 0.05:
			return errors.New("rejected")
		case r < 0.08:
			return bus.Transient(errors.New("timeout"))
		}
		return nil
	})
	shapes := []struct{ batch, run int }{{1, 1}, {5, 16}, {20, 1}, {20, 16}}
	for i, s := range shapes {
		startRelay(t, pool, processors.OutboxRelayConfig{
			Publisher: tgt,
			Subscriber: postgres.SubscriberConfig{
				Table: ob.Table(), BatchSize: s.batch, RunLength: s.run, PollInterval: 20 * time.Millisecond,
				WorkerID: fmt.Sprintf("relay-%d", i),
			},
			Retry:       middleware.RetryConfig{Base: 5 * time.Millisecond, Cap: 50 * time.Millisecond, TransientDelay: 5 * time.Millisecond},
			Breaker:     middleware.CircuitBreakerConfig{OpenTimeout: 20 * time.Millisecond},
			HandlerName: fmt.Sprintf("relay-%d", i),
		})
	}

	// Two writers; writes to one key are serialized, as an aggregate's are.
	var (
		keyMu [keys]sync.Mutex
		seq   [keys]int
		next  = make(chan int, events)
		wg    sync.WaitGroup
	)
	for i := 0; i < events; i++ {
		next <- i
	}
	close(next)
	for w := 0; w < 2; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				k := i % keys
				keyMu[k].Lock()
				s := seq[k]
				seq[k]++
				err := pgx.BeginFunc(context.Background(), pool, func(tx pgx.Tx) error {
					return ob.Enqueue(context.Background(), tx, "orders", keyed(fmt.Sprintf("key-%d", k), fmt.Sprintf("key-%d/%d", k, s)))
				})
				keyMu[k].Unlock()
				assert.NoError(t, err)
			}
		}()
	}
	wg.Wait()

	testenv.Eventually(t, 90*time.Second, func() bool {
		_, d := tgt.snapshot()
		return len(d) >= events
	}, "all events delivered")
	_, delivered := tgt.snapshot()
	seen := map[string]bool{}
	last := map[string]int{}
	var dups, disorder int
	for _, m := range delivered {
		p := string(m.Payload)
		if seen[p] {
			dups++
		}
		seen[p] = true
		key, n, _ := strings.Cut(p, "/")
		s, _ := strconv.Atoi(n)
		if prev, ok := last[key]; (ok && s != prev+1) || (!ok && s != 0) {
			disorder++
			t.Errorf("key %s: %d delivered after %d", key, s, prev)
		}
		last[key] = s
	}
	assert.Zero(t, dups, "duplicates")
	assert.Zero(t, disorder, "keys out of order")
	assert.Len(t, seen, events, "events lost")
}

func TestOutboxRelay_ShutdownLetsInFlightPublishFinish(t *testing.T) {
	t.Parallel()
	pool, ob := newTable(t)
	started, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	tgt := newTarget(func(string, int) error {
		once.Do(func() { close(started) })
		<-release
		return nil
	})
	require.NoError(t, ob.Enqueue(context.Background(), pool, "orders", keyed("k", "slow")))
	relay, err := processors.NewOutboxRelay(pool, processors.OutboxRelayConfig{
		Publisher:  tgt,
		Subscriber: postgres.SubscriberConfig{Table: ob.Table(), CloseTimeout: 10 * time.Second},
	}, nil)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- relay.Run(ctx) }()
	<-started
	cancel() // shutdown begins while the publish is in flight
	time.AfterFunc(200*time.Millisecond, func() { close(release) })
	require.NoError(t, <-done)
	_, delivered := tgt.snapshot()
	assert.Len(t, delivered, 1)
	var status string
	require.NoError(t, pool.QueryRow(context.Background(),
		`SELECT status FROM `+pgx.Identifier{ob.Table()}.Sanitize()).Scan(&status))
	assert.Equal(t, "completed", status, "the in-flight publish finished and its row was completed during shutdown")
}

func TestOutboxRelay_DeadLetterTakesRowsGivenUpOnAndCompletesThem(t *testing.T) {
	t.Parallel()
	pool, ob := newTable(t)
	ctx := context.Background()
	tgt := newTarget(func(payload string, _ int) error {
		if payload == "poison" {
			return bus.Permanent(errors.New("the broker rejects this record"))
		}
		return nil
	})
	dlq := newTarget(nil)
	down := true
	var downMu sync.Mutex
	dlqPub := publisherFunc(func(topic string, msgs ...*message.Message) error {
		downMu.Lock()
		defer downMu.Unlock()
		if down {
			return errors.New("dead-letter topic unavailable")
		}
		return dlq.Publish(topic, msgs...)
	})
	dl, err := middleware.NewDeadLetter(middleware.DeadLetterConfig{Publisher: dlqPub, Topic: "orders.dlq", RetryDelay: 50 * time.Millisecond}, nil)
	require.NoError(t, err)
	reg := prometheus.NewRegistry()
	metrics, err := middleware.NewMetrics(reg, middleware.MetricsConfig{})
	require.NoError(t, err)
	require.NoError(t, ob.Enqueue(ctx, pool, "orders", keyed("k", "poison"), keyed("k", "after")))
	startRelay(t, pool, processors.OutboxRelayConfig{
		Publisher:   tgt,
		Subscriber:  postgres.SubscriberConfig{Table: ob.Table(), PollInterval: 20 * time.Millisecond},
		DeadLetter:  dl,
		Metrics:     metrics,
		HandlerName: "relay",
	})
	table := pgx.Identifier{ob.Table()}.Sanitize()
	rowOf := func(payload string) (status string, attempts int) {
		// A leased row's attempts include the delivery under way.
		require.NoError(t, pool.QueryRow(ctx, `SELECT status, attempts - (locked_by IS NOT NULL)::int FROM `+table+` WHERE payload = $1`, []byte(payload)).Scan(&status, &attempts))
		return status, attempts
	}

	// While the dead-letter topic is down the poison row is kept, with no
	// attempt spent, and holds its key back.
	testenv.Eventually(t, 10*time.Second, func() bool {
		attempts, _ := tgt.snapshot()
		return len(attempts) >= 3
	}, "the poison row tried a few times")
	status, attempts := rowOf("poison")
	assert.Equal(t, "pending", status)
	assert.Zero(t, attempts, "no attempt spent while the dead letter cannot be published")
	_, delivered := tgt.snapshot()
	assert.Empty(t, delivered, "the row behind the poison one waits")

	downMu.Lock()
	down = false
	downMu.Unlock()
	testenv.Eventually(t, 10*time.Second, func() bool {
		_, d := tgt.snapshot()
		return len(d) == 1
	}, "the row behind it delivered")
	_, letters := dlq.snapshot()
	require.Len(t, letters, 1)
	assert.Equal(t, "poison", string(letters[0].Payload))
	assert.Equal(t, "permanent", letters[0].Metadata.Get(middleware.MetaDeadLetterClass))
	assert.Equal(t, "relay", letters[0].Metadata.Get(middleware.MetaDeadLetterHandler))
	assert.Contains(t, letters[0].Metadata.Get(middleware.MetaDeadLetterError), "the broker rejects this record")
	testenv.Eventually(t, 10*time.Second, func() bool {
		status, _ := rowOf("poison")
		return status == "completed"
	}, "the poison row completed")
	assert.Equal(t, 1.0, handledCount(t, reg, "relay", middleware.ResultDeadLettered), "counted as dead-lettered")
}

// handledCount reads omnibus_handler_messages_total for handler and result.
func handledCount(t *testing.T, reg prometheus.Gatherer, handler, result string) float64 {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	var sum float64
	for _, f := range families {
		if f.GetName() != "omnibus_handler_messages_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["handler"] == handler && labels["result"] == result {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

// publisherFunc adapts a function to message.Publisher.
type publisherFunc func(topic string, msgs ...*message.Message) error

func (f publisherFunc) Publish(topic string, msgs ...*message.Message) error {
	return f(topic, msgs...)
}
func (f publisherFunc) Close() error { return nil }

// The attempts column equals the failures the publisher counted, exactly,
// under faults: 8 relays, 1,500 events over 60 keys written by unserialized
// writers, 10 % ordinary errors, 5 % transient, 2 % panics and 3 % "stored
// but the ack was lost" publishes (the broker has the event, the relay sees
// an error: a counted failure, and a duplicate when it is tried again).
func TestOutboxRelay_StandAttemptsEqualCountedFailures(t *testing.T) {
	t.Parallel()
	pool, ob := newTable(t)
	const (
		relays = 8
		keys   = 60
		events = 1500
	)
	var (
		mu      sync.Mutex
		rng     = rand.New(rand.NewPCG(3, 4))
		counted = map[string]int{}   // failures that spend an attempt, by payload
		stored  = map[string]bool{}  // payloads the broker has
		firsts  = map[string][]int{} // first deliveries per key, in order
	)
	publish := publisherFunc(func(_ string, msgs ...*message.Message) error {
		for _, m := range msgs {
			p := string(m.Payload)
			mu.Lock()
			r := rng.Float64()
			store := func() {
				if !stored[p] {
					stored[p] = true
					key, n, _ := strings.Cut(p, "/")
					s, _ := strconv.Atoi(n)
					firsts[key] = append(firsts[key], s)
				}
			}
			switch {
			case r < 0.10:
				counted[p]++
				mu.Unlock()
				return errors.New("rejected")
			case r < 0.15:
				mu.Unlock()
				return bus.Transient(errors.New("broker unavailable"))
			case r < 0.17:
				counted[p]++
				mu.Unlock()
				panic("publisher panicked")
			case r < 0.20:
				store()
				counted[p]++
				mu.Unlock()
				return errors.New("ack lost")
			}
			store()
			mu.Unlock()
		}
		return nil
	})
	for i := range relays {
		startRelay(t, pool, processors.OutboxRelayConfig{
			Publisher: publish,
			Subscriber: postgres.SubscriberConfig{
				Table: ob.Table(), BatchSize: 10, RunLength: 4, PollInterval: 20 * time.Millisecond,
				WorkerID: fmt.Sprintf("relay-%d", i),
			},
			Retry: middleware.RetryConfig{Base: 5 * time.Millisecond, Cap: 50 * time.Millisecond, TransientDelay: 5 * time.Millisecond},
			// A breaker that opens often: failures it lets through stay counted.
			Breaker:     middleware.CircuitBreakerConfig{FailureThreshold: 2, OpenTimeout: 20 * time.Millisecond},
			HandlerName: fmt.Sprintf("relay-%d", i),
		})
	}

	// Four writers without any per-key mutex: the engine keeps each key's
	// order whatever the interleaving.
	var (
		seqMu sync.Mutex
		seq   [keys]int
		next  = make(chan int, events)
		wg    sync.WaitGroup
	)
	for i := range events {
		next <- i
	}
	close(next)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				k := i % keys
				err := pgx.BeginFunc(context.Background(), pool, func(tx pgx.Tx) error {
					// The sequence number is taken inside the transaction that
					// writes it, so ids and numbers agree per key.
					if _, err := tx.Exec(context.Background(), `SELECT pg_advisory_xact_lock($1)`, k); err != nil {
						return err
					}
					seqMu.Lock()
					s := seq[k]
					seq[k]++
					seqMu.Unlock()
					return ob.Enqueue(context.Background(), tx, "orders", keyed(fmt.Sprintf("key-%d", k), fmt.Sprintf("key-%d/%d", k, s)))
				})
				assert.NoError(t, err)
			}
		}()
	}
	wg.Wait()

	table := pgx.Identifier{ob.Table()}.Sanitize()
	testenv.Eventually(t, 120*time.Second, func() bool {
		var open int
		require.NoError(t, pool.QueryRow(context.Background(),
			`SELECT count(*) FROM `+table+` WHERE status = 'pending' OR locked_by IS NOT NULL`).Scan(&open))
		return open == 0
	}, "every row settled for good")
	rows, err := pool.Query(context.Background(), `SELECT convert_from(payload, 'UTF8'), attempts, status FROM `+table)
	require.NoError(t, err)
	var (
		differ, failed int
		total          int
	)
	mu.Lock()
	defer mu.Unlock()
	for rows.Next() {
		var (
			p, status string
			attempts  int
		)
		require.NoError(t, rows.Scan(&p, &attempts, &status))
		total++
		if status == "failed" {
			failed++
		}
		if attempts != counted[p] {
			differ++
			t.Errorf("%s (%s): attempts column %d, counted failures %d", p, status, attempts, counted[p])
		}
		if status == "completed" && !stored[p] {
			t.Errorf("%s completed but never stored", p)
		}
	}
	require.NoError(t, rows.Err())
	assert.Equal(t, events, total)
	assert.Zero(t, differ, "rows whose attempts column differs from the counted failures")
	for key, got := range firsts {
		for i := 1; i < len(got); i++ {
			if got[i] < got[i-1] {
				t.Errorf("key %s: %d first delivered after %d", key, got[i], got[i-1])
			}
		}
	}
	t.Logf("%d events, %d failed for good, %d counted failures", total, failed, sum(counted))
}

func sum(m map[string]int) (n int) {
	for _, v := range m {
		n += v
	}
	return n
}
