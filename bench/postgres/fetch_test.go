package postgresbench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/omnibus-go/omnibus/bench/internal/pgbench"
	"github.com/omnibus-go/omnibus/bench/internal/rounds"
	"github.com/omnibus-go/omnibus/transports/postgres"
)

// Sizes of BenchmarkFetch and BenchmarkHotKeyThroughput.
const (
	fetchCompleted = 300_000
	fetchPending   = 10_000
	fetchKeys      = 1_000
	hotRows        = 9_000
	fetchBatch     = 100
	fetchRounds    = 40 // measured replays of each statement
	fetchWarmup    = 6  // unmeasured replays first: past pgx's and PostgreSQL's plan caching
	hotKey         = "hot"
	noRowsTopic    = "bench-no-such-topic"

	throughputKeys    = 1_000
	throughputPerKey  = 20
	throughputTimeout = 3 * time.Minute
)

// BenchmarkFetch compares the cost of one omnibus fetch with a plain fetch
// without the ordering check, on two shapes of the same table:
//
//   - uniform: 300k completed rows, then 10k pending rows over 1k keys;
//   - hotkey: 300k completed rows, then 9,000 pending rows of one key, then
//     1,000 pending rows, one for each of 1,000 other keys (10k pending).
//
// The omnibus statement is not copied from the transport: a real Subscriber
// (BatchSize 100) subscribes on the seeded table to a topic that has no rows,
// the bench captures its fetch statement (SQL text and arguments) from the
// pool's pgx tracer, and replays it with the topic argument set to every
// topic (what the relay passes). Each replay runs in a transaction that is
// rolled back, so every replay sees the seeded state. The plain fetch is
// SELECT … WHERE status = 'pending' ORDER BY id LIMIT 100 FOR UPDATE SKIP
// LOCKED over an index on (id) WHERE status = 'pending' created for it; a
// "plain+lease" variant also writes the lease (UPDATE … RETURNING), which
// the omnibus fetch does in the same statement.
//
// Metrics (medians of 40 replays, each timed at the client):
// omnibus-ms (RunLength 1: 100 keys, 100 rows), plain-ms, omnibus/plain-x
// (target ≤ 2), plain+lease-ms, omnibus-run16-ms (the default RunLength:
// 100 keys and the runs behind their heads).
// Set OMNIBUS_BENCH_EXPLAIN to a file name to append EXPLAIN ANALYZE of each
// statement to it.
func BenchmarkFetch(b *testing.B) {
	for _, shape := range []string{"uniform", "hotkey"} {
		b.Run(shape, func(b *testing.B) {
			var sums [4]time.Duration
			for range b.N {
				b.StopTimer()
				tr := &tracer{}
				pool := pgbench.NewPool(b, 8, tr)
				t := pgbench.NewTable(b, pool, postgres.KindOutbox, "fetch_"+shape)
				seed(b, pool, t, rows{n: fetchCompleted, keys: fetchKeys, prefix: "key-", status: "completed"})
				if shape == "hotkey" {
					seed(b, pool, t, rows{n: hotRows, keys: 1, prefix: hotKey})
					seed(b, pool, t, rows{n: fetchKeys, keys: fetchKeys, prefix: "key-"})
				} else {
					seed(b, pool, t, rows{n: fetchPending, keys: fetchKeys, prefix: "key-"})
				}
				if _, err := pool.Exec(context.Background(),
					`CREATE INDEX ON `+t.Quoted+` (id) WHERE status = 'pending'`); err != nil {
					b.Fatalf("plain fetch index: %v", err)
				}
				pgbench.Vacuum(b, pool, t)

				stmts := []replay{
					plainFetch(t),
					plainLeaseFetch(t),
					captureFetch(b, pool, tr, t, 1),
					captureFetch(b, pool, tr, t, postgres.DefaultRunLength),
				}
				b.StartTimer()
				med, got := replayAll(b, pool, stmts)
				b.StopTimer()
				explain(b, pool, shape, stmts)
				for i := range sums {
					sums[i] += med[i]
				}
				b.Logf("%s: median of %d replays: plain %.2f ms (%d rows), plain+lease %.2f ms (%d rows), "+
					"omnibus RunLength 1 %.2f ms (%d rows), RunLength 16 %.2f ms (%d rows); %s",
					shape, fetchRounds, ms(med[0]), got[0], ms(med[1]), got[1], ms(med[2]), got[2], ms(med[3]), got[3], pgbench.LoadAvg(3))
			}
			n := float64(b.N)
			b.ReportMetric(ms(sums[2])/n, "omnibus-ms")
			b.ReportMetric(ms(sums[0])/n, "plain-ms")
			b.ReportMetric(float64(sums[2])/float64(sums[0]), "omnibus/plain-x")
			b.ReportMetric(ms(sums[1])/n, "plain+lease-ms")
			b.ReportMetric(float64(sums[2])/float64(sums[1]), "omnibus/plain+lease-x")
			b.ReportMetric(ms(sums[3])/n, "omnibus-run16-ms")
		})
	}
}

