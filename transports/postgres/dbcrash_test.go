package postgres

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/internal/testenv"
)

// The relay commits its bookkeeping with synchronous_commit off
// (docs/ordering.md, "Delivery semantics"): a PostgreSQL crash may roll back
// its last leases, acks and lane reconciliations. The claim is that this
// costs redelivery only: no row is lost, none fails, and the first
// deliveries of each key stay in id order. A private server is crashed
// (immediate shutdown, so WAL the WAL writer had not written is lost) while
// one relay drains a backlog of three keys, and restarted on the same data
// directory and port:
//   - at once;
//   - after longer than the lease, while the handlers that were running wait
//     for the database (as handlers that write to it would): the relay's
//     leases run out in memory and in the database, so the rest of each run
//     that was in flight must be given up and delivered again from the
//     database, not skipped.
//
// The same Subscriber and the same pool go on after the restart: the pool
// drops the connections the crash broke and dials new ones, and the relay
// retries its fetches and settlements, so it has to recover by itself.
//
// Rows delivered more than once are counted, not asserted: how many commits
// a crash rolls back depends on where the WAL writer was.
func TestSubscriber_DatabaseCrashLosesNoRowAndKeepsFirstDeliveriesInOrder(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		down time.Duration // how long the server stays down; handlers wait meanwhile when > 0
	}{
		{name: "restarted at once"},
		{name: "down longer than the lease", down: crashLease + 500*time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			crashAndRestartWhileDraining(t, tc.down)
		})
	}
}

const crashLease = 2 * time.Second

