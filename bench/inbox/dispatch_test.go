package inboxbench

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/omnibus-go/omnibus/bench/internal/pgbench"
	"github.com/omnibus-go/omnibus/processors"
	"github.com/omnibus-go/omnibus/transports/postgres"
)

// Sizes of BenchmarkInboxDispatch.
const (
	dispatchRows = 100_000
	dispatchKeys = 10_000
)

// seedOutbox inserts n pending rows over keys keys into an outbox table, a
// key's rows spread over the table in id order.
func seedOutbox(b *testing.B, pool *pgxpool.Pool, t pgbench.Table, n, keys int) {
	b.Helper()
	if _, err := pool.Exec(context.Background(), `
INSERT INTO `+t.Quoted+` (event_id, topic, partition_key, event_type, payload, metadata)
SELECT gen_random_uuid(), 'bench', k.key, 'bench.event', '{}'::bytea, jsonb_build_object('partition_key', k.key)
FROM generate_series(0, $1::int - 1) AS g
CROSS JOIN LATERAL (SELECT 'key-' || (g % $2::int)::text AS key) AS k`, n, keys); err != nil {
		b.Fatalf("seed %s: %v", t.Name, err)
	}
}

// seedInbox inserts the same shape into an inbox table for group "bench".
func seedInbox(b *testing.B, pool *pgxpool.Pool, t pgbench.Table, n, keys int) {
	b.Helper()
	if _, err := pool.Exec(context.Background(), `
INSERT INTO `+t.Quoted+` (message_id, consumer_group, event_id, topic, partition_key, event_type, payload, metadata)
SELECT u::text, 'bench', u, 'bench', k.key, 'bench.event', '{}'::bytea, jsonb_build_object('partition_key', k.key)
FROM generate_series(0, $1::int - 1) AS g
CROSS JOIN LATERAL (SELECT 'key-' || (g % $2::int)::text AS key, gen_random_uuid() AS u) AS k`, n, keys); err != nil {
		b.Fatalf("seed %s: %v", t.Name, err)
	}
}

type benchEvent struct{}

// dispatchRuns alternates, across iterations and -count runs, whether the
// relay or the dispatcher goes first, so neither always meets a warmer server.
var dispatchRuns atomic.Int64

// BenchmarkInboxDispatch dispatches 100k stored inbox rows over 10k keys to a
// no-op typed handler with a processors.Dispatcher (default configuration:
// BatchSize 100, RunLength 16), once plainly and once with the Transactional
// option (each handler in a transaction that completes its row), and drains
// an outbox of the same shape with a processors.OutboxRelay into an
// in-memory sink, in the same run, each on its own table.
//
// Metrics: dispatch-evt/s, dispatch-tx-evt/s, relay-evt/s (first row to the
// 100,000th handler call or publish), dispatch/relay-% (target ≥ 50 %).
func BenchmarkInboxDispatch(b *testing.B) {
	var dispatchSum, txSum, relaySum float64
	for range b.N {
		b.StopTimer()
		pool := pgbench.NewPool(b, 20, nil)
		outboxT := pgbench.NewTable(b, pool, postgres.KindOutbox, "relay")
		inboxT := pgbench.NewTable(b, pool, postgres.KindInbox, "dispatch")
		txT := pgbench.NewTable(b, pool, postgres.KindInbox, "dispatch_tx")
		seedOutbox(b, pool, outboxT, dispatchRows, dispatchKeys)
		seedInbox(b, pool, inboxT, dispatchRows, dispatchKeys)
		seedInbox(b, pool, txT, dispatchRows, dispatchKeys)
		pgbench.Vacuum(b, pool, outboxT, inboxT, txT)
		b.StartTimer()

		var relay, dispatch, tx float64
		steps := []func(){
			func() { relay = runRelay(b, pool, outboxT) },
			func() { dispatch = runDispatch(b, pool, inboxT, false) },
			func() { tx = runDispatch(b, pool, txT, true) },
		}
		if dispatchRuns.Add(1)%2 == 0 {
			steps[0], steps[1] = steps[1], steps[0]
		}
		for _, s := range steps {
			s()
		}
		b.StopTimer()
		for _, t := range []pgbench.Table{outboxT, inboxT, txT} {
			if n := pgbench.Count(b, pool, `SELECT count(*) FROM `+t.Quoted+` WHERE status = 'pending'`); n != 0 {
				b.Fatalf("%s: %d rows still pending", t.Name, n)
			}
		}
		b.Logf("dispatch: %.0f/s; transactional dispatch: %.0f/s; relay: %.0f/s; %s", dispatch, tx, relay, pgbench.LoadAvg(1))
		dispatchSum += dispatch
		txSum += tx
		relaySum += relay
	}
	b.ReportMetric(dispatchSum/float64(b.N), "dispatch-evt/s")
	b.ReportMetric(txSum/float64(b.N), "dispatch-tx-evt/s")
	b.ReportMetric(relaySum/float64(b.N), "relay-evt/s")
	b.ReportMetric(100*dispatchSum/relaySum, "dispatch/relay-%")
}

func runRelay(b *testing.B, pool *pgxpool.Pool, t pgbench.Table) float64 {
	b.Helper()
	c := pgbench.NewCountdown(dispatchRows)
	r, err := processors.NewOutboxRelay(pool, processors.OutboxRelayConfig{
		Publisher:  &pgbench.Sink{Countdown: c},
		Subscriber: postgres.SubscriberConfig{Table: t.Name},
	}, nil)
	if err != nil {
		b.Fatal(err)
	}
	begin := time.Now()
	rn := start(r)
	end := c.Wait(b, 5*time.Minute)
	rn.stop(b)
	return pgbench.PerSecond(dispatchRows, end.Sub(begin))
}

func runDispatch(b *testing.B, pool *pgxpool.Pool, t pgbench.Table, transactional bool) float64 {
	b.Helper()
	c := pgbench.NewCountdown(dispatchRows)
	d, err := processors.NewDispatcher(pool, processors.DispatcherConfig{
		Subscriber:    postgres.SubscriberConfig{Table: t.Name, ConsumerGroup: "bench"},
		Transactional: transactional,
	}, nil)
	if err != nil {
		b.Fatal(err)
	}
	processors.Handle(d, "bench.event", func(context.Context, benchEvent, *message.Message) error {
		c.Hit()
		return nil
	})
	begin := time.Now()
	rn := start(d)
	end := c.Wait(b, 5*time.Minute)
	rn.stop(b)
	return pgbench.PerSecond(dispatchRows, end.Sub(begin))
}