// replay is one statement to time.
type replay struct {
	name string
	sql  string
	args []any
	// lease, for the omnibus fetch, is its first statement: it leases the
	// lanes whose (group, topic, key) arrays become arguments 2-4 of sql,
	// in the same transaction.
	lease *replay
}

func plainFetch(t pgbench.Table) replay {
	return replay{name: "plain", sql: `SELECT ` + fetchColumns + ` FROM ` + t.Quoted + `
WHERE status = 'pending' ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED`, args: []any{fetchBatch}}
}

func plainLeaseFetch(t pgbench.Table) replay {
	return replay{name: "plain+lease", sql: `WITH c AS (
    SELECT id FROM ` + t.Quoted + ` WHERE status = 'pending' ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED
)
UPDATE ` + t.Quoted + ` t SET locked_by = $2, locked_until = now() + $3::interval
FROM c WHERE t.id = c.id
RETURNING ` + prefixed("t.", fetchColumns), args: []any{fetchBatch, "bench-worker", postgres.DefaultLease}}
}

// fetchColumns are the columns the omnibus fetch returns for a row.
const fetchColumns = `id, event_id::text, topic, partition_key, event_type, payload, metadata, attempts, max_attempts, created_at`

func prefixed(p, cols string) string {
	parts := strings.Split(cols, ", ")
	for i := range parts {
		parts[i] = p + parts[i]
	}
	return strings.Join(parts, ", ")
}

