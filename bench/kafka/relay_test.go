package kafkabench

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/omnibus-go/omnibus/bench/internal/pgbench"
	"github.com/omnibus-go/omnibus/internal/testenv"
	"github.com/omnibus-go/omnibus/processors"
	"github.com/omnibus-go/omnibus/transports/postgres"
)

// Sizes of BenchmarkRelayToKafka.
const (
	relayRows = 100_000
	relayKeys = 10_000
)

// BenchmarkRelayToKafka drains an outbox of 100k rows over 10k keys with
// the OutboxRelay (default configuration) into Kafka (our publisher,
// default configuration, a topic of 8 partitions), and, next to it, an
// identical outbox into an in-memory sink, so the cost of Kafka shows
// against the cost of the relay itself. Time runs from starting the relay to
// the last acknowledged publish.
//
// Metrics: kafka-evt/s, sink-evt/s and kafka/sink-%.
func BenchmarkRelayToKafka(b *testing.B) {
	brokers := testenv.Kafka(b)
	pool := testenv.NewPostgresPool(b, 20)
	var kafkaSum, sinkSum float64
	for i := range b.N {
		b.StopTimer()
		topic := testenv.KafkaTopic(b, brokers, partitions)
		toKafka := pgbench.NewTable(b, pool, postgres.KindOutbox, "relay_kafka")
		toSink := pgbench.NewTable(b, pool, postgres.KindOutbox, "relay_sink")
		for _, t := range []pgbench.Table{toKafka, toSink} {
			seedOutbox(b, pool, t, topic)
		}
		pub := newOurPublisher(b, brokers)
		runs := []struct {
			sum   *float64
			table pgbench.Table
			pub   message.Publisher
		}{
			{&kafkaSum, toKafka, nil},
			{&sinkSum, toSink, nil},
		}
		if i%2 == 1 {
			runs[0], runs[1] = runs[1], runs[0]
		}
		for _, r := range runs {
			c := &counting{target: relayRows, done: make(chan struct{})}
			if r.table == toKafka {
				c.next = pub
			}
			b.StartTimer()
			start := time.Now()
			stop := runRelay(b, pool, r.table.Name, c)
			select {
			case <-c.done:
			case <-time.After(10 * time.Minute):
				b.Fatalf("relay delivered %d of %d rows in 10 minutes", c.n.Load(), relayRows)
			}
			elapsed := time.Since(start)
			b.StopTimer()
			stop()
			*r.sum += relayRows / elapsed.Seconds()
		}
		if n := recordsIn(b, brokers, topic); n < relayRows {
			b.Fatalf("topic holds %d records, want %d", n, relayRows)
		}
	}
	n := float64(b.N)
	b.ReportMetric(kafkaSum/n, "kafka-evt/s")
	b.ReportMetric(sinkSum/n, "sink-evt/s")
	b.ReportMetric(100*kafkaSum/sinkSum, "kafka/sink-%")
}

// counting forwards to next (when set) and signals once target messages
// were published successfully.
type counting struct {
	next   message.Publisher
	target int64
	n      atomic.Int64
	once   sync.Once
	done   chan struct{}
}

func (c *counting) Publish(topic string, msgs ...*message.Message) error {
	if c.next != nil {
		if err := c.next.Publish(topic, msgs...); err != nil {
			return err
		}
	}
	if c.n.Add(int64(len(msgs))) >= c.target {
		c.once.Do(func() { close(c.done) })
	}
	return nil
}

func (c *counting) Close() error { return nil }

// seedOutbox inserts relayRows pending rows over relayKeys keys for topic,
// then vacuums and analyzes the tables.
func seedOutbox(b *testing.B, pool *pgxpool.Pool, table pgbench.Table, topic string) {
	b.Helper()
	ctx := context.Background()
	_, err := pool.Exec(ctx, `
INSERT INTO `+table.Quoted+` (event_id, topic, partition_key, payload, metadata)
SELECT gen_random_uuid(), $1, k.key, $2, jsonb_build_object('partition_key', k.key)
FROM generate_series(0, $3::int - 1) AS g
CROSS JOIN LATERAL (SELECT 'key-' || (g % $4::int)::text AS key) AS k`,
		topic, make([]byte, payloadBytes), relayRows, relayKeys)
	if err != nil {
		b.Fatalf("seed %s: %v", table.Name, err)
	}
	pgbench.Vacuum(b, pool, table)
}

// runRelay starts an OutboxRelay over table publishing to pub and returns
// a function that stops it.
func runRelay(b *testing.B, pool *pgxpool.Pool, table string, pub message.Publisher) (stop func()) {
	b.Helper()
	r, err := processors.NewOutboxRelay(pool, processors.OutboxRelayConfig{
		Publisher:  pub,
		Subscriber: postgres.SubscriberConfig{Table: table},
	}, nil)
	if err != nil {
		b.Fatalf("new relay: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	return func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				b.Logf("relay stopped: %v", err)
			}
		case <-time.After(time.Minute):
			b.Fatalf("relay did not stop within a minute")
		}
	}
}
