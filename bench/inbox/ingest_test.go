package inboxbench

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/omnibus-go/omnibus/bench/internal/pgbench"
	"github.com/omnibus-go/omnibus/bench/internal/rounds"
	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/internal/testenv"
	"github.com/omnibus-go/omnibus/processors"
	"github.com/omnibus-go/omnibus/transports/kafka"
	"github.com/omnibus-go/omnibus/transports/postgres"
)

// Sizes of BenchmarkInboxIngest.
const (
	ingestMessages   = 100_000
	ingestKeys       = 10_000
	ingestPartitions = 8
	ingestPayload    = 100
	// Every tenth message repeats one sent five messages earlier (a sender's
	// redelivery), so 90k distinct messages arrive in 100k deliveries.
	ingestDupEvery = 10
)

// ingestSet builds the messages of the benchmark, duplicates included.
func ingestSet() []*message.Message {
	body := make([]byte, ingestPayload)
	msgs := make([]*message.Message, ingestMessages)
	for i := range msgs {
		if i%ingestDupEvery == ingestDupEvery-1 {
			msgs[i] = msgs[i-5].Copy()
			continue
		}
		m := message.NewMessage(watermill.NewUUID(), body)
		bus.SetPartitionKey(m, fmt.Sprintf("key-%d", i%ingestKeys))
		bus.SetEventType(m, "bench.event")
		msgs[i] = m
	}
	return msgs
}

// BenchmarkInboxIngest consumes 100k messages (90k distinct, 10k repeats)
// from Kafka into the inbox with a processors.InboxIngest in its default
// configuration (batches of up to 100, 4 writers, 2 ms wait), and inserts the
// same 100k messages with the floor: raw INSERT … SELECT unnest(…) ON
// CONFLICT (message_id, consumer_group) DO NOTHING statements of 100 rows on
// 4 connections, arrays prepared before the clock starts. The floor runs
// before and after the ingest, on tables of its own; its rate is both runs'
// messages over both runs' time.
//
// Metrics: ingest-msg/s (first delivery to the 100,000th broker ack),
// floor-msg/s, ingest/floor-% (issue 26: ≥ 90 %), each the median of
// rounds.N rounds per iteration.
func BenchmarkInboxIngest(b *testing.B) {
	var m rounds.Medians
	for range b.N * rounds.N {
		b.StopTimer()
		tr := &insertTracer{}
		pool := pgbench.NewPool(b, 20, tr)
		brokers := testenv.Kafka(b)
		topic := testenv.KafkaTopic(b, brokers, ingestPartitions)
		msgs := ingestSet()
		publish(b, brokers, topic, msgs)
		floorA := pgbench.NewTable(b, pool, postgres.KindInbox, "ingest_floor_a")
		floorB := pgbench.NewTable(b, pool, postgres.KindInbox, "ingest_floor_b")
		ingestT := pgbench.NewTable(b, pool, postgres.KindInbox, "ingest")
		pgbench.Vacuum(b, pool, floorA, floorB, ingestT)
		_ = tr.take()
		b.StartTimer()

		// The floor runs before and after the ingest and counts as both
		// together (all its messages over all its time), so a load that
		// drifts during the run (a shared machine) favours neither side.
		floorCPU := pgbench.ReadCPU()
		before := floorIngest(b, pool, floorA, msgs)
		floorCost := floorCPU.PerEvent(ingestMessages)
		floorStmts := tr.take()
		ingestCPU := pgbench.ReadCPU()
		ingest, elapsed := runIngest(b, pool, brokers, topic, ingestT)
		ingestCost := ingestCPU.PerEvent(ingestMessages)
		ingestStmts := tr.take()
		after := floorIngest(b, pool, floorB, msgs)
		b.StopTimer()
		floor := 2 / (1/before + 1/after)

		want := ingestMessages - ingestMessages/ingestDupEvery
		for _, t := range []pgbench.Table{floorA, floorB, ingestT} {
			if n := pgbench.Count(b, pool, `SELECT count(*) FROM `+t.Quoted); n != want {
				b.Fatalf("%s holds %d rows, want %d", t.Name, n, want)
			}
		}
		b.Logf("ingest: %d messages in %s (%.0f/s; %s); floor: %.0f/s before, %.0f/s after (%s); %s",
			ingestMessages, elapsed.Round(time.Millisecond), ingest, ingestStmts, before, after, floorStmts, pgbench.LoadAvg(1))
		// The ingest's CPU includes the in-process Kafka broker (kfake)
		// serving its fetches; the floor's arrays are built before its clock.
		b.Logf("ingest (this process includes the Kafka broker): %s; floor before it: %s", ingestCost, floorCost)
		m.Add("ingest-msg/s", ingest)
		m.Add("floor-msg/s", floor)
		m.Add("ingest/floor-%", 100*ingest/floor)
		pgbench.Drop(b, pool, floorA, floorB, ingestT)
		pool.Reset() // a round's connections close with it
	}
	m.Report(b)
}

