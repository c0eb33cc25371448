package postgresbench

import (
	"context"
	"fmt"
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

	"github.com/omnibus-go/omnibus/bench/internal/pgbench"
	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/processors"
	"github.com/omnibus-go/omnibus/transports/postgres"
)

// Sizes of BenchmarkWALPerEvent.
const (
	walEvents  = 20_000
	walKeys    = 1_000
	walPerTx   = 10 // outbox: events per business transaction
	walWriters = 4
	walBatch   = 100 // inbox: messages per store, as InboxIngest batches them
)

// BenchmarkWALPerEvent measures what the whole path of one event costs the
// database in write-ahead log and row versions (issue 27 point 4):
//
//   - outbox: 4 writers enqueue 20,000 events in transactions of 10 over
//     1,000 keys while an OutboxRelay (default configuration) delivers them
//     to an in-memory sink, until every one is delivered and completed;
//   - inbox: 4 writers store the same number of messages with Inbox.Store in
//     batches of 100 while a Dispatcher (default configuration) hands them
//     to a no-op handler, until every one is completed.
//
// WAL is the server's insert position before and after (the whole cluster:
// run it alone). Row versions come from pg_stat_user_tables, read after the
// pool that did the work is closed (a backend reports its counts when it
// exits): dead versions are updates plus deletes (each leaves one version
// for vacuum), HOT is the share of updates that touched no index. Per
// relation (the table, its lanes table, its notes table) and per event.
//
// Each path runs on both layouts: the single table and the partitioned one
// (one-hour partitions; "-partitioned", whose counts are its partitions'
// and whose WAL includes its dedup table's).
//
// Metrics: wal-B/evt, and dead/evt of the table, lanes and notes, and hot-%
// of the table's updates, each for outbox and inbox.
func BenchmarkWALPerEvent(b *testing.B) {
	for _, layout := range []time.Duration{0, time.Hour} {
		for _, kind := range []postgres.Kind{postgres.KindOutbox, postgres.KindInbox} {
			name := "outbox"
			if kind == postgres.KindInbox {
				name = "inbox"
			}
			if layout > 0 {
				name += "-partitioned"
			}
			b.Run(name, func(b *testing.B) {
				var sum walCost
				for range b.N {
					c := walPath(b, kind, layout)
					b.Logf("%s: %s", name, c)
					sum = sum.add(c)
				}
				n := float64(b.N)
				b.ReportMetric(sum.walPerEvent/n, "wal-B/evt")
				b.ReportMetric(sum.table.deadPerEvent/n, "table-dead/evt")
				b.ReportMetric(sum.lanes.deadPerEvent/n, "lanes-dead/evt")
				b.ReportMetric(sum.notes.deadPerEvent/n, "notes-dead/evt")
				b.ReportMetric(sum.table.hotPct/n, "table-hot-%")
			})
		}
	}
}

// relCost is what one relation paid per event.
type relCost struct {
	deadPerEvent float64 // updates + deletes per event
	hotPct       float64 // HOT share of its updates
}

type walCost struct {
	walPerEvent         float64
	table, lanes, notes relCost
}

func (c walCost) add(o walCost) walCost {
	sum := func(a, b relCost) relCost {
		return relCost{a.deadPerEvent + b.deadPerEvent, a.hotPct + b.hotPct}
	}
	return walCost{c.walPerEvent + o.walPerEvent, sum(c.table, o.table), sum(c.lanes, o.lanes), sum(c.notes, o.notes)}
}

func (c walCost) String() string {
	return fmt.Sprintf("%.0f WAL bytes per event; dead versions per event: table %.2f (%.0f %% of its updates HOT), lanes %.2f, notes %.2f",
		c.walPerEvent, c.table.deadPerEvent, c.table.hotPct, c.lanes.deadPerEvent, c.notes.deadPerEvent)
}

// tupleCounts are a relation's cumulative counts of pg_stat_user_tables.
type tupleCounts struct{ upd, hot, del int64 }

// walPath runs one path on a fresh table and returns its cost per event.
func walPath(b *testing.B, kind postgres.Kind, interval time.Duration) walCost {
	b.Helper()
	b.StopTimer()
	admin := pgbench.NewPool(b, 4, nil)
	t := pgbench.NewPartitionedTable(b, admin, kind, "wal", interval)
	rels := []string{t.Quoted, t.Lanes, t.Notes}
	before := readCounts(b, admin, rels)
	lsn := currentLSN(b, admin)

	work, err := pgxpool.New(context.Background(), admin.Config().ConnString())
	if err != nil {
		b.Fatalf("pool: %v", err)
	}
	b.StartTimer()
	if kind == postgres.KindOutbox {
		walOutbox(b, work, t)
	} else {
		walInbox(b, work, t)
	}
	b.StopTimer()
	work.Close() // its backends report their counts as they exit
	wal := currentLSN(b, admin) - lsn
	after := waitCounts(b, admin, rels, before)

	if n := pgbench.Count(b, admin, `SELECT count(*) FROM `+t.Quoted+` WHERE status <> 'completed'`); n != 0 {
		b.Fatalf("%s: %d rows not completed", t.Name, n)
	}
	rel := func(i int) relCost {
		upd, hot := after[i].upd-before[i].upd, after[i].hot-before[i].hot
		c := relCost{deadPerEvent: float64(upd+after[i].del-before[i].del) / walEvents}
		if upd > 0 {
			c.hotPct = 100 * float64(hot) / float64(upd)
		}
		return c
	}
	return walCost{walPerEvent: float64(wal) / walEvents, table: rel(0), lanes: rel(1), notes: rel(2)}
}

