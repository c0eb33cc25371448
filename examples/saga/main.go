// Command saga runs an order → payment → shipping saga across two services
// that talk only through Kafka (an in-process kfake cluster here), each with
// its own outbox and inbox in PostgreSQL:
//
//   - orders places an order (order row + order.placed, one transaction);
//   - payments charges it and answers payment.captured or payment.declined;
//   - orders ships a paid order, or, when shipping fails, compensates: it
//     asks for a refund (order.refund_requested), payments refunds
//     (payment.refunded) and orders cancels the order.
//
// Every handler runs in the transaction that completes its inbox row, and
// writes its business change and its next event (to its outbox) in that same
// transaction: a step happens exactly once however often Kafka delivers its
// trigger. Each event carries the saga's correlation id and the id of the
// event that caused it (bus.CausedBy); the program prints each saga's chain.
//
//	go run ./examples/saga [-keep]
//
// PostgreSQL comes from OMNIBUS_POSTGRES_URL (default
// postgres://postgres@127.0.0.1:5432/postgres). It drops its schema when
// done, unless -keep.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/examples/internal/example"
	"github.com/omnibus-go/omnibus/processors"
	"github.com/omnibus-go/omnibus/transports/kafka"
	"github.com/omnibus-go/omnibus/transports/postgres"
)

const (
	schema        = "omnibus_example_saga"
	ordersTopic   = "orders"   // events of the orders service
	paymentsTopic = "payments" // events of the payments service
)

// orderEvent is the payload of every event of the saga.
type orderEvent struct {
	OrderID string `json:"order_id"`
	Amount  int    `json:"amount"`
	Address string `json:"address,omitempty"`
	Reason  string `json:"reason,omitempty"`
}

func main() { example.Main("saga", 30*time.Second, run) }

func run(ctx context.Context) error {
	pool, err := example.Postgres(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()

	// A clean slate each run, so the output is the same every time, and
	// nothing left behind when done (unless -keep).
	done, err := example.Tidy(ctx, "the example's schema "+schema, func(ctx context.Context) error {
		return example.DropSchema(ctx, pool, schema)
	})
	if err != nil {
		return err
	}
	defer done()
	if err := postgres.Migrate(ctx, pool,
		postgres.OutboxTable(schema+".orders_outbox"), postgres.InboxTable(schema+".orders_inbox"),
		postgres.OutboxTable(schema+".payments_outbox"), postgres.InboxTable(schema+".payments_inbox"),
	); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, `
		CREATE TABLE `+schema+`.orders (id text PRIMARY KEY, amount int NOT NULL, address text NOT NULL, status text NOT NULL);
		CREATE TABLE `+schema+`.shipments (order_id text PRIMARY KEY, address text NOT NULL);
		CREATE TABLE `+schema+`.payments (order_id text PRIMARY KEY, amount int NOT NULL, status text NOT NULL)`); err != nil {
		return err
	}

	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, ordersTopic, paymentsTopic),
		kfake.GroupMinSessionTimeout(time.Second))
	if err != nil {
		return fmt.Errorf("start in-process Kafka: %w", err)
	}
	defer cluster.Close()
	brokers := cluster.ListenAddrs()

	trace := &tracer{}
	orders, err := newService(pool, brokers, "orders", ordersTopic, paymentsTopic, trace)
	if err != nil {
		return err
	}
	payments, err := newService(pool, brokers, "payments", paymentsTopic, ordersTopic, trace)
	if err != nil {
		return err
	}
	defer orders.close()
	defer payments.close()
	registerOrders(orders)
	registerPayments(payments)

	running := example.Start(ctx, append(orders.runners(), payments.runners()...)...)
	defer running.Stop()

	// Three customers: one happy path, one declined card, one address the
	// carrier rejects (paid, then refunded: the compensation).
	for _, o := range []orderEvent{
		{OrderID: "order-1", Amount: 40, Address: "1 Main St"},
		{OrderID: "order-2", Amount: 900, Address: "2 High St"},
		{OrderID: "order-3", Amount: 70, Address: "Atlantis"},
	} {
		if err := orders.placeOrder(ctx, o); err != nil {
			return err
		}
	}

	// Wait for every order to reach a final state.
	for {
		var open int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+schema+`.orders
			WHERE status NOT IN ('shipped', 'rejected', 'cancelled')`).Scan(&open); err != nil {
			return err
		}
		if open == 0 {
			break
		}
		select {
		case <-running.Failed():
			return running.Stop()
		case <-ctx.Done():
			return fmt.Errorf("%d orders still open: %w", open, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
	if err := running.Stop(); err != nil {
		return err
	}

	trace.print()
	fmt.Println("final state:")
	rows, err := pool.Query(ctx, `SELECT o.id, o.status, coalesce(p.status, '-'), (s.order_id IS NOT NULL)
		FROM `+schema+`.orders o LEFT JOIN `+schema+`.payments p ON p.order_id = o.id
		LEFT JOIN `+schema+`.shipments s ON s.order_id = o.id ORDER BY o.id`)
	if err != nil {
		return err
	}
	for rows.Next() {
		var id, status, payment string
		var shipped bool
		if err := rows.Scan(&id, &status, &payment, &shipped); err != nil {
			return err
		}
		fmt.Printf("  %s: order %-9s payment %-8s shipment %v\n", id, status, payment, shipped)
	}
	return rows.Err()
}

// service is one side of the saga: its outbox relayed to Kafka, its inbox
// filled from the other side's topic, and a dispatcher over that inbox.
type service struct {
	name       string
	pool       *pgxpool.Pool
	topic      string // where its events go
	outbox     *postgres.Outbox
	publisher  *kafka.Publisher
	relay      *processors.OutboxRelay
	ingest     *processors.InboxIngest
	dispatcher *processors.Dispatcher
	trace      *tracer
}

func newService(pool *pgxpool.Pool, brokers []string, name, ownTopic, otherTopic string, trace *tracer) (*service, error) {
	s := &service{name: name, pool: pool, topic: ownTopic, trace: trace}
	outboxTable, inboxTable := schema+"."+name+"_outbox", schema+"."+name+"_inbox"
	var err error
	if s.outbox, err = postgres.NewOutbox(postgres.OutboxConfig{Table: outboxTable}); err != nil {
		return nil, err
	}
	if s.publisher, err = kafka.NewPublisher(kafka.PublisherConfig{ConnectionConfig: kafka.ConnectionConfig{Brokers: brokers, ClientID: name}}, nil); err != nil {
		return nil, err
	}
	if s.relay, err = processors.NewOutboxRelay(pool, processors.OutboxRelayConfig{
		Publisher:   s.publisher,
		Subscriber:  postgres.SubscriberConfig{Table: outboxTable, PollInterval: 100 * time.Millisecond},
		HandlerName: name + "_relay",
	}, nil); err != nil {
		return nil, err
	}
	sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{
		ConnectionConfig: kafka.ConnectionConfig{Brokers: brokers, ClientID: name},
		ConsumerGroup:    name,
		SessionTimeout:   6 * time.Second, HeartbeatInterval: 100 * time.Millisecond,
		CommitInterval: 100 * time.Millisecond,
		Tune: func(c *sarama.Config) {
			c.Consumer.Group.Rebalance.Retry.Backoff = 100 * time.Millisecond
			c.Consumer.MaxWaitTime = 100 * time.Millisecond
		},
	}, nil)
	if err != nil {
		return nil, err
	}
	if s.ingest, err = processors.NewInboxIngest(pool, processors.InboxIngestConfig{
		Subscriber: sub, Topic: otherTopic, ConsumerGroup: name,
		Inbox: postgres.InboxConfig{Table: inboxTable}, HandlerName: name + "_ingest",
	}, nil); err != nil {
		return nil, err
	}
	if s.dispatcher, err = processors.NewDispatcher(pool, processors.DispatcherConfig{
		Subscriber:    postgres.SubscriberConfig{Table: inboxTable, ConsumerGroup: name, PollInterval: 100 * time.Millisecond},
		Transactional: true,
		UnknownType:   processors.UnknownSkip, // each service listens only to the events it cares about
		HandlerName:   name + "_dispatcher",
	}, nil); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *service) runners() []example.Runner {
	return []example.Runner{s.relay, s.ingest, s.dispatcher}
}