// publish writes msgs to topic from 16 goroutines, 500 per call.
func publish(b *testing.B, brokers []string, topic string, msgs []*message.Message) {
	b.Helper()
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{ConnectionConfig: kafka.ConnectionConfig{Brokers: brokers}}, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = pub.Close() }()
	const perCall = 500
	var (
		next atomic.Int64
		wg   sync.WaitGroup
	)
	for range 16 {
		wg.Go(func() {
			for {
				first := int(next.Add(perCall)) - perCall
				if first >= len(msgs) {
					return
				}
				if err := pub.Publish(topic, msgs[first:min(first+perCall, len(msgs))]...); err != nil {
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

// floorIngest inserts msgs into t the raw way and returns messages per second.
func floorIngest(b *testing.B, pool *pgxpool.Pool, t pgbench.Table, msgs []*message.Message) float64 {
	b.Helper()
	const batch, writers = processors.DefaultIngestBatchSize, processors.DefaultIngestWriters
	type args struct {
		ids, topics, keys, types []string
		eventIDs                 []uuid.UUID
		payloads, metas          [][]byte
		attempts                 []int32
	}
	var batches []args
	for first := 0; first < len(msgs); first += batch {
		var a args
		for _, m := range msgs[first:min(first+batch, len(msgs))] {
			meta, err := json.Marshal(m.Metadata)
			if err != nil {
				b.Fatal(err)
			}
			a.ids = append(a.ids, m.UUID)
			a.eventIDs = append(a.eventIDs, uuid.MustParse(m.UUID))
			a.topics = append(a.topics, "bench")
			a.keys = append(a.keys, bus.PartitionKey(m))
			a.types = append(a.types, bus.EventType(m))
			a.payloads = append(a.payloads, m.Payload)
			a.metas = append(a.metas, meta)
			a.attempts = append(a.attempts, postgres.DefaultMaxAttempts)
		}
		batches = append(batches, a)
	}
	insert := `
INSERT INTO ` + t.Quoted + ` (message_id, consumer_group, event_id, topic, partition_key, event_type, payload, metadata, max_attempts)
SELECT u.message_id, $1, u.event_id, u.topic, u.partition_key, u.event_type, u.payload, u.metadata, u.max_attempts
FROM unnest($2::text[], $3::uuid[], $4::text[], $5::text[], $6::text[], $7::bytea[], $8::jsonb[], $9::int[])
     AS u(message_id, event_id, topic, partition_key, event_type, payload, metadata, max_attempts)
ON CONFLICT (message_id, consumer_group) DO NOTHING`
	var (
		next atomic.Int64
		wg   sync.WaitGroup
	)
	start := time.Now()
	for range writers {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= len(batches) {
					return
				}
				a := batches[i]
				if _, err := pool.Exec(context.Background(), insert, "bench",
					a.ids, a.eventIDs, a.topics, a.keys, a.types, a.payloads, a.metas, a.attempts); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if b.Failed() {
		b.FailNow()
	}
	return pgbench.PerSecond(len(msgs), elapsed)
}

// acking counts the broker acks of a subscriber's messages.
type acking struct {
	message.Subscriber
	c *pgbench.Countdown
}

func (a acking) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	in, err := a.Subscriber.Subscribe(ctx, topic)
	if err != nil {
		return nil, err
	}
	out := make(chan *message.Message)
	go func() {
		defer close(out)
		for m := range in {
			a.c.Start()
			go func() {
				select {
				case <-m.Acked():
					a.c.Hit()
				case <-m.Nacked():
				case <-ctx.Done():
				}
			}()
			select {
			case out <- m:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out, nil
}

// runIngest consumes topic into t with an InboxIngest and returns messages
// per second from the first delivery to the last ack.
func runIngest(b *testing.B, pool *pgxpool.Pool, brokers []string, topic string, t pgbench.Table) (float64, time.Duration) {
	b.Helper()
	sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{
		ConnectionConfig:  kafka.ConnectionConfig{Brokers: brokers},
		ConsumerGroup:     "g_" + testenv.Name(b),
		HeartbeatInterval: 100 * time.Millisecond,
		Tune: func(c *sarama.Config) {
			c.Consumer.Group.Rebalance.Retry.Backoff = 100 * time.Millisecond
		},
	}, nil)
	if err != nil {
		b.Fatal(err)
	}
	c := pgbench.NewCountdown(ingestMessages)
	g, err := processors.NewInboxIngest(pool, processors.InboxIngestConfig{
		Subscriber: acking{Subscriber: sub, c: c}, Topic: topic, ConsumerGroup: "bench",
		Inbox: postgres.InboxConfig{Table: t.Name},
	}, nil)
	if err != nil {
		b.Fatal(err)
	}
	r := start(g)
	end := c.Wait(b, 5*time.Minute)
	elapsed := end.Sub(c.First())
	r.stop(b)
	return pgbench.PerSecond(ingestMessages, elapsed), elapsed
}