// walOutbox enqueues walEvents in transactions of walPerTx from walWriters
// goroutines while a relay delivers them, and returns when all are delivered.
func walOutbox(b *testing.B, pool *pgxpool.Pool, t pgbench.Table) {
	ob, err := postgres.NewOutbox(postgres.OutboxConfig{Table: t.Name})
	if err != nil {
		b.Fatal(err)
	}
	sink := pgbench.NewSink(walEvents)
	r := startRelay(b, pool, t, postgres.SubscriberConfig{}, sink)
	writeConcurrently(b, walEvents/walPerTx, func(ctx context.Context, i int) error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			return ob.Enqueue(ctx, tx, benchTopic, walMessages(i, walPerTx)...)
		})
	})
	sink.Wait(b, 5*time.Minute)
	r.stop(b)
}

// walInbox stores walEvents in batches of walBatch from walWriters
// goroutines while a Dispatcher handles them, and returns when all are
// handled and completed.
func walInbox(b *testing.B, pool *pgxpool.Pool, t pgbench.Table) {
	in, err := postgres.NewInbox(postgres.InboxConfig{Table: t.Name})
	if err != nil {
		b.Fatal(err)
	}
	c := pgbench.NewCountdown(walEvents)
	d, err := processors.NewDispatcher(pool, processors.DispatcherConfig{
		Subscriber: postgres.SubscriberConfig{Table: t.Name, ConsumerGroup: "bench"},
	}, nil)
	if err != nil {
		b.Fatal(err)
	}
	processors.Handle(d, "bench.event", func(context.Context, walEvent, *message.Message) error {
		c.Hit()
		return nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	writeConcurrently(b, walEvents/walBatch, func(ctx context.Context, i int) error {
		_, err := in.StoreWith(ctx, pool, postgres.StoreOptions{Group: "bench", Topic: benchTopic}, walMessages(i, walBatch)...)
		return err
	})
	c.Wait(b, 5*time.Minute)
	// The last completions are written by the dispatcher's flusher after
	// the handler returned; wait for them before stopping it.
	deadline := time.Now().Add(time.Minute)
	for pgbench.Count(b, pool, `SELECT count(*) FROM `+t.Quoted+` WHERE status <> 'completed'`) != 0 {
		if time.Now().After(deadline) {
			b.Fatalf("%s: rows still not completed a minute after their handling", t.Name)
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil && ctx.Err() == nil {
		b.Fatalf("dispatcher: %v", err)
	}
}

type walEvent struct {
	Pad string `json:"pad"`
}

// walPayload is a JSON event of about payloadBytes, which the Dispatcher
// decodes into walEvent.
var walPayload = []byte(`{"pad":"` + strings.Repeat("x", payloadBytes-10) + `"}`)

// walMessages returns the n messages of unit i: keys spread over walKeys.
func walMessages(i, n int) []*message.Message {
	msgs := make([]*message.Message, n)
	for j := range msgs {
		m := message.NewMessage(watermill.NewUUID(), walPayload)
		bus.SetPartitionKey(m, "key-"+strconv.Itoa((i*n+j)%walKeys))
		bus.SetEventType(m, "bench.event")
		msgs[j] = m
	}
	return msgs
}

// writeConcurrently runs write for units 0..units-1 from walWriters goroutines.
func writeConcurrently(b *testing.B, units int, write func(ctx context.Context, i int) error) {
	b.Helper()
	var (
		next atomic.Int64
		wg   sync.WaitGroup
	)
	for range walWriters {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= units {
					return
				}
				if err := write(context.Background(), i); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if b.Failed() {
		b.FailNow()
	}
}

func currentLSN(b *testing.B, pool *pgxpool.Pool) int64 {
	b.Helper()
	var n int64
	if err := pool.QueryRow(context.Background(), `SELECT (pg_current_wal_insert_lsn() - '0/0'::pg_lsn)::bigint`).Scan(&n); err != nil {
		b.Fatalf("wal position: %v", err)
	}
	return n
}

func readCounts(b *testing.B, pool *pgxpool.Pool, rels []string) []tupleCounts {
	b.Helper()
	ctx := context.Background()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Release()
	// A fresh look at the shared statistics, not this session's snapshot.
	if _, err := conn.Exec(ctx, `SELECT pg_stat_clear_snapshot()`); err != nil {
		b.Fatal(err)
	}
	out := make([]tupleCounts, len(rels))
	for i, rel := range rels {
		// A partitioned table's counts are its partitions'.
		err := conn.QueryRow(ctx, `
WITH p AS (SELECT $1::regclass AS relid UNION SELECT relid FROM pg_partition_tree($1::regclass) WHERE isleaf)
SELECT coalesce(sum(n_tup_upd), 0)::bigint, coalesce(sum(n_tup_hot_upd), 0)::bigint, coalesce(sum(n_tup_del), 0)::bigint
FROM pg_stat_user_tables s JOIN p USING (relid)`, rel).Scan(&out[i].upd, &out[i].hot, &out[i].del)
		if err != nil {
			b.Fatalf("statistics of %s: %v", rel, err)
		}
	}
	return out
}

// waitCounts reads the counts until the table's have moved past before and
// stopped moving: backends report them as they exit, shortly after Close.
func waitCounts(b *testing.B, pool *pgxpool.Pool, rels []string, before []tupleCounts) []tupleCounts {
	b.Helper()
	last := readCounts(b, pool, rels)
	for range 50 {
		time.Sleep(100 * time.Millisecond)
		now := readCounts(b, pool, rels)
		if now[0] != before[0] && fmt.Sprint(now) == fmt.Sprint(last) {
			return now
		}
		last = now
	}
	return last
}