func crashAndRestartWhileDraining(t *testing.T, down time.Duration) {
	pg := testenv.StartPrivatePostgres(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pcfg, err := pgxpool.ParseConfig(pg.URL())
	require.NoError(t, err)
	pcfg.MaxConns = 8
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	require.NoError(t, err)
	defer pool.Close()
	table := testenv.Name(t)
	require.NoError(t, Migrate(ctx, pool, OutboxTable(table)))
	ob, err := NewOutbox(OutboxConfig{Table: table})
	require.NoError(t, err)

	const keys, perKey, crashAt = 3, 2000, 2000
	for i := 0; i < perKey; i += 100 {
		msgs := make([]*message.Message, 0, 100*keys)
		for j := i; j < i+100; j++ {
			for k := range keys {
				msgs = append(msgs, event(fmt.Sprintf("k%d", k), fmt.Sprintf("k%d-%d", k, j)))
			}
		}
		require.NoError(t, ob.Enqueue(ctx, pool, "t", msgs...))
	}
	rows, err := pool.Query(ctx, `SELECT id FROM `+ob.q.table.quoted()+` ORDER BY id`)
	require.NoError(t, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	require.Len(t, ids, keys*perKey)

	var (
		mu         sync.Mutex
		delivered  = map[int64]int{} // id → deliveries
		firsts     = map[string][]int64{}
		total      int
		afterCrash int // deliveries since the restart
		crashed    bool
		restarted  bool
		crashNow   = make(chan struct{})
		up         = make(chan struct{}) // closed at the restart
	)
	logs := &testenv.LogBuffer{}
	sub, err := NewSubscriber(pool, SubscriberConfig{
		Table: table, WorkerID: "relay", Lease: crashLease, CloseTimeout: 5 * time.Second,
	}, slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn})))
	require.NoError(t, err)
	defer sub.Close()
	ch, err := sub.Subscribe(ctx, AllTopics)
	require.NoError(t, err)
	consumed := make(chan struct{})
	go func() {
		defer close(consumed)
		for m := range ch {
			d, _ := bus.DeliveryOf(m)
			id, err := strconv.ParseInt(d.ID, 10, 64)
			if err != nil {
				t.Errorf("delivery id %q is not a row id: %v", d.ID, err)
			}
			mu.Lock()
			if delivered[id] == 0 {
				firsts[bus.PartitionKey(m)] = append(firsts[bus.PartitionKey(m)], id)
			}
			delivered[id]++
			total++
			if total == crashAt {
				close(crashNow)
			}
			if restarted {
				afterCrash++
			}
			wait := crashed && !restarted && down > 0
			mu.Unlock()
			if wait {
				<-up
			}
			m.Ack()
		}
	}()

	select {
	case <-crashNow:
	case <-ctx.Done():
		t.Fatalf("the relay delivered fewer than %d rows before the crash was due", crashAt)
	}
	mu.Lock()
	crashed = true
	mu.Unlock()
	pg.Crash(t)
	mu.Lock()
	atCrash := total
	mu.Unlock()
	time.Sleep(down) // an outage of a set length, not a wait for an event
	pg.Restart(t)
	mu.Lock()
	restarted = true
	mu.Unlock()
	close(up)
	restartedAt := time.Now()

	// Every row completed, by the same Subscriber.
	var completed, failed int
	for {
		err := pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE status = 'completed'), count(*) FILTER (WHERE status = 'failed')
			FROM `+ob.q.table.quoted()).Scan(&completed, &failed)
		if err == nil && completed+failed == len(ids) {
			break
		}
		if time.Since(restartedAt) > 30*time.Second {
			mu.Lock()
			n := afterCrash
			mu.Unlock()
			t.Fatalf("30s after the restart, %d of %d rows are completed and %d failed (last error: %v); "+
				"the relay delivered %d rows since the restart. The others are lost, or the relay did not recover by itself.\n"+
				"rows not completed: %s\nrelay log: %v",
				completed, len(ids), failed, err, n, unfinished(ctx, pool, ob), logSummary(logs.Records(t)))
		}
		time.Sleep(20 * time.Millisecond) // polling with a deadline
	}
	recovered := time.Since(restartedAt)
	require.NoError(t, sub.Close())
	<-consumed

	require.Zero(t, failed, "no row may fail: a crash costs redelivery only")
	mu.Lock()
	defer mu.Unlock()
	var never []int64
	dupRows, dupDeliveries := 0, 0
	for _, id := range ids {
		switch n := delivered[id]; {
		case n == 0:
			never = append(never, id)
		case n > 1:
			dupRows++
			dupDeliveries += n - 1
		}
	}
	require.Empty(t, never, "rows completed in the database but never delivered to the consumer (%d of %d)", len(never), len(ids))
	for key, fs := range firsts {
		for i := 1; i < len(fs); i++ {
			if fs[i] <= fs[i-1] {
				t.Errorf("key %s: first deliveries out of id order: %d after %d (first deliveries %d..%d: %v)",
					key, fs[i], fs[i-1], max(i-5, 0), min(i+5, len(fs)), fs[max(i-5, 0):min(i+5, len(fs))])
				break
			}
		}
	}
	t.Logf("crashed after %d deliveries, down %s; every row completed %s after the restart; %d rows delivered more than once (%d extra deliveries of %d); relay log: %v",
		atCrash, down, recovered.Round(time.Millisecond), dupRows, dupDeliveries, total, logSummary(logs.Records(t)))
}

// unfinished describes a few rows that are not completed, for a failure
// message.
func unfinished(ctx context.Context, pool *pgxpool.Pool, ob *Outbox) string {
	rows, err := pool.Query(ctx, `SELECT format('%s (key %s, %s, locked_by %s, attempts %s)', id, partition_key, status, COALESCE(locked_by, 'none'), attempts)
		FROM `+ob.q.table.quoted()+` WHERE status <> 'completed' ORDER BY id LIMIT 10`)
	if err != nil {
		return err.Error()
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err.Error()
	}
	return strings.Join(out, "; ")
}

// logSummary counts log records by level and message.
func logSummary(records []map[string]any) map[string]int {
	out := map[string]int{}
	for _, r := range records {
		out[fmt.Sprint(r["level"], " ", r["msg"])]++
	}
	return out
}

// TestSubscriber_SettlementsBackOffWhileTheDatabaseIsDown acks many messages
// while the database is down. The settlements cannot be written; the
// Subscriber must try again with backoff, not once per ack that arrives
// (a full settlement batch used to be written at once whatever the backoff:
// one failed statement and one ERROR line per ack). When the database is
// back, every settlement is written and no row is lost.
func TestSubscriber_SettlementsBackOffWhileTheDatabaseIsDown(t *testing.T) {
	t.Parallel()
	pg := testenv.StartPrivatePostgres(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, pg.URL())
	require.NoError(t, err)
	defer pool.Close()
	table := testenv.Name(t)
	require.NoError(t, Migrate(ctx, pool, OutboxTable(table)))
	ob, err := NewOutbox(OutboxConfig{Table: table})
	require.NoError(t, err)
	const rows = 200
	msgs := make([]*message.Message, rows)
	for i := range msgs {
		msgs[i] = event("", "r"+strconv.Itoa(i)) // unkeyed: all in flight at once
	}
	require.NoError(t, ob.Enqueue(ctx, pool, "t", msgs...))

	logs := &testenv.LogBuffer{}
	s, err := NewSubscriber(pool, SubscriberConfig{Table: table, SettleBatch: 10, Lease: time.Minute,
		MaxInFlight: rows, BatchSize: rows}, slog.New(slog.NewJSONHandler(logs, nil)))
	require.NoError(t, err)
	defer s.Close()
	ch, err := s.Subscribe(ctx, AllTopics)
	require.NoError(t, err)
	held := make([]*message.Message, 0, rows)
	for len(held) < rows {
		select {
		case m := <-ch:
			held = append(held, m)
		case <-ctx.Done():
			t.Fatalf("only %d of %d rows delivered", len(held), rows)
		}
	}

	pg.Crash(t)
	for _, m := range held {
		m.Ack()
	}
	time.Sleep(time.Second) // the outage the settlements see
	failed := 0
	for _, r := range logs.Records(t) {
		if msg, _ := r["msg"].(string); strings.Contains(msg, "writing settlements failed") {
			failed++
		}
	}
	// Backoff from 50 ms doubling to 1 s: at most a handful of attempts in
	// a second.
	require.LessOrEqual(t, failed, 8, "failed settlement writes in one second of outage (one per ack would be about %d)", rows)

	pg.Restart(t)
	// The crash may have rolled back the leases (the relay's bookkeeping
	// commits asynchronously): those rows are delivered again, and acked.
	go func() {
		for m := range ch {
			m.Ack()
		}
	}()
	testenv.Eventually(t, 30*time.Second, func() bool {
		var n int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM `+pgx.Identifier{table}.Sanitize()+` WHERE status = 'completed'`).Scan(&n)
		return err == nil && n == rows
	}, "every settlement written once the database is back")
}
