//go:build soak

package processors_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/internal/testenv"
	"github.com/omnibus-go/omnibus/middleware"
	"github.com/omnibus-go/omnibus/processors"
	"github.com/omnibus-go/omnibus/transports/postgres"
)

// soakDuration is how long writers write: OMNIBUS_SOAK_DURATION, default 3m.
func soakDuration(t *testing.T) time.Duration {
	s := os.Getenv("OMNIBUS_SOAK_DURATION")
	if s == "" {
		return 3 * time.Minute
	}
	d, err := time.ParseDuration(s)
	require.NoError(t, err, "OMNIBUS_SOAK_DURATION")
	return d
}

// namedPool opens a pool whose connections carry name as their
// application_name, so crashWhile can kill them.
func namedPool(t *testing.T, name string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(testenv.PostgresURL())
	require.NoError(t, err)
	cfg.MaxConns = 6
	cfg.ConnConfig.RuntimeParams["application_name"] = name
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	return pool
}

// crashWhile simulates a crash of the processor whose connections are
// named name: it kills them every 20 ms, from 300 ms before stopping the
// processor (cancel) until the processor's Run has returned (done), so the
// processor can neither settle nor commit what it was doing. It returns
// what Run returned.
func crashWhile(admin *pgxpool.Pool, name string, cancel context.CancelFunc, done <-chan error) error {
	killing := make(chan struct{})
	killed := make(chan struct{})
	go func() {
		defer close(killed)
		for {
			_, _ = admin.Exec(context.Background(),
				`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1`, name)
			select {
			case <-killing:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	time.Sleep(300 * time.Millisecond)
	cancel()
	err := <-done
	close(killing)
	<-killed
	return err
}

// soakProc is one running processor of a soak (a relay, an ingest or a
// dispatcher) with a pool of its own, named so its connections can be
// killed.
type soakProc struct {
	name   string
	pool   *pgxpool.Pool
	close  func() // closes what the processor does not (its broker subscriber); may be nil
	cancel context.CancelFunc
	done   chan error
}

// stop stops p gracefully, or crashes it (crashWhile), and closes its pool.
func (p *soakProc) stop(t *testing.T, admin *pgxpool.Pool, crash bool) {
	t.Helper()
	if crash {
		err := crashWhile(admin, p.name, p.cancel, p.done)
		t.Logf("crashed %s (Run returned %v)", p.name, err)
	} else {
		p.cancel()
		assert.NoError(t, <-p.done, "graceful stop of %s", p.name)
	}
	if p.close != nil {
		p.close()
	}
	p.pool.Close()
}

// TestSoak_RelaysRestartAndCrashWhileWritersWrite runs writers for
// soakDuration against three relays of mixed shapes publishing to a target
// that fails 5 % of publishes (counted) and 3 % (transient). Every few
// seconds one relay is stopped gracefully and replaced; every few seconds
// another crashes: its database connections are killed while it runs and
// while it shuts down, so it cannot settle what it delivered, and its rows
// come back to the others when their leases expire.
//
// At the end every written event was delivered; per key, the first
// deliveries are in write order; repeats happen only after crashes (at
// least once), never after graceful restarts alone; no row is left pending
// or failed and no lane is left behind.
func TestSoak_RelaysRestartAndCrashWhileWritersWrite(t *testing.T) {
	duration := soakDuration(t)
	admin, ob := newTable(t)
	ctx := context.Background()
	const keys = 50

	var rngMu sync.Mutex
	rng := rand.New(rand.NewPCG(7, 11))
	chance := func() float64 {
		rngMu.Lock()
		defer rngMu.Unlock()
		return rng.Float64()
	}
	tgt := newTarget(func(string, int) error {
		switch r := chance(); {
		case r < 0.05:
			return errors.New("rejected")
		case r < 0.08:
			return bus.Transient(errors.New("timeout"))
		}
		return nil
	})

	shapes := []struct{ batch, run int }{{1, 1}, {20, 16}, {100, 4}}
	var started atomic.Int64
	start := func(shape int) *soakProc {
		n := started.Add(1)
		name := fmt.Sprintf("soak-%s-%d", ob.Table()[len(ob.Table())-6:], n)
		pool := namedPool(t, name)
		s := shapes[shape%len(shapes)]
		relay, err := processors.NewOutboxRelay(pool, processors.OutboxRelayConfig{
			Publisher: tgt,
			Subscriber: postgres.SubscriberConfig{
				Table: ob.Table(), BatchSize: s.batch, RunLength: s.run, WorkerID: name,
				PollInterval: 50 * time.Millisecond, Lease: 2 * time.Second, CloseTimeout: time.Second,
			},
			Retry:       middleware.RetryConfig{Base: 5 * time.Millisecond, Cap: 50 * time.Millisecond, TransientDelay: 5 * time.Millisecond},
			Breaker:     middleware.CircuitBreakerConfig{OpenTimeout: 20 * time.Millisecond},
			HandlerName: name,
		}, nil)
		require.NoError(t, err)
		rctx, cancel := context.WithCancel(context.Background())
		r := &soakProc{name: name, pool: pool, cancel: cancel, done: make(chan error, 1)}
		go func() { r.done <- relay.Run(rctx) }()
		return r
	}
	relays := []*soakProc{start(0), start(1), start(2)}

	// Writers: per-key serialized, as an aggregate's writes are.
	var (
		keyMu   [keys]sync.Mutex
		seq     [keys]int
		written atomic.Int64
		wg      sync.WaitGroup
	)
	writeUntil := time.Now().Add(duration)
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(writeUntil) {
				k := int(chance() * keys)
				keyMu[k].Lock()
				s := seq[k]
				err := pgx.BeginFunc(ctx, admin, func(tx pgx.Tx) error {
					return ob.Enqueue(ctx, tx, "orders", keyed(fmt.Sprintf("key-%d", k), fmt.Sprintf("key-%d/%d", k, s)))
				})
				if err == nil {
					seq[k]++
					written.Add(1)
				}
				keyMu[k].Unlock()
				if !assert.NoError(t, err) {
					return
				}
				time.Sleep(time.Duration(chance() * float64(4*time.Millisecond)))
			}
		}()
	}

	// Chaos: alternately restart one relay gracefully and crash another.
	var restarts, crashes int
	for i := 0; time.Now().Before(writeUntil); i++ {
		time.Sleep(3 * time.Second)
		j := i % len(relays)
		if i%2 == 0 {
			relays[j].stop(t, admin, false)
			restarts++
		} else {
			relays[j].stop(t, admin, true)
			crashes++
		}
		relays[j] = start(j)
	}
	wg.Wait()
	total := int(written.Load())

	table := pgx.Identifier{ob.Table()}.Sanitize()
	lanes := pgx.Identifier{ob.Table() + "_lanes"}.Sanitize()
	testenv.Eventually(t, 3*time.Minute, func() bool {
		var n int
		require.NoError(t, admin.QueryRow(ctx, `SELECT count(*) FROM `+table+` WHERE status = 'completed'`).Scan(&n))
		return n == total
	}, "every written row completed")
	testenv.Eventually(t, 30*time.Second, func() bool {
		var n int
		require.NoError(t, admin.QueryRow(ctx, `SELECT count(*) FROM `+lanes).Scan(&n))
		return n == 0
	}, "every lane released")
	for _, r := range relays {
		r.stop(t, admin, false)
	}

	attempts, delivered := tgt.snapshot()
	seen := map[string]int{}
	next := map[string]int{} // per key, the next sequence number not yet delivered
	var repeats int
	for _, m := range delivered {
		p := string(m.Payload)
		seen[p]++
		key, n, _ := strings.Cut(p, "/")
		s, err := strconv.Atoi(n)
		require.NoError(t, err)
		switch {
		case s == next[key]:
			next[key]++
		case s < next[key]:
			repeats++ // a redelivery of a row whose settlement a crash lost
		default:
			t.Errorf("key %s: %d delivered before %d", key, s, next[key])
		}
	}
	assert.Len(t, seen, total, "every written event delivered")
	var failed int
	require.NoError(t, admin.QueryRow(ctx, `SELECT count(*) FROM `+table+` WHERE status <> 'completed'`).Scan(&failed))
	assert.Zero(t, failed, "rows left pending or failed")
	if crashes == 0 {
		assert.Zero(t, repeats, "repeats without a crash")
	}
	t.Logf("%s: %d events over %d keys, %d publish attempts, %d delivered (%d repeats after %d crashes), %d graceful restarts",
		duration, total, keys, len(attempts), len(delivered), repeats, crashes, restarts)
}

// TestSoak_InboxReceivesAndDispatchesExactlyOnceThroughCrashes sends keyed
// messages to Kafka (kfake) for soakDuration, every tenth one twice (a
// sender's redelivery), while an InboxIngest stores them and a
// transactional Dispatcher writes one effect row per message in the
// transaction that completes its inbox row. Every few seconds the ingest or
// the dispatcher is restarted gracefully or crashed (its database
// connections killed while it runs and shuts down).
//
// At the end every distinct message has exactly one effect, and per key the
// effects were written in send order.
func TestSoak_InboxReceivesAndDispatchesExactlyOnceThroughCrashes(t *testing.T) {
	duration := soakDuration(t)
	admin, in := newInboxTable(t)
	fx := newEffects(t, admin)
	ctx := context.Background()
	// Effects are numbered as they are written, to check the order per key.
	_, err := admin.Exec(ctx, `ALTER TABLE `+pgx.Identifier{fx.name}.Sanitize()+` ADD COLUMN n bigserial`)
	require.NoError(t, err)
	const keys = 30
	broker := newKafkaBroker(t)
	topic := testenv.KafkaTopic(t, broker.brokers, 4)
	group := "soak_" + testenv.Name(t)
	suffix := in.Table()[len(in.Table())-6:]
	var started atomic.Int64

	startIngestProc := func() *soakProc {
		name := fmt.Sprintf("soak-ingest-%s-%d", suffix, started.Add(1))
		pool := namedPool(t, name)
		sub := broker.subscriber(group)
		g, err := processors.NewInboxIngest(pool, processors.InboxIngestConfig{
			Subscriber: sub, Topic: topic, ConsumerGroup: "billing",
			Inbox: postgres.InboxConfig{Table: in.Table()}, Retry: fastRetry, HandlerName: name,
		}, nil)
		require.NoError(t, err)
		rctx, cancel := context.WithCancel(context.Background())
		p := &soakProc{name: name, pool: pool, cancel: cancel, done: make(chan error, 1),
			close: func() { _ = g.Close(); _ = sub.Close() }}
		go func() { p.done <- g.Run(rctx) }()
		return p
	}
	startDispatcherProc := func() *soakProc {
		name := fmt.Sprintf("soak-dispatch-%s-%d", suffix, started.Add(1))
		pool := namedPool(t, name)
		d, err := processors.NewDispatcher(pool, processors.DispatcherConfig{
			Subscriber: postgres.SubscriberConfig{
				Table: in.Table(), ConsumerGroup: "billing", WorkerID: name,
				PollInterval: 50 * time.Millisecond, Lease: 2 * time.Second, CloseTimeout: time.Second,
			},
			Transactional: true,
			Retry:         fastRetry,
			HandlerName:   name,
		}, nil)
		require.NoError(t, err)
		processors.Handle(d, "order.step", func(ctx context.Context, ev soakEvent, m *message.Message) error {
			tx, ok := postgres.TxFromContext(ctx)
			if !ok {
				return errors.New("no transaction")
			}
			return fx.write(ctx, pgxEffectsDB{tx}, bus.EventID(m), fmt.Sprintf("%s/%d", ev.Key, ev.Seq))
		})
		rctx, cancel := context.WithCancel(context.Background())
		p := &soakProc{name: name, pool: pool, cancel: cancel, done: make(chan error, 1)}
		go func() { p.done <- d.Run(rctx) }()
		return p
	}
	ingest, dispatch := startIngestProc(), startDispatcherProc()

	// The sender: per key in sequence; every tenth message sent twice.
	pub := broker.publisher()
	var sent atomic.Int64
	sendUntil := time.Now().Add(duration)
	sendDone := make(chan struct{})
	go func() {
		defer close(sendDone)
		var seq [keys]int
		for i := 0; time.Now().Before(sendUntil); i++ {
			k := i % keys
			body := fmt.Sprintf(`{"key":"key-%d","seq":%d}`, k, seq[k])
			seq[k]++
			msg := message.NewMessage(watermill.NewUUID(), []byte(body))
			bus.SetPartitionKey(msg, fmt.Sprintf("key-%d", k))
			bus.SetEventType(msg, "order.step")
			copies := 1
			if i%10 == 0 {
				copies = 2
			}
			for range copies {
				if !assert.NoError(t, pub.Publish(topic, msg.Copy())) {
					return
				}
			}
			sent.Add(1)
			time.Sleep(2 * time.Millisecond)
		}
	}()

	var restarts, crashes int
	for i := 0; time.Now().Before(sendUntil); i++ {
		time.Sleep(4 * time.Second)
		crash := i%2 == 1
		if i%4 < 2 {
			ingest.stop(t, admin, crash)
			ingest = startIngestProc()
		} else {
			dispatch.stop(t, admin, crash)
			dispatch = startDispatcherProc()
		}
		if crash {
			crashes++
		} else {
			restarts++
		}
	}
	<-sendDone
	total := int(sent.Load())

	effects := pgx.Identifier{fx.name}.Sanitize()
	testenv.Eventually(t, 3*time.Minute, func() bool {
		var n int
		require.NoError(t, admin.QueryRow(ctx, `SELECT count(DISTINCT event_id) FROM `+effects).Scan(&n))
		return n >= total
	}, "an effect for every message")
	ingest.stop(t, admin, false)
	dispatch.stop(t, admin, false)

	var dupEffects int
	require.NoError(t, admin.QueryRow(ctx, `SELECT count(*) - count(DISTINCT event_id) FROM `+effects).Scan(&dupEffects))
	assert.Zero(t, dupEffects, "messages with more than one effect")
	rows, err := admin.Query(ctx, `SELECT note FROM `+effects+` ORDER BY n`)
	require.NoError(t, err)
	next := map[string]int{}
	for rows.Next() {
		var note string
		require.NoError(t, rows.Scan(&note))
		key, n, _ := strings.Cut(note, "/")
		s, err := strconv.Atoi(n)
		require.NoError(t, err)
		if s != next[key] {
			t.Errorf("key %s: effect of %d written when %d was next", key, s, next[key])
		}
		next[key] = s + 1
	}
	require.NoError(t, rows.Err())
	var stored int
	require.NoError(t, admin.QueryRow(ctx, `SELECT count(*) FROM `+pgx.Identifier{in.Table()}.Sanitize()+` WHERE status = 'completed'`).Scan(&stored))
	assert.Equal(t, total, stored, "each message stored once and completed")
	t.Logf("%s: %d messages (%d sent twice) over %d keys, %d effects, %d graceful restarts, %d crashes",
		duration, total, (total+9)/10, keys, total+dupEffects, restarts, crashes)
}

type soakEvent struct {
	Key string `json:"key"`
	Seq int    `json:"seq"`
}
