package postgresbench

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/omnibus-go/omnibus/bench/internal/pgbench"
	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/transports/postgres"
)

// Shape of BenchmarkHotKeyWriters.
const (
	hotWriters     = 8
	writersFor     = 5 * time.Second
	writerThink    = 2 * time.Millisecond
	writersTimeout = time.Minute
)

// keyCounter is a Publisher that counts published events per partition key.
type keyCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *keyCounter) Publish(_ string, msgs ...*message.Message) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, m := range msgs {
		c.n[bus.PartitionKey(m)]++
	}
	return nil
}

func (c *keyCounter) Close() error { return nil }

func (c *keyCounter) count(key string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[key]
}

// BenchmarkHotKeyWriters runs, for writersFor, 8 writers that commit
// overlapping transactions on one hot key without pause (each inserts one
// event, thinks 2 ms inside its transaction, commits), next to one writer of
// an uncontended key doing the same, while the relay (default configuration)
// delivers. The hot key's lane is almost never free of writers, so the relay
// delivers it only by waiting its turn (docs/ordering.md, Hot keys).
//
// Metrics: hot-written-evt/s and hot-delivered-evt/s (during the writing),
// calm-written-evt/s and calm-delivered-evt/s, drain-ms (after the writers
// stop, until every event is delivered), and the writers' p99 commit
// latency on the hot key (hot-commit-p99-ms), which includes waiting behind a
// relay's turn.
func BenchmarkHotKeyWriters(b *testing.B) {
	var m [6]float64
	for range b.N {
		b.StopTimer()
		pool, t, ob := writerTable(b, "hotwriters")
		sink := &keyCounter{n: map[string]int{}}
		b.StartTimer()
		r := startRelay(b, pool, t, postgres.SubscriberConfig{}, sink)
		ctx, cancel := context.WithTimeout(context.Background(), writersFor)
		var (
			wg          sync.WaitGroup
			hotN, calmN atomic.Int64
			latMu       sync.Mutex
			lat         []time.Duration
		)
		write := func(key string, n *atomic.Int64, record bool) {
			defer wg.Done()
			for ctx.Err() == nil {
				start := time.Now()
				err := pgx.BeginFunc(context.Background(), pool, func(tx pgx.Tx) error {
					msg := message.NewMessage(watermill.NewUUID(), []byte("{}"))
					bus.SetPartitionKey(msg, key)
					if err := ob.Enqueue(context.Background(), tx, benchTopic, msg); err != nil {
						return err
					}
					time.Sleep(writerThink)
					return nil
				})
				if err != nil {
					b.Errorf("writer of %s: %v", key, err)
					return
				}
				n.Add(1)
				if record {
					latMu.Lock()
					lat = append(lat, time.Since(start))
					latMu.Unlock()
				}
			}
		}
		start := time.Now()
		for range hotWriters {
			wg.Add(1)
			go write("hot", &hotN, true)
		}
		wg.Add(1)
		go write("calm", &calmN, false)
		wg.Wait()
		cancel()
		wrote := time.Since(start)
		hotDelivered, calmDelivered := sink.count("hot"), sink.count("calm")
		drainStart := time.Now()
		deadline := drainStart.Add(writersTimeout)
		for sink.count("hot") < int(hotN.Load()) || sink.count("calm") < int(calmN.Load()) {
			if time.Now().After(deadline) {
				b.Fatalf("not drained after %s: hot %d/%d, calm %d/%d", writersTimeout,
					sink.count("hot"), hotN.Load(), sink.count("calm"), calmN.Load())
			}
			time.Sleep(5 * time.Millisecond)
		}
		drain := time.Since(drainStart)
		b.StopTimer()
		r.stop(b)
		p99 := percentile(lat, 99)
		vals := [6]float64{
			float64(hotN.Load()) / wrote.Seconds(), float64(hotDelivered) / wrote.Seconds(),
			float64(calmN.Load()) / wrote.Seconds(), float64(calmDelivered) / wrote.Seconds(),
			ms(drain), ms(p99),
		}
		for i := range m {
			m[i] += vals[i]
		}
		b.Logf("%s of writing: hot key %d written (%.0f/s), %d delivered meanwhile (%.0f/s); calm key %d written (%.0f/s), %d delivered (%.0f/s); rest drained in %s; hot commit p99 %.1f ms; %s",
			wrote.Round(time.Millisecond), hotN.Load(), vals[0], hotDelivered, vals[1], calmN.Load(), vals[2], calmDelivered, vals[3],
			drain.Round(time.Millisecond), vals[5], pgbench.LoadAvg(3))
	}
	n := float64(b.N)
	for i, name := range []string{"hot-written-evt/s", "hot-delivered-evt/s", "calm-written-evt/s", "calm-delivered-evt/s", "drain-ms", "hot-commit-p99-ms"} {
		b.ReportMetric(m[i]/n, name)
	}
}