func (s *service) close() { _ = s.publisher.Close() }

// emit writes the next event of the saga to the service's outbox, inside the
// handler's transaction, caused by cause.
func (s *service) emit(ctx context.Context, cause *message.Message, eventType string, ev orderEvent) error {
	tx, ok := postgres.TxFromContext(ctx)
	if !ok {
		return bus.Permanent(errors.New("handler runs without a transaction"))
	}
	out := newEvent(eventType, ev)
	bus.CausedBy(out, cause)
	s.trace.add(s.name, cause, out)
	return s.outbox.Enqueue(ctx, tx, s.topic, out)
}

func newEvent(eventType string, ev orderEvent) *message.Message {
	payload, _ := json.Marshal(ev)
	m := message.NewMessage(watermill.NewUUID(), payload)
	bus.SetEventType(m, eventType)
	bus.SetPartitionKey(m, ev.OrderID)
	return m
}

// placeOrder is the saga's first step: the order and its event commit together.
func (s *service) placeOrder(ctx context.Context, o orderEvent) error {
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO `+schema+`.orders VALUES ($1, $2, $3, 'placed')`, o.OrderID, o.Amount, o.Address); err != nil {
			return err
		}
		m := newEvent("order.placed", o)
		bus.SetCorrelationID(m, "saga-"+o.OrderID)
		s.trace.add(s.name, nil, m)
		return s.outbox.Enqueue(ctx, tx, s.topic, m)
	})
}

func registerOrders(s *service) {
	setStatus := func(ctx context.Context, id, status string) error {
		tx, _ := postgres.TxFromContext(ctx)
		_, err := tx.Exec(ctx, `UPDATE `+schema+`.orders SET status = $2 WHERE id = $1`, id, status)
		return err
	}
	processors.Handle(s.dispatcher, "payment.captured", func(ctx context.Context, ev orderEvent, msg *message.Message) error {
		tx, _ := postgres.TxFromContext(ctx)
		var address string
		if err := tx.QueryRow(ctx, `SELECT address FROM `+schema+`.orders WHERE id = $1`, ev.OrderID).Scan(&address); err != nil {
			return err
		}
		if address == "Atlantis" {
			// Shipping failed: compensate the payment.
			if err := setStatus(ctx, ev.OrderID, "cancelling"); err != nil {
				return err
			}
			ev.Reason = "carrier does not deliver to " + address
			return s.emit(ctx, msg, "order.refund_requested", ev)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO `+schema+`.shipments VALUES ($1, $2)`, ev.OrderID, address); err != nil {
			return err
		}
		if err := setStatus(ctx, ev.OrderID, "shipped"); err != nil {
			return err
		}
		if err := s.emit(ctx, msg, "order.shipped", ev); err != nil {
			return err
		}
		s.trace.end(s.name, msg, "order shipped to "+address)
		return nil
	})
	processors.Handle(s.dispatcher, "payment.declined", func(ctx context.Context, ev orderEvent, msg *message.Message) error {
		s.trace.end(s.name, msg, "order rejected: "+ev.Reason)
		return setStatus(ctx, ev.OrderID, "rejected")
	})
	processors.Handle(s.dispatcher, "payment.refunded", func(ctx context.Context, ev orderEvent, msg *message.Message) error {
		s.trace.end(s.name, msg, "order cancelled: "+ev.Reason)
		return setStatus(ctx, ev.OrderID, "cancelled")
	})
}