// captureFetch runs a Subscriber with the given RunLength over t, subscribed
// to a topic without rows so its fetch leases nothing, and returns its fetch
// statement with the topic argument switched to every topic.
func captureFetch(b *testing.B, pool *pgxpool.Pool, tr *tracer, t pgbench.Table, runLength int) replay {
	b.Helper()
	tr.mu.Lock()
	tr.sql, tr.args, tr.leaseSQL, tr.leaseArgs = "", nil, "", nil
	tr.mu.Unlock()
	sub, err := postgres.NewSubscriber(pool, postgres.SubscriberConfig{
		Table: t.Name, BatchSize: fetchBatch, RunLength: runLength, SweepInterval: -1,
	}, nil)
	if err != nil {
		b.Fatalf("capture: new subscriber: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if _, err := sub.Subscribe(ctx, noRowsTopic); err != nil {
		b.Fatalf("capture: subscribe: %v", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	var r replay
	lease := &replay{name: "lease lanes"}
	for {
		tr.mu.Lock()
		r.sql, r.args = tr.sql, tr.args
		lease.sql, lease.args = tr.leaseSQL, tr.leaseArgs
		tr.mu.Unlock()
		if r.sql != "" && lease.sql != "" {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("capture: the subscriber ran no fetch statement within 10s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	_ = sub.Close()
	for _, st := range []*replay{&r, lease} {
		swapped := 0
		for i, a := range st.args {
			if p, ok := a.(*string); ok && p != nil && *p == noRowsTopic {
				st.args[i] = (*string)(nil)
				swapped++
			}
		}
		if swapped != 1 {
			b.Fatalf("capture: found the subscribed topic in %d arguments of a fetch statement, want 1: %v", swapped, st.args)
		}
	}
	r.name = fmt.Sprintf("omnibus RunLength %d", runLength)
	r.lease = lease
	return r
}

// replayAll times each statement fetchRounds times, after fetchWarmup
// unmeasured runs, round-robin so that drift hits all of them alike, each in a
// transaction that is rolled back. It returns each statement's median and the
// event rows it returned (lane rows not counted).
func replayAll(b *testing.B, pool *pgxpool.Pool, stmts []replay) (med []time.Duration, got []int) {
	b.Helper()
	ctx := context.Background()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		b.Fatalf("replay: acquire: %v", err)
	}
	defer conn.Release()
	times := make([][]time.Duration, len(stmts))
	got = make([]int, len(stmts))
	for round := range fetchWarmup + fetchRounds {
		for i, st := range stmts {
			tx, err := conn.Begin(ctx)
			if err != nil {
				b.Fatalf("replay: begin: %v", err)
			}
			start := time.Now()
			args := st.args
			if st.lease != nil {
				args = leaseLanes(ctx, b, tx, st)
			}
			rs, err := tx.Query(ctx, st.sql, args...)
			if err != nil {
				b.Fatalf("replay %s: %v", st.name, err)
			}
			n := 0
			for rs.Next() {
				n++
			}
			rs.Close()
			el := time.Since(start)
			if err := rs.Err(); err != nil {
				b.Fatalf("replay %s: %v", st.name, err)
			}
			if err := tx.Rollback(ctx); err != nil {
				b.Fatalf("replay: rollback: %v", err)
			}
			if round >= fetchWarmup {
				times[i] = append(times[i], el)
			}
			got[i] = n
		}
	}
	for i := range stmts {
		med = append(med, percentile(times[i], 50))
	}
	return med, got
}

// leaseLanes runs the omnibus fetch's first statement in tx and returns the
// arguments of its second with the leased lanes in them.
func leaseLanes(ctx context.Context, b *testing.B, tx pgx.Tx, st replay) []any {
	rs, err := tx.Query(ctx, st.lease.sql, st.lease.args...)
	if err != nil {
		b.Fatalf("replay %s: lease lanes: %v", st.name, err)
	}
	var (
		g, t, k []string
		floors  []int64
	)
	for rs.Next() {
		var (
			lg, lt, lk string
			floor      int64
		)
		if err := rs.Scan(&lg, &lt, &lk, &floor); err != nil {
			b.Fatalf("replay %s: lease lanes: %v", st.name, err)
		}
		g, t, k, floors = append(g, lg), append(t, lt), append(k, lk), append(floors, floor)
	}
	if err := rs.Err(); err != nil {
		b.Fatalf("replay %s: lease lanes: %v", st.name, err)
	}
	args := slices.Clone(st.args)
	args[2], args[3], args[4], args[10] = g, t, k, floors
	return args
}

// explain appends EXPLAIN (ANALYZE, BUFFERS) of each statement to the file
// named by OMNIBUS_BENCH_EXPLAIN, if set.
func explain(b *testing.B, pool *pgxpool.Pool, shape string, stmts []replay) {
	b.Helper()
	path := os.Getenv("OMNIBUS_BENCH_EXPLAIN")
	if path == "" {
		return
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		b.Fatalf("explain: %v", err)
	}
	defer f.Close()
	ctx := context.Background()
	for _, st := range stmts {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			args := st.args
			if st.lease != nil {
				args = leaseLanes(ctx, b, tx, st)
			}
			rs, err := tx.Query(ctx, "EXPLAIN (ANALYZE, BUFFERS) "+st.sql, args...)
			if err != nil {
				return err
			}
			fmt.Fprintf(f, "=== %s: %s\n", shape, st.name)
			for rs.Next() {
				var line string
				if err := rs.Scan(&line); err != nil {
					return err
				}
				fmt.Fprintln(f, line)
			}
			if err := rs.Err(); err != nil {
				return err
			}
			return errRollback
		})
		if err != nil && !errors.Is(err, errRollback) {
			b.Fatalf("explain %s: %v", st.name, err)
		}
	}
}

var errRollback = errors.New("roll back")

// BenchmarkHotKeyThroughput drains 1,000 keys × 20 pending rows with the
// omnibus relay (default configuration) into a sink, on a table where one hot
// key holds 9,000 pending rows ahead of them and on a table without it, and
// compares the throughput over the 1,000 other keys (events per second from
// the relay's start to the last of their events). The hot key is still
// draining when the other keys are done.
//
// Metrics: hot-evt/s, nohot-evt/s, hot/nohot-% (target ≥ 80 %), each the
// median of rounds.N rounds per iteration.
func BenchmarkHotKeyThroughput(b *testing.B) {
	var m rounds.Medians
	others := throughputKeys * throughputPerKey
	for range b.N * rounds.N {
		b.StopTimer()
		tr := &tracer{}
		pool := pgbench.NewPool(b, 20, tr)
		base := pgbench.NewTable(b, pool, postgres.KindOutbox, "tput_nohot")
		hot := pgbench.NewTable(b, pool, postgres.KindOutbox, "tput_hot")
		seed(b, pool, hot, rows{n: hotRows, keys: 1, prefix: hotKey})
		for _, t := range []pgbench.Table{base, hot} {
			seed(b, pool, t, rows{n: others, keys: throughputKeys, prefix: "key-"})
		}
		pgbench.Vacuum(b, pool, base, hot)
		rate := map[string]float64{}
		for _, run := range []struct {
			name string
			t    pgbench.Table
		}{{"nohot", base}, {"hot", hot}} {
			tr.reset()
			s := pgbench.NewSink(others)
			s.SkipKey = hotKey + "0"
			b.StartTimer()
			start := time.Now()
			r := startRelay(b, pool, run.t, postgres.SubscriberConfig{}, s)
			elapsed := s.Wait(b, throughputTimeout).Sub(start)
			b.StopTimer()
			hotDone := s.Skipped()
			r.stop(b)
			n, _, med := tr.fetches()
			rate[run.name] = pgbench.PerSecond(others, elapsed)
			b.Logf("%-5s: %d events of the other keys in %s (%.0f/s), %d of the hot key meanwhile; %d fetches, median %.1f ms; %s",
				run.name, others, elapsed.Round(time.Millisecond), rate[run.name], hotDone, n, ms(med), pgbench.LoadAvg(3))
			for _, l := range tr.top(2) {
				b.Log("  " + l)
			}
		}
		m.Add("hot-evt/s", rate["hot"])
		m.Add("nohot-evt/s", rate["nohot"])
		m.Add("hot/nohot-%", 100*rate["hot"]/rate["nohot"])
		pgbench.Drop(b, pool, base, hot)
		pool.Reset() // a round's connections close with it
	}
	m.Report(b)
}

// singleKeyRows is the backlog of BenchmarkSingleKeyDrain.
const singleKeyRows = 30_000

// BenchmarkSingleKeyDrain drains a backlog of singleKeyRows pending rows
// of one key, alone in a fresh table (its statistics taken while every row
// is pending, as after a burst on one key), with the relay's defaults
// (RunLength 16) and with RunLength 64, into the in-memory sink. One key is
// delivered one run at a time, so this is the relay's per-run cost: fetch,
// settle and lane reconciliation. Metrics: `run16-evt/s`, `run64-evt/s`, and
// for RunLength 16 the rate of the first and of the last tenth of the
// backlog (`run16-first-tenth-evt/s`, `run16-last-tenth-evt/s`): the cost per
// run must not grow as rows complete. Each is the median of rounds.N rounds
// per iteration.
func BenchmarkSingleKeyDrain(b *testing.B) {
	var m rounds.Medians
	for range b.N * rounds.N {
		for _, run := range []int{16, 64} {
			b.StopTimer()
			tr := &tracer{}
			pool := pgbench.NewPool(b, 20, tr)
			t := pgbench.NewTable(b, pool, postgres.KindOutbox, "single")
			seed(b, pool, t, rows{n: singleKeyRows, keys: 1, prefix: hotKey})
			pgbench.Vacuum(b, pool, t)
			s := pgbench.NewSink(singleKeyRows)
			// When the first and the last tenth of the backlog went out: the
			// cost per run must not grow as rows complete.
			var (
				seen  atomic.Int64
				marks [2]atomic.Int64 // UnixNano at 10 % and at 90 %
			)
			tenth := int64(singleKeyRows / 10)
			s.OnPublish = func(*message.Message) {
				switch seen.Add(1) {
				case tenth:
					marks[0].Store(time.Now().UnixNano())
				case 9 * tenth:
					marks[1].Store(time.Now().UnixNano())
				}
			}
			b.StartTimer()
			start := time.Now()
			r := startRelay(b, pool, t, postgres.SubscriberConfig{RunLength: run}, s)
			end := s.Wait(b, throughputTimeout)
			elapsed := end.Sub(start)
			b.StopTimer()
			r.stop(b)
			first := time.Unix(0, marks[0].Load()).Sub(start)
			last := end.Sub(time.Unix(0, marks[1].Load()))
			m.Add(fmt.Sprintf("run%d-evt/s", run), pgbench.PerSecond(singleKeyRows, elapsed))
			if run == 16 {
				m.Add("run16-first-tenth-evt/s", pgbench.PerSecond(int(tenth), first))
				m.Add("run16-last-tenth-evt/s", pgbench.PerSecond(int(tenth), last))
			}
			b.Logf("RunLength %d: %d events of one key in %s (%.0f/s); first tenth %.0f/s, last tenth %.0f/s; %s",
				run, singleKeyRows, elapsed.Round(time.Millisecond), pgbench.PerSecond(singleKeyRows, elapsed),
				pgbench.PerSecond(int(tenth), first), pgbench.PerSecond(int(tenth), last), pgbench.LoadAvg(3))
			for _, l := range tr.top(3) {
				b.Log("  " + l)
			}
			pgbench.Drop(b, pool, t)
			pool.Reset() // a run's connections close with it
		}
	}
	m.Report(b)
}
