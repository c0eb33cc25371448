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

// soakRelay is one relay of the soak with a pool of its own, named so its
// connections can be killed.
type soakRelay struct {
	name   string
	pool   *pgxpool.Pool
	cancel context.CancelFunc
	done   chan error
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
	start := func(shape int) *soakRelay {
		n := started.Add(1)
		name := fmt.Sprintf("soak-%s-%d", ob.Table()[len(ob.Table())-6:], n)
		cfg, err := pgxpool.ParseConfig(testenv.PostgresURL())
		require.NoError(t, err)
		cfg.MaxConns = 6
		cfg.ConnConfig.RuntimeParams["application_name"] = name
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		require.NoError(t, err)
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
		r := &soakRelay{name: name, pool: pool, cancel: cancel, done: make(chan error, 1)}
		go func() { r.done <- relay.Run(rctx) }()
		return r
	}
	stop := func(r *soakRelay) {
		r.cancel()
		require.NoError(t, <-r.done, "graceful stop of %s", r.name)
		r.pool.Close()
	}
	// crash kills the relay's connections while it runs and until it has
	// given up settling at shutdown.
	crash := func(r *soakRelay) {
		killing := make(chan struct{})
		killed := make(chan struct{})
		go func() {
			defer close(killed)
			for {
				_, _ = admin.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1`, r.name)
				select {
				case <-killing:
					return
				case <-time.After(20 * time.Millisecond):
				}
			}
		}()
		time.Sleep(300 * time.Millisecond)
		r.cancel()
		err := <-r.done
		close(killing)
		<-killed
		t.Logf("crashed %s (Run returned %v)", r.name, err)
		r.pool.Close()
	}

	relays := []*soakRelay{start(0), start(1), start(2)}

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
			stop(relays[j])
			restarts++
		} else {
			crash(relays[j])
			crashes++
		}
		relays[j] = start(j)
	}
	wg.Wait()
	total := int(written.Load())

	table := pgx.Identifier{ob.Table()}.Sanitize()
	lanes := pgx.Identifier{ob.Table() + "_lanes"}.Sanitize()
	waitFor(t, "every written row completed", 3*time.Minute, func() bool {
		var n int
		require.NoError(t, admin.QueryRow(ctx, `SELECT count(*) FROM `+table+` WHERE status = 'completed'`).Scan(&n))
		return n == total
	})
	waitFor(t, "every lane released", 30*time.Second, func() bool {
		var n int
		require.NoError(t, admin.QueryRow(ctx, `SELECT count(*) FROM `+lanes).Scan(&n))
		return n == 0
	})
	for _, r := range relays {
		stop(r)
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