func registerPayments(s *service) {
	processors.Handle(s.dispatcher, "order.placed", func(ctx context.Context, ev orderEvent, msg *message.Message) error {
		tx, _ := postgres.TxFromContext(ctx)
		if ev.Amount > 500 {
			if _, err := tx.Exec(ctx, `INSERT INTO `+schema+`.payments VALUES ($1, $2, 'declined')`, ev.OrderID, ev.Amount); err != nil {
				return err
			}
			ev.Reason = "over the card limit"
			return s.emit(ctx, msg, "payment.declined", ev)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO `+schema+`.payments VALUES ($1, $2, 'captured')`, ev.OrderID, ev.Amount); err != nil {
			return err
		}
		return s.emit(ctx, msg, "payment.captured", ev)
	})
	processors.Handle(s.dispatcher, "order.refund_requested", func(ctx context.Context, ev orderEvent, msg *message.Message) error {
		tx, _ := postgres.TxFromContext(ctx)
		if _, err := tx.Exec(ctx, `UPDATE `+schema+`.payments SET status = 'refunded' WHERE order_id = $1`, ev.OrderID); err != nil {
			return err
		}
		return s.emit(ctx, msg, "payment.refunded", ev)
	})
}

// tracer records who emitted which event because of which.
type tracer struct {
	mu    sync.Mutex
	steps []step
}

type step struct {
	service, correlation, eventType, eventID, causedBy, causeType string
	note                                                          string // a final step: what happened
}

// end records the last step of a saga: msg handled, nothing emitted.
func (t *tracer) end(service string, msg *message.Message, note string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := step{service: service, correlation: bus.CorrelationID(msg), causedBy: bus.EventID(msg), causeType: bus.EventType(msg), note: note}
	for i, old := range t.steps {
		if old.note != "" && old.causedBy == s.causedBy {
			t.steps[i] = s
			return
		}
	}
	t.steps = append(t.steps, s)
}

func (t *tracer) add(service string, cause, out *message.Message) {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := step{service: service, correlation: bus.CorrelationID(out), eventType: bus.EventType(out), eventID: bus.EventID(out)}
	if cause != nil {
		s.causedBy, s.causeType = bus.CausationID(out), bus.EventType(cause)
	}
	// A handler whose transaction rolled back runs again and emits again;
	// only the attempt that committed counts, and it replaces the other.
	for i, old := range t.steps {
		if cause != nil && old.note == "" && old.causedBy == s.causedBy {
			t.steps[i] = s
			return
		}
	}
	t.steps = append(t.steps, s)
}

func (t *tracer) print() {
	t.mu.Lock()
	defer t.mu.Unlock()
	byCorr := map[string][]step{}
	var corrs []string
	for _, s := range t.steps {
		if _, ok := byCorr[s.correlation]; !ok {
			corrs = append(corrs, s.correlation)
		}
		byCorr[s.correlation] = append(byCorr[s.correlation], s)
	}
	sort.Strings(corrs)
	for _, c := range corrs {
		fmt.Printf("saga %s:\n", c)
		ids := map[string]string{}
		n := 0
		for _, s := range byCorr[c] {
			if s.note != "" {
				fmt.Printf("     %-9s handles %s %s: %s\n", s.service, ids[s.causedBy], s.causeType, s.note)
				continue
			}
			n++
			ids[s.eventID] = fmt.Sprintf("#%d", n)
			cause := "(starts the saga)"
			if s.causedBy != "" {
				cause = fmt.Sprintf("caused by %s %s", ids[s.causedBy], s.causeType)
			}
			fmt.Printf("  #%d %-9s emits %-23s %s\n", n, s.service, s.eventType, cause)
		}
	}
}
