//go:build soak

package postgres

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/internal/testenv"
)

// TestPinnedHorizonStand is the sustained-operation stand of issue 27
// (`make soak-horizon`): writers enqueue several keys per transaction as
// fast as they can while one relay delivers to an instant sink, and from
// the second minute until the last another session holds a REPEATABLE READ
// transaction open (the xmin horizon pinned; OMNIBUS_HORIZON_PIN=off runs
// without it). Every minute it prints write and delivery throughput,
// Enqueue commit p99, fetch p50/p99, commit→delivery p99, WAL bytes per
// delivered event, and the dead tuples and sizes of the outbox, its indexes
// and its lanes table. It asserts what must never happen (a committed row
// not delivered, a key delivered out of order); the figures are for
// docs/benchmarks.md, not assertions. OMNIBUS_HORIZON_DURATION (default
// 20m) sets how long the writers write, OMNIBUS_HORIZON_VACUUM the relay's
// VacuumInterval (default DefaultVacuumInterval; -1s turns it off).
func TestPinnedHorizonStand(t *testing.T) {
	duration := 20 * time.Minute
	if s := os.Getenv("OMNIBUS_HORIZON_DURATION"); s != "" {
		var err error
		duration, err = time.ParseDuration(s)
		require.NoError(t, err, "OMNIBUS_HORIZON_DURATION")
	}
	pin := os.Getenv("OMNIBUS_HORIZON_PIN") != "off"
	var vacuum time.Duration // the relay's VacuumInterval: its default unless OMNIBUS_HORIZON_VACUUM says
	if s := os.Getenv("OMNIBUS_HORIZON_VACUUM"); s != "" {
		var err error
		vacuum, err = time.ParseDuration(s)
		require.NoError(t, err, "OMNIBUS_HORIZON_VACUUM")
	}
	const writers, keysPerTx, keys = 6, 3, 1000

	pool, ob := newOutbox(t)
	ctx, cancel := context.WithTimeout(context.Background(), duration+10*time.Minute)
	defer cancel()
	tn := ob.q.table
	var autovacuum string
	require.NoError(t, pool.QueryRow(ctx, `SHOW autovacuum`).Scan(&autovacuum))
	t.Logf("stand: %s, %d writers × %d keys per transaction over %d keys, horizon pinned: %v, autovacuum: %s, relay vacuum interval: %s",
		duration, writers, keysPerTx, keys, pin, autovacuum, cmp.Or(vacuum, DefaultVacuumInterval))

	m := &minute{}
	var fetches fetchObserver
	fetches.m = m
	// The relay's own warnings and notices (leases lost, slow vacuums) go to
	// the stand's output.
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	sub, err := NewSubscriber(pool, SubscriberConfig{Table: ob.Table(), WorkerID: "relay", Observer: &fetches, VacuumInterval: vacuum}, logger)
	require.NoError(t, err)
	defer sub.Close()
	msgs, err := sub.Subscribe(ctx, AllTopics)
	require.NoError(t, err)

	var (
		mu        sync.Mutex
		committed = map[string]time.Time{} // message UUID → commit time
		lastSeq   = map[string]int{}       // key → last delivered sequence
		delivered = map[string]bool{}
		reordered []string
	)
	go func() {
		for msg := range msgs {
			now := time.Now()
			key := bus.PartitionKey(msg)
			seq, _ := strconv.Atoi(msg.Metadata.Get("seq"))
			mu.Lock()
			if !delivered[msg.UUID] {
				delivered[msg.UUID] = true
				if seq <= lastSeq[key] {
					reordered = append(reordered, fmt.Sprintf("%s: %d after %d", key, seq, lastSeq[key]))
				}
				lastSeq[key] = seq
				if at, ok := committed[msg.UUID]; ok {
					m.observe(&m.lag, now.Sub(at))
				}
				m.delivered.Add(1)
			}
			mu.Unlock()
			msg.Ack()
		}
	}()

	// The writers: each transaction takes keysPerTx distinct keys; a key's
	// sequence is taken under seqMu, with the key locked by the
	// transaction's order (one writer per key at a time).
	var seqMu sync.Mutex
	next := map[string]int{}
	busy := map[string]bool{}
	stopWriting := make(chan struct{})
	var wg sync.WaitGroup
	var written atomic.Int64
	for range writers {
		wg.Go(func() {
			for {
				select {
				case <-stopWriting:
					return
				default:
				}
				seqMu.Lock()
				var ks []string
				for len(ks) < keysPerTx {
					k := "k" + strconv.Itoa(rand.IntN(keys))
					if !busy[k] && !slices.Contains(ks, k) {
						ks = append(ks, k)
					}
				}
				for _, k := range ks {
					busy[k] = true
				}
				seqMu.Unlock()
				start := time.Now()
				var batch []*messageSeq
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					batch = batch[:0]
					seqMu.Lock()
					for _, k := range ks {
						batch = append(batch, &messageSeq{key: k, seq: next[k] + 1})
					}
					seqMu.Unlock()
					for _, b := range batch {
						msg := event(b.key, `{"order":"o","amount":4200,"currency":"EUR","note":"a payload of about 128 bytes as the benchmarks use"}`)
						msg.Metadata.Set("seq", strconv.Itoa(b.seq))
						b.id = msg.UUID
						if err := ob.Enqueue(ctx, tx, "t", msg); err != nil {
							return err
						}
					}
					return nil
				})
				took := time.Since(start)
				seqMu.Lock()
				if err == nil {
					for _, b := range batch {
						next[b.key] = b.seq
					}
				}
				for _, k := range ks {
					busy[k] = false
				}
				seqMu.Unlock()
				if err != nil {
					if ctx.Err() == nil {
						t.Errorf("writer: %v", err)
					}
					return
				}
				now := time.Now()
				mu.Lock()
				for _, b := range batch {
					committed[b.id] = now
				}
				mu.Unlock()
				written.Add(int64(len(batch)))
				m.written.Add(int64(len(batch)))
				m.observe(&m.commit, took)
			}
		})
	}

	// The pinned horizon.
	var pinned pgx.Tx
	unpin := func() {
		if pinned != nil {
			_ = pinned.Rollback(context.Background())
			pinned = nil
		}
	}
	defer unpin()

	t.Logf("%-6s %9s %9s %9s %9s %9s %9s %9s %10s %10s %10s %10s %10s %10s %6s",
		"minute", "written/s", "deliver/s", "commit99", "fetch50", "fetch99", "lag99", "WAL/event",
		"dead(out)", "size(out)", "idx(out)", "dead(lanes)", "size(lanes)", "dedup", "HOT%")
	lsn := walLSN(t, pool)
	// HOT%: the share of the outbox's row updates (leases, settlements) in
	// the minute that were HOT, so wrote no index entry. Behind a pinned
	// horizon no page is pruned, and once a page's free space is used its
	// updates cannot be HOT.
	var updates, hot int64
	tick := time.NewTicker(time.Minute)
	defer tick.Stop()
	began := time.Now()
	for i := 1; ; i++ {
		<-tick.C
		if pin && i == 1 {
			pinned, err = pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
			require.NoError(t, err)
			var x int64
			require.NoError(t, pinned.QueryRow(ctx, `SELECT count(*) FROM `+tn.quoted()).Scan(&x)) // takes the snapshot
		}
		now := walLSN(t, pool)
		w, d := m.written.Swap(0), m.delivered.Swap(0)
		commit, fetch, lag := m.take()
		// dead(lanes) is the statistics' count, which lags (engine.compact);
		// size(lanes), the lanes table's file, does not.
		var deadOut, deadLanes, size, idx, dedup, lanesSize, upd, hotUpd int64
		// A partitioned table has no storage of its own: its figures are
		// its partitions' (and its dedup table's, which only it has).
		require.NoError(t, pool.QueryRow(ctx, `
			WITH p AS (SELECT $1::regclass AS relid UNION SELECT relid FROM pg_partition_tree($1::regclass) WHERE isleaf)
			SELECT coalesce((SELECT sum(s.n_dead_tup) FROM pg_stat_user_tables s JOIN p USING (relid)), 0)::bigint,
			       coalesce((SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = $2::regclass), 0),
			       (SELECT sum(pg_table_size(relid)) FROM p)::bigint, (SELECT sum(pg_indexes_size(relid)) FROM p)::bigint,
			       coalesce(pg_total_relation_size(to_regclass($3)), 0), pg_relation_size($2::regclass),
			       coalesce((SELECT sum(s.n_tup_upd) FROM pg_stat_user_tables s JOIN p USING (relid)), 0)::bigint,
			       coalesce((SELECT sum(s.n_tup_hot_upd) FROM pg_stat_user_tables s JOIN p USING (relid)), 0)::bigint`,
			tn.quoted(), tn.derived("_lanes").quoted(), tn.derived("_dedup").quoted()).Scan(&deadOut, &deadLanes, &size, &idx, &dedup, &lanesSize, &upd, &hotUpd))
		hotPct := "-"
		if upd > updates {
			hotPct = strconv.FormatInt(100*(hotUpd-hot)/(upd-updates), 10)
		}
		updates, hot = upd, hotUpd
		walPer := "-"
		if d > 0 {
			walPer = strconv.FormatInt((now-lsn)/d, 10)
		}
		lsn = now
		t.Logf("%-6d %9d %9d %9s %9s %9s %9s %9s %10d %10s %10s %10d %10s %10s %6s",
			i, w/60, d/60, pct(commit, 99), pct(fetch, 50), pct(fetch, 99), pct(lag, 99), walPer,
			deadOut, mib(size), mib(idx), deadLanes, mib(lanesSize), mib(dedup), hotPct)
		if time.Since(began) >= duration-30*time.Second {
			break
		}
	}
	close(stopWriting)
	wg.Wait()
	unpin()

	total := written.Load()
	testenv.Eventually(t, 10*time.Minute, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return int64(len(delivered)) >= total
	}, "every committed event delivered after the writers stop")
	mu.Lock()
	defer mu.Unlock()
	for id := range committed {
		if !delivered[id] {
			t.Errorf("committed event %s never delivered", id)
			break
		}
	}
	assert.Empty(t, reordered, "events delivered after a later one of their key")
	t.Logf("%d events written and delivered", total)
}

