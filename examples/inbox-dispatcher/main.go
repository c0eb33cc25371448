// Command inbox-dispatcher shows the receiving side: messages arrive on a
// Redis stream (one of them three times, as brokers redeliver), an
// InboxIngest stores each once in the PostgreSQL inbox and acks the stream
// entry only after the insert committed, and a Dispatcher hands the stored
// messages to typed handlers, in order per order id, inside the transaction
// that completes their row — so each ledger entry is written exactly once,
// even though the first attempt of one of them fails. A message of an
// unknown type and one whose payload is not JSON fail at once, with the
// reason on their row.
//
//	go run ./examples/inbox-dispatcher [-keep]
//
// PostgreSQL comes from OMNIBUS_POSTGRES_URL (default
// postgres://postgres@127.0.0.1:5432/postgres), Redis from
// OMNIBUS_REDIS_ADDR (default 127.0.0.1:6379). It drops its schema and
// deletes its streams when done, unless -keep.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/examples/internal/example"
	"github.com/omnibus-go/omnibus/middleware"
	"github.com/omnibus-go/omnibus/processors"
	"github.com/omnibus-go/omnibus/transports/postgres"
	"github.com/omnibus-go/omnibus/transports/redis"
)

const (
	schema     = "omnibus_example_inbox"
	inboxTable = schema + ".inbox"
	topic      = "orders"
	group      = "billing"
)

type orderEvent struct {
	OrderID string `json:"order_id"`
	Amount  int    `json:"amount"`
}

func main() { example.Main("inbox-dispatcher", 30*time.Second, run) }

