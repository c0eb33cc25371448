// Command complete-worker is one service that runs every part of omnibus on
// one Watermill router: the outbox relay (its outbox → the broker), the inbox
// ingest (the broker → its inbox), the dispatcher (its inbox → typed
// handlers) and a plain Watermill handler of its own (an audit log reading
// the broker as a second consumer group, made exactly-once in effect by
// middleware.Dedup). It places a few orders, waits until
// each was confirmed by the dispatcher and seen by the audit log, then shuts
// down gracefully, as it does on SIGINT or SIGTERM.
//
//	go run ./examples/complete-worker                    # memory broker
//	OMNIBUS_BROKER=redis go run ./examples/complete-worker
//
// PostgreSQL comes from OMNIBUS_POSTGRES_URL (default: a local server); the
// broker from OMNIBUS_BROKER and its keys (docs/configuration.md). When done
// it drops its tables and deletes its Redis streams, unless -keep.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/examples/internal/example"
	"github.com/omnibus-go/omnibus/middleware"
	"github.com/omnibus-go/omnibus/processors"
	_ "github.com/omnibus-go/omnibus/transports/all"
	"github.com/omnibus-go/omnibus/transports/postgres"
	"github.com/omnibus-go/omnibus/transports/redis"
)

const (
	ordersTable = "complete_worker_orders"
	auditTable  = "complete_worker_audit"
	auditGroup  = "complete-worker-audit"
)

type orderPlaced struct {
	Order string `json:"order"`
	Total int    `json:"total"`
}

// SIGINT and SIGTERM end run's context (example.Main); everything below stops
// gracefully from it.
func main() { example.Main("complete-worker", 60*time.Second, run) }