type messageSeq struct {
	key, id string
	seq     int
}

// minute collects one minute's figures.
type minute struct {
	written, delivered atomic.Int64

	mu                 sync.Mutex
	commit, fetch, lag []time.Duration
}

func (m *minute) observe(into *[]time.Duration, d time.Duration) {
	m.mu.Lock()
	*into = append(*into, d)
	m.mu.Unlock()
}

func (m *minute) take() (commit, fetch, lag []time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	commit, fetch, lag = m.commit, m.fetch, m.lag
	m.commit, m.fetch, m.lag = nil, nil, nil
	return commit, fetch, lag
}

type fetchObserver struct{ m *minute }

func (o *fetchObserver) ObserveFetch(f FetchInfo) {
	if f.Err == nil {
		o.m.observe(&o.m.fetch, f.Duration)
	}
}

func (o *fetchObserver) ObserveSettle(SettleInfo) {}

func pct(ds []time.Duration, p int) string {
	if len(ds) == 0 {
		return "-"
	}
	slices.Sort(ds)
	return ds[(len(ds)-1)*p/100].Round(100 * time.Microsecond).String()
}

func mib(b int64) string { return fmt.Sprintf("%.1fMiB", float64(b)/(1<<20)) }

func walLSN(t *testing.T, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) int64 {
	var n int64
	require.NoError(t, q.QueryRow(context.Background(), `SELECT pg_current_wal_lsn() - '0/0'::pg_lsn`).Scan(&n))
	return n
}