func run(ctx context.Context) error {
	// Handler failures are part of the show and printed below; the
	// processors' own logs would repeat them.
	var log *slog.Logger

	pool, err := example.Postgres(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	rdb, err := example.Redis(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = rdb.Close() }()
	prefix := example.Unique("omnibus:example:") + ":" // streams of this run's own

	// A clean slate each run, so the output is the same every time, and
	// nothing left behind when done (unless -keep).
	done, err := example.Tidy(ctx, "the example's schema "+schema+" and streams "+prefix+"*", func(ctx context.Context) error {
		return errors.Join(example.DropSchema(ctx, pool, schema), example.DropStreams(ctx, rdb, prefix+topic))
	})
	if err != nil {
		return err
	}
	defer done()
	if err := postgres.Migrate(ctx, pool, postgres.InboxTable(inboxTable)); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE `+schema+`.ledger (order_id text, entry text, amount int)`); err != nil {
		return err
	}

	// The sender: events of three orders, one event delivered three times,
	// one of a type nobody handles and one that is not JSON.
	pub, err := redis.NewPublisher(redis.PublisherConfig{Client: rdb, StreamPrefix: prefix}, log)
	if err != nil {
		return err
	}
	defer func() { _ = pub.Close() }()
	var sent []*message.Message
	event := func(typ, order string, payload []byte) *message.Message {
		m := message.NewMessage(watermill.NewUUID(), payload)
		bus.SetEventType(m, typ)
		bus.SetPartitionKey(m, order)
		sent = append(sent, m)
		return m
	}
	typed := func(typ, order string, amount int) *message.Message {
		p, _ := json.Marshal(orderEvent{OrderID: order, Amount: amount})
		return event(typ, order, p)
	}
	for _, o := range []struct {
		id     string
		amount int
	}{{"order-1", 40}, {"order-2", 15}, {"order-3", 99}} {
		if err := pub.Publish(topic, typed("order.created", o.id, o.amount), typed("order.paid", o.id, o.amount)); err != nil {
			return err
		}
	}
	dup := typed("order.shipped", "order-1", 40)
	for range 3 {
		if err := pub.Publish(topic, dup.Copy()); err != nil {
			return err
		}
	}
	if err := pub.Publish(topic, typed("order.refunded", "order-2", 15), event("order.paid", "order-4", []byte("{not json"))); err != nil {
		return err
	}
	fmt.Printf("published %d stream entries (%d distinct events)\n", len(sent)+2, len(sent))

	// The receiver: ingest (Redis → inbox) and dispatcher (inbox → handlers).
	sub, err := redis.NewSubscriber(redis.SubscriberConfig{
		Client: rdb, StreamPrefix: prefix, ConsumerGroup: group, BlockTime: 100 * time.Millisecond,
	}, log)
	if err != nil {
		return err
	}
	ingest, err := processors.NewInboxIngest(pool, processors.InboxIngestConfig{
		Subscriber: sub, Topic: topic, ConsumerGroup: group,
		Inbox: postgres.InboxConfig{Table: inboxTable},
	}, log)
	if err != nil {
		return err
	}
	dispatcher, err := processors.NewDispatcher(pool, processors.DispatcherConfig{
		Subscriber:    postgres.SubscriberConfig{Table: inboxTable, ConsumerGroup: group, PollInterval: 50 * time.Millisecond},
		Transactional: true,
		Retry:         middleware.RetryConfig{Base: 200 * time.Millisecond},
	}, log)
	if err != nil {
		return err
	}
	var (
		mu       sync.Mutex
		attempts = map[string]int{}
	)
	ledger := func(entry string) func(context.Context, orderEvent, *message.Message) error {
		return func(ctx context.Context, ev orderEvent, msg *message.Message) error {
			mu.Lock()
			attempts[msg.UUID]++
			n := attempts[msg.UUID]
			mu.Unlock()
			tx, _ := postgres.TxFromContext(ctx)
			if _, err := tx.Exec(ctx, `INSERT INTO `+schema+`.ledger VALUES ($1, $2, $3)`, ev.OrderID, entry, ev.Amount); err != nil {
				return err
			}
			if ev.OrderID == "order-3" && entry == "charge" && n == 1 {
				// The write above is rolled back with the failed attempt.
				fmt.Printf("handle  %-8s %-15s attempt %d: card processor timed out (will retry)\n", ev.OrderID, bus.EventType(msg), n)
				return errors.New("card processor timed out")
			}
			fmt.Printf("handle  %-8s %-15s attempt %d: ledger %s %d\n", ev.OrderID, bus.EventType(msg), n, entry, ev.Amount)
			return nil
		}
	}
	processors.Handle(dispatcher, "order.created", ledger("open"))
	processors.Handle(dispatcher, "order.paid", ledger("charge"))
	processors.Handle(dispatcher, "order.shipped", ledger("close"))

	running := example.Start(ctx, ingest, dispatcher)
	defer running.Stop()

	// Wait until every distinct event is settled in the inbox.
	for {
		var settled int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+inboxTable+` WHERE status <> 'pending'`).Scan(&settled); err != nil {
			return err
		}
		if settled == len(sent) {
			break
		}
		select {
		case <-running.Failed():
			return running.Stop()
		case <-ctx.Done():
			return fmt.Errorf("only %d of %d events settled: %w", settled, len(sent), ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
	if err := running.Stop(); err != nil {
		return err
	}

	fmt.Println("\ninbox rows (one per distinct event, though the broker delivered one of them three times):")
	rows, err := pool.Query(ctx, `SELECT partition_key, event_type, status, attempts, coalesce(last_error, '')
		FROM `+inboxTable+` ORDER BY partition_key, id`)
	if err != nil {
		return err
	}
	for rows.Next() {
		var key, typ, status, lastErr string
		var att int
		if err := rows.Scan(&key, &typ, &status, &att, &lastErr); err != nil {
			return err
		}
		fmt.Printf("  %-8s %-15s %-9s attempts=%d %s\n", key, typ, status, att, lastErr)
	}
	if err := rows.Err(); err != nil {
		return err
	}
	var entries int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+schema+`.ledger`).Scan(&entries); err != nil {
		return err
	}
	fmt.Printf("ledger: %d entries, exactly one per handled event (the failed attempt's entry was rolled back)\n", entries)
	return nil
}
