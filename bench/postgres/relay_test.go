package postgresbench

import (
	"context"
	"encoding/json"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/omnibus-go/omnibus/bench/internal/pgbench"
	"github.com/omnibus-go/omnibus/bench/internal/rounds"
	"github.com/omnibus-go/omnibus/transports/postgres"
)

// Sizes of BenchmarkRelayDrain.
const (
	drainRows  = 100_000
	drainKeys  = 10_000
	drainBatch = postgres.DefaultBatchSize
)

// BenchmarkRelayDrain drains 100k rows over 10k keys into an in-memory sink,
// once with the omnibus OutboxRelay (default configuration: BatchSize 100,
// RunLength 16) and once with a raw-SQL floor: one connection looping
// "lock the next 100 pending rows FOR UPDATE SKIP LOCKED, publish them,
// mark them completed, commit", no ordering check. Each runs on its own
// table seeded with the same rows.
//
// Metrics: relay-evt/s, floor-evt/s and relay/floor-% (issue 26: ≥ 100 %),
// and the Go side's allocations per event (relay-allocs/evt, relay-alloc-B/evt):
// each the median of rounds.N rounds per iteration.
func BenchmarkRelayDrain(b *testing.B) {
	var m rounds.Medians
	for range b.N * rounds.N {
		b.StopTimer()
		tr := &tracer{}
		pool := pgbench.NewPool(b, 20, tr)
		relayT := pgbench.NewTable(b, pool, postgres.KindOutbox, "drain_relay")
		floorT := pgbench.NewTable(b, pool, postgres.KindOutbox, "drain_floor")
		for _, t := range []pgbench.Table{relayT, floorT} {
			seed(b, pool, t, rows{n: drainRows, keys: drainKeys, prefix: "key-"})
		}
		// The index a plain SKIP LOCKED queue would have: pending rows in id order.
		if _, err := pool.Exec(context.Background(),
			`CREATE INDEX ON `+floorT.Quoted+` (id) WHERE status = 'pending'`); err != nil {
			b.Fatalf("floor index: %v", err)
		}
		pgbench.Vacuum(b, pool, relayT, floorT)
		b.StartTimer()

		floorCPU := pgbench.ReadCPU()
		floor := floorDrain(b, pool, floorT, drainBatch)
		floorCost := floorCPU.PerEvent(drainRows)

		tr.reset()
		s := pgbench.NewSink(drainRows)
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		relayCPU := pgbench.ReadCPU()
		start := time.Now()
		r := startRelay(b, pool, relayT, postgres.SubscriberConfig{}, s)
		elapsed := s.Wait(b, 5*time.Minute).Sub(start)
		runtime.ReadMemStats(&after)
		relayCost := relayCPU.PerEvent(drainRows)
		b.StopTimer()
		r.stop(b)
		allocs := float64(after.Mallocs-before.Mallocs) / drainRows
		allocBytes := float64(after.TotalAlloc-before.TotalAlloc) / drainRows
		if n := pgbench.Count(b, pool, `SELECT count(*) FROM `+relayT.Quoted+` WHERE status <> 'completed'`); n != 0 {
			b.Fatalf("relay left %d rows not completed after delivering %d", n, drainRows)
		}
		relay := pgbench.PerSecond(drainRows, elapsed)
		n, _, med := tr.fetches()
		b.Logf("relay: %d events in %s (%.0f/s), %d fetches (median %.1f ms), %.0f allocations (%.0f bytes) per event in this process; floor: %.0f/s; %s",
			drainRows, elapsed.Round(time.Millisecond), relay, n, ms(med), allocs, allocBytes, floor, pgbench.LoadAvg(3))
		b.Logf("relay: %s; floor: %s", relayCost, floorCost)
		b.Logf("relay statements by wall time (the relay runs them on several connections at once):")
		for _, l := range tr.top(4) {
			b.Log("  " + l)
		}
		m.Add("relay-evt/s", relay)
		m.Add("floor-evt/s", floor)
		m.Add("relay/floor-%", 100*relay/floor)
		// The Go side's cost: allocations of this process (relay, router,
		// sink) per delivered event while the relay drains.
		m.Add("relay-allocs/evt", allocs)
		m.Add("relay-alloc-B/evt", allocBytes)
		pgbench.Drop(b, pool, relayT, floorT)
		pool.Reset() // a round's connections close with it: three rounds' pools would hold 60
	}
	m.Report(b)
}