func run(ctx context.Context) error {
	cfg, err := example.Config(configure)
	if err != nil {
		return err
	}
	b, err := omnibus.Open(ctx, cfg)
	if err != nil {
		return err
	}
	defer b.Close()
	if err := reset(ctx, b); err != nil {
		return err
	}
	// After the router and the ingest are closed, before the Bus.
	done := example.TidyWhenDone("the example's tables complete_worker_*", func(ctx context.Context) error {
		return errors.Join(
			example.BrokerTopic(ctx, cfg, "orders"),
			example.DropTables(ctx, b.Pool(), []string{cfg.Outbox.Table, cfg.Inbox.Table, cfg.Postgres.QueueTable}, ordersTable, auditTable),
		)
	})
	defer done()
	fmt.Printf("complete-worker: broker %s, topic orders\n", b.BrokerName())

	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	if err != nil {
		return err
	}

	// 1. Relay: outbox rows → the broker, in order per key.
	relay, err := b.NewRelay()
	if err != nil {
		return err
	}
	relay.AddTo(router)

	// 2. Ingest: the broker's "orders" topic → the inbox, deduplicated.
	ingest, err := b.NewIngest("orders")
	if err != nil {
		return err
	}
	defer ingest.Close() // after the router has stopped
	ingest.AddTo(router)

	// 3. Dispatcher: inbox rows → typed handlers; this one confirms the order
	// in the transaction that completes the inbox row (exactly-once effect).
	dcfg := b.DispatcherConfig()
	dcfg.Transactional = true
	disp, err := processors.NewDispatcher(b.Pool(), dcfg, nil)
	if err != nil {
		return err
	}
	processors.Handle(disp, "order.placed", func(ctx context.Context, ev orderPlaced, _ *message.Message) error {
		tx, _ := postgres.TxFromContext(ctx)
		_, err := tx.Exec(ctx, `UPDATE `+ordersTable+` SET status = 'confirmed' WHERE id = $1`, ev.Order)
		return err
	})
	disp.AddTo(router)

	// 4. A handler of our own: an audit log, reading the same topic as a
	// second consumer group. middleware.Dedup makes its effect happen once
	// per message however often the broker delivers it: the audit row is
	// written in the transaction that records the message id in the inbox
	// table (as a completed row of the audit group).
	auditSub, err := b.Subscriber(auditGroup)
	if err != nil {
		return err
	}
	deduper, err := postgres.NewDeduper(b.Pool(), b.Inbox(), auditGroup)
	if err != nil {
		return err
	}
	dedup, err := middleware.NewDedup(deduper, nil)
	if err != nil {
		return err
	}
	audit := router.AddNoPublisherHandler("audit-log", "orders", auditSub, func(msg *message.Message) error {
		tx, _ := postgres.TxFromContext(msg.Context())
		_, err := tx.Exec(msg.Context(), `INSERT INTO `+auditTable+` (event_id, order_id) VALUES ($1, $2)`,
			bus.EventID(msg), bus.PartitionKey(msg))
		return err
	})
	audit.AddMiddleware(dedup.Middleware)

	routerDone := make(chan error, 1)
	go func() { routerDone <- router.Run(ctx) }()
	<-router.Running()

	// The service's own work: each order and its event in one transaction.
	orders := []string{"order-1", "order-2", "order-3"}
	for i, id := range orders {
		payload, _ := json.Marshal(orderPlaced{Order: id, Total: 100 * (i + 1)})
		msg := message.NewMessage(watermill.NewUUID(), payload)
		bus.SetPartitionKey(msg, id)
		bus.SetEventType(msg, "order.placed")
		err := pgx.BeginFunc(ctx, b.Pool(), func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO `+ordersTable+` (id, status) VALUES ($1, 'placed')`, id); err != nil {
				return err
			}
			return b.Outbox().Enqueue(ctx, tx, "orders", msg)
		})
		if err != nil {
			return err
		}
	}
	fmt.Printf("placed %d orders\n", len(orders))

	// Wait until every order is confirmed and audited (or a signal arrives).
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for done := false; !done; {
		select {
		case <-ctx.Done():
			done = true
		case <-tick.C:
			var confirmed int
			if err := b.Pool().QueryRow(ctx, `SELECT count(*) FROM `+ordersTable+` WHERE status = 'confirmed'`).Scan(&confirmed); err != nil {
				return err
			}
			var audited int
			if err := b.Pool().QueryRow(ctx, `SELECT count(*) FROM `+auditTable).Scan(&audited); err != nil {
				return err
			}
			done = confirmed == len(orders) && audited == len(orders)
		}
	}

	// Graceful shutdown: the router stops its handlers, waits for in-flight
	// messages and closes the subscribers (releasing leased rows).
	if err := router.Close(); err != nil {
		return err
	}
	if err := <-routerDone; err != nil {
		return err
	}
	if err := ctx.Err(); err != nil && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("not finished in time: %w", err)
	}

	var confirmed []string
	rows, err := b.Pool().Query(context.Background(), `SELECT id FROM `+ordersTable+` WHERE status = 'confirmed' ORDER BY id`)
	if err != nil {
		return err
	}
	if confirmed, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		return err
	}
	rows, err = b.Pool().Query(context.Background(), `SELECT order_id FROM `+auditTable+` ORDER BY order_id`)
	if err != nil {
		return err
	}
	audited, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	fmt.Printf("confirmed by the dispatcher: %s\n", strings.Join(confirmed, ", "))
	fmt.Printf("seen by the audit log: %s\n", strings.Join(audited, ", "))
	fmt.Println("shut down gracefully")
	return nil
}

// configure gives the example tables of its own. The audit log's consumer
// group is added to the postgres broker's queue groups (other brokers need
// nothing: groups appear when they subscribe).
func configure(cfg *bus.Config) {
	cfg.Outbox.Table = "complete_worker_outbox"
	cfg.Inbox.Table = "complete_worker_inbox"
	cfg.Inbox.ConsumerGroup = "complete-worker"
	cfg.Postgres.QueueTable = "complete_worker_queue"
	cfg.Postgres.QueueGroups = []string{cfg.Inbox.ConsumerGroup, auditGroup}
	cfg.Relay.PollInterval = 200 * time.Millisecond
	// Redis and Kafka keep messages between runs: a stream prefix per run
	// keeps this run's topic empty.
	if r := redis.Section(*cfg); r.StreamPrefix == "" {
		r.StreamPrefix = example.Unique("complete-worker:") + ":"
		redis.SetSection(cfg, r)
	}
}

// reset recreates the example's tables, so every run starts clean.
func reset(ctx context.Context, b *omnibus.Bus) error {
	cfg := b.Config()
	if err := example.DropTables(ctx, b.Pool(), []string{cfg.Outbox.Table, cfg.Inbox.Table}, ordersTable, auditTable); err != nil {
		return err
	}
	_, err := b.Pool().Exec(ctx, `CREATE TABLE `+ordersTable+` (id text PRIMARY KEY, status text NOT NULL);
		CREATE TABLE `+auditTable+` (event_id text NOT NULL, order_id text NOT NULL)`)
	if err != nil {
		return fmt.Errorf("create the example's tables: %w", err)
	}
	return b.Migrate(ctx)
}