// writerTable is a fresh outbox table for a writers' benchmark, with its pool
// and its Outbox.
func writerTable(b *testing.B, scenario string) (*pgxpool.Pool, pgbench.Table, *postgres.Outbox) {
	b.Helper()
	pool := pgbench.NewPool(b, 20, nil)
	t := pgbench.NewTable(b, pool, postgres.KindOutbox, scenario)
	ob, err := postgres.NewOutbox(postgres.OutboxConfig{Table: t.Name})
	if err != nil {
		b.Fatal(err)
	}
	return pool, t, ob
}

// Shape of BenchmarkMultiKeyWriters.
const (
	multiWriters  = 8
	multiKeySpace = 50
	multiNewKeys  = 100_000
)

// BenchmarkMultiKeyWriters runs, for writersFor, 8 writers whose business
// transactions each enqueue 2–5 events of random keys (half of them from a
// space of 50 keys, half from 100,000, so mostly new) in random order, one
// Enqueue call each, and
// commit, while the relay (default configuration) delivers. This is the
// writer side of issue 25: omnibus must add no deadlock to such
// transactions, and cost them little.
//
// Metrics: tx/s and written-evt/s (committed), commit-p50-ms and
// commit-p99-ms (begin to commit), deadlocks (transactions PostgreSQL
// aborted as deadlock victims; must be 0), drain-ms (after the writers stop,
// until every event is delivered).
func BenchmarkMultiKeyWriters(b *testing.B) {
	var m [6]float64
	for range b.N {
		b.StopTimer()
		pool, t, ob := writerTable(b, "multikey")
		sink := pgbench.NewSink(0)
		b.StartTimer()
		r := startRelay(b, pool, t, postgres.SubscriberConfig{}, sink)
		ctx, cancel := context.WithTimeout(context.Background(), writersFor)
		var (
			wg              sync.WaitGroup
			txs, evts, dead atomic.Int64
			latMu           sync.Mutex
			lat             []time.Duration
		)
		start := time.Now()
		for w := range multiWriters {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rnd := rand.New(rand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
				for ctx.Err() == nil {
					n := 2 + rnd.IntN(4)
					began := time.Now()
					err := pgx.BeginFunc(context.Background(), pool, func(tx pgx.Tx) error {
						for range n {
							key := fmt.Sprintf("k%d", rnd.IntN(multiKeySpace))
							if rnd.IntN(2) == 0 {
								key = fmt.Sprintf("new%d", rnd.IntN(multiNewKeys))
							}
							msg := message.NewMessage(watermill.NewUUID(), []byte("{}"))
							bus.SetPartitionKey(msg, key)
							if err := ob.Enqueue(context.Background(), tx, benchTopic, msg); err != nil {
								return err
							}
						}
						return nil
					})
					var pgErr *pgconn.PgError
					if errors.As(err, &pgErr) && pgErr.Code == "40P01" {
						dead.Add(1)
						continue
					}
					if err != nil {
						b.Errorf("writer: %v", err)
						return
					}
					txs.Add(1)
					evts.Add(int64(n))
					latMu.Lock()
					lat = append(lat, time.Since(began))
					latMu.Unlock()
				}
			}()
		}
		wg.Wait()
		cancel()
		wrote := time.Since(start)
		drainStart := time.Now()
		deadline := drainStart.Add(writersTimeout)
		for sink.Hits() < evts.Load() {
			if time.Now().After(deadline) {
				b.Fatalf("not drained after %s: %d/%d", writersTimeout, sink.Hits(), evts.Load())
			}
			time.Sleep(5 * time.Millisecond)
		}
		drain := time.Since(drainStart)
		b.StopTimer()
		r.stop(b)
		vals := [6]float64{
			float64(txs.Load()) / wrote.Seconds(), float64(evts.Load()) / wrote.Seconds(),
			ms(percentile(lat, 50)), ms(percentile(lat, 99)), float64(dead.Load()), ms(drain),
		}
		for i := range m {
			m[i] += vals[i]
		}
		b.Logf("%s of writing: %d transactions (%.0f/s), %d events (%.0f/s), commit p50 %.1f ms p99 %.1f ms, %d deadlocks; drained in %s; %s",
			wrote.Round(time.Millisecond), txs.Load(), vals[0], evts.Load(), vals[1], vals[2], vals[3], dead.Load(),
			drain.Round(time.Millisecond), pgbench.LoadAvg(3))
	}
	n := float64(b.N)
	for i, name := range []string{"tx/s", "written-evt/s", "commit-p50-ms", "commit-p99-ms", "deadlocks", "drain-ms"} {
		b.ReportMetric(m[i]/n, name)
	}
}