// floorDrain is the raw-SQL floor: the least a relay must do per batch.
// It returns events per second.
func floorDrain(b *testing.B, pool *pgxpool.Pool, t pgbench.Table, batch int) float64 {
	b.Helper()
	ctx := context.Background()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		b.Fatalf("floor: acquire: %v", err)
	}
	defer conn.Release()
	pub := pgbench.NewSink(drainRows)
	lock := `SELECT id, event_id::text, topic, payload, metadata FROM ` + t.Quoted + `
WHERE status = 'pending' ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED`
	done := `UPDATE ` + t.Quoted + ` SET status = 'completed', completed_at = now() WHERE id = ANY($1)`
	start := time.Now()
	total := 0
	for {
		tx, err := conn.Begin(ctx)
		if err != nil {
			b.Fatalf("floor: begin: %v", err)
		}
		rs, err := tx.Query(ctx, lock, batch)
		if err != nil {
			b.Fatalf("floor: lock: %v", err)
		}
		var ids []int64
		for rs.Next() {
			var (
				id      int64
				eventID string
				topic   string
				payload []byte
				meta    []byte
			)
			if err := rs.Scan(&id, &eventID, &topic, &payload, &meta); err != nil {
				b.Fatalf("floor: scan: %v", err)
			}
			msg := message.NewMessage(eventID, payload)
			if err := json.Unmarshal(meta, &msg.Metadata); err != nil {
				b.Fatalf("floor: metadata: %v", err)
			}
			if err := pub.Publish(topic, msg); err != nil {
				b.Fatalf("floor: publish: %v", err)
			}
			ids = append(ids, id)
		}
		if err := rs.Err(); err != nil {
			b.Fatalf("floor: lock: %v", err)
		}
		if len(ids) == 0 {
			_ = tx.Rollback(ctx)
			break
		}
		if _, err := tx.Exec(ctx, done, ids); err != nil {
			b.Fatalf("floor: complete: %v", err)
		}
		if err := tx.Commit(ctx); err != nil {
			b.Fatalf("floor: commit: %v", err)
		}
		total += len(ids)
	}
	elapsed := time.Since(start)
	if total != drainRows {
		b.Fatalf("floor drained %d rows, want %d", total, drainRows)
	}
	return pgbench.PerSecond(total, elapsed)
}

// Sizes of BenchmarkRunLength.
const runEvents = 1000

// BenchmarkRunLength drains one key holding 1000 events with RunLength 1
// (head-only fetch: one event per fetch cycle) and with the default
// RunLength (16), each on its own table, and reports the wall time of each,
// the number of fetch statements the relay ran (counted from its pool), and
// the speed-up (target ≥ 10×).
func BenchmarkRunLength(b *testing.B) {
	var (
		times   = map[int]time.Duration{}
		fetches = map[int]int{}
		lengths = []int{1, postgres.DefaultRunLength}
	)
	for range b.N {
		b.StopTimer()
		tr := &tracer{}
		pool := pgbench.NewPool(b, 20, tr)
		tabs := map[int]pgbench.Table{}
		for _, rl := range lengths {
			t := pgbench.NewTable(b, pool, postgres.KindOutbox, fmt.Sprintf("runs_%d", rl))
			seed(b, pool, t, rows{n: runEvents, keys: 1, prefix: "aggregate-"})
			pgbench.Vacuum(b, pool, t)
			tabs[rl] = t
		}
		for _, rl := range lengths {
			tr.reset()
			s := pgbench.NewSink(runEvents)
			b.StartTimer()
			start := time.Now()
			r := startRelay(b, pool, tabs[rl], postgres.SubscriberConfig{RunLength: rl}, s)
			elapsed := s.Wait(b, 2*time.Minute).Sub(start)
			b.StopTimer()
			r.stop(b)
			n, nonEmpty, med := tr.fetches()
			b.Logf("RunLength %2d: %d events in %s, %d fetches (%d returned rows), median fetch %.2f ms; %s",
				rl, runEvents, elapsed.Round(time.Millisecond), n, nonEmpty, ms(med), pgbench.LoadAvg(3))
			times[rl] += elapsed
			fetches[rl] += nonEmpty
		}
	}
	one, def := times[1], times[postgres.DefaultRunLength]
	b.ReportMetric(ms(one)/float64(b.N), "run1-ms")
	b.ReportMetric(ms(def)/float64(b.N), "run16-ms")
	b.ReportMetric(float64(fetches[1])/float64(b.N), "run1-fetches")
	b.ReportMetric(float64(fetches[postgres.DefaultRunLength])/float64(b.N), "run16-fetches")
	b.ReportMetric(float64(one)/float64(def), "speedup-x")
}
