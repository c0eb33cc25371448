package main

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/internal/demo"
	"github.com/omnibus-go/omnibus/processors"
	"github.com/omnibus-go/omnibus/transports/kafka"
	"github.com/omnibus-go/omnibus/transports/postgres"
	"github.com/omnibus-go/omnibus/transports/redis"
)

// demoSteps are the events of an order, in the order they happen.
var demoSteps = []string{"created", "paid", "shipped"}

type demoOptions struct {
	broker     string
	orders     int
	duplicates int
	flakyEvery int
	timeout    time.Duration
	prefix     string
	keep       bool
}

func (a *app) demoCommand() *cobra.Command {
	var o demoOptions
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Run the whole pipeline end to end and print a summary",
		Long: `demo runs omnibus's main job end to end against a reachable PostgreSQL
(postgres.url): it migrates its own tables (<prefix>_outbox, <prefix>_inbox,
<prefix>_orders, recreated on every run), writes orders and their events in
one transaction each, relays the events to the broker (--broker, default
memory; kafka starts an in-process cluster when kafka.brokers is empty),
ingests them into the inbox as consumer group omnibus-demo, has the broker
deliver some of them twice, dispatches them to handlers that apply each event
to its order in the transaction that completes it (some fail once and are
retried), and prints a summary: events written, delivered, deduplicated,
failed, and whether every order saw its events in order. When done it drops
its tables (with their trigger functions and migration records) and, with
broker redis, deletes its streams; --keep leaves them for inspection. A topic
on an external Kafka cluster is left there (it says so).`,
		Args: noArgs,
		RunE: a.runE(func(cmd *cobra.Command, _ []string) error {
			if o.orders < 1 {
				return usagef("--orders must be at least 1, got %d", o.orders)
			}
			if o.duplicates < 0 || o.flakyEvery < 0 {
				return usagef("--duplicates and --flaky-every must not be negative")
			}
			if !identifierLike(o.prefix) {
				return usagef("--table-prefix %q: letters, digits and _ only, not starting with a digit", o.prefix)
			}
			cfg, err := a.loadConfig()
			if err != nil {
				return err
			}
			if o.broker != "" {
				cfg.Broker = o.broker
			}
			return a.demo(cmd.Context(), cfg, o)
		}),
	}
	f := cmd.Flags()
	f.StringVar(&o.broker, "broker", "", "broker to relay through: memory, postgres, kafka or redis (default: the config's broker)")
	f.IntVar(&o.orders, "orders", 20, "orders to write (three events each)")
	f.IntVar(&o.duplicates, "duplicates", 5, "events the broker delivers a second time")
	f.IntVar(&o.flakyEvery, "flaky-every", 5, "every n-th order's payment handler fails once (0: never)")
	f.DurationVar(&o.timeout, "timeout", 60*time.Second, "give up after this long")
	f.StringVar(&o.prefix, "table-prefix", "omnibus_demo", "prefix of the demo's tables")
	f.BoolVar(&o.keep, "keep", false, "keep the demo's tables and streams when done (default: drop them)")
	return cmd
}

func identifierLike(s string) bool {
	if s == "" || len(s) > 40 || (s[0] >= '0' && s[0] <= '9') {
		return false
	}
	for _, r := range s {
		if !(r == '_' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9') {
			return false
		}
	}
	return true
}

type demoEvent struct {
	Order string `json:"order"`
	Step  string `json:"step"`
}

// demoCounters are what the pipeline's middleware and handlers count.
type demoCounters struct {
	received atomic.Int64 // broker messages ingest handled successfully
	retried  atomic.Int64 // handler failures that were retried
}

func (a *app) demo(ctx context.Context, cfg bus.Config, o demoOptions) error {
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()

	// The demo's own tables and names, so it never touches a service's.
	cfg.Outbox.Table = o.prefix + "_outbox"
	cfg.Inbox.Table = o.prefix + "_inbox"
	cfg.Postgres.QueueTable = o.prefix + "_queue"
	cfg.Inbox.ConsumerGroup = "omnibus-demo"
	cfg.Postgres.QueueGroups = []string{cfg.Inbox.ConsumerGroup}
	cfg.Retry = bus.RetryConfig{Base: 100 * time.Millisecond, Cap: time.Second, TransientDelay: 200 * time.Millisecond}
	cfg.Relay.PollInterval = 100 * time.Millisecond
	cfg.Relay.CloseTimeout = 5 * time.Second
	orders, err := demo.NewOrders(o.prefix + "_orders")
	if err != nil {
		return usagef("--table-prefix: %v", err)
	}
	topic := "omnibus_demo_orders_" + randomHex(4)
	kcfg := kafka.Section(cfg)
	externalKafka := cfg.Broker == kafka.Name && len(kcfg.Brokers) > 0
	if cfg.Broker == kafka.Name && len(kcfg.Brokers) == 0 {
		cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.AllowAutoTopicCreation(), kfake.DefaultNumPartitions(4),
			kfake.GroupMinSessionTimeout(time.Second))
		if err != nil {
			return fmt.Errorf("start in-process Kafka: %w", err)
		}
		defer cluster.Close()
		kcfg.Brokers = cluster.ListenAddrs()
		kafka.SetSection(&cfg, kcfg)
		fmt.Fprintf(a.stdout, "started an in-process Kafka cluster (kfake) at %s\n", strings.Join(kcfg.Brokers, ","))
	}

	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return err
	}
	logger := a.logger(cfg)
	if a.logLevel == "" {
		// The summary is the demo's output; --log-level shows the pipeline at work.
		logger = bus.NopLogger()
	}

	pool, err := omnibus.Connect(ctx, cfg)
	if err != nil {
		return fmt.Errorf("%w\nomnibus demo needs a reachable PostgreSQL: start one with `make services` or set postgres.url (OMNIBUS_POSTGRES_URL)", err)
	}
	defer pool.Close()
	if err := resetDemoTables(ctx, pool, cfg, orders); err != nil {
		return err
	}
	// Runs after the Bus and the processors are closed (deferred later), before
	// the pool is.
	defer func() {
		if o.keep {
			fmt.Fprintf(a.stdout, "kept the demo's tables %s_* (--keep)\n", o.prefix)
			return
		}
		// ctx may have run out: the clean-up gets its own time.
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		// DDL can meet a deadlock with other sessions' DDL (another demo, a
		// migration): try again a few times before giving up.
		err := dropDemoTables(cctx, pool, cfg, orders)
		for try := 1; err != nil && try < 5 && bus.ClassOf(postgres.ClassifyError(err)) == bus.ClassTransient; try++ {
			time.Sleep(time.Duration(try) * 100 * time.Millisecond)
			err = dropDemoTables(cctx, pool, cfg, orders)
		}
		if err != nil {
			fmt.Fprintf(a.stderr, "omnibus demo: %v\n", err)
		}
		if cfg.Broker == redis.Name {
			if err := deleteDemoStreams(cctx, cfg, topic); err != nil {
				fmt.Fprintf(a.stderr, "omnibus demo: %v\n", err)
			}
		}
		if externalKafka {
			fmt.Fprintf(a.stdout, "left topic %s and consumer group %s on the Kafka cluster at %s\n",
				topic, cfg.Inbox.ConsumerGroup, strings.Join(kcfg.Brokers, ","))
		}
	}()

	b, err := omnibus.Open(ctx, cfg, omnibus.WithPool(pool), omnibus.WithLogger(logger))
	if err != nil {
		return err
	}
	defer func() { _ = b.Close() }()
	if err := b.Migrate(ctx); err != nil {
		return err
	}
	fmt.Fprintf(a.stdout, "omnibus demo: %d orders, %d events, through the %s broker (topic %s)\n",
		o.orders, o.orders*len(demoSteps), cfg.Broker, topic)

	// 1. The service writes each order change and its event in one transaction.
	written, dupes, err := writeDemoOrders(ctx, b, orders, topic, o)
	if err != nil {
		return err
	}

	// 2. One router runs the relay, the ingest and the dispatcher.
	var counters demoCounters
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: cfg.Relay.CloseTimeout}, bus.WatermillLogger(logger))
	if err != nil {
		return err
	}
	relay, err := b.NewRelay()
	if err != nil {
		return err
	}
	relay.AddTo(router)
	ingest, err := b.NewIngest(topic)
	if err != nil {
		return err
	}
	defer func() { _ = ingest.Close() }()
	ingest.AddTo(router).AddMiddleware(func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			out, err := h(msg)
			if err == nil {
				counters.received.Add(1)
			}
			return out, err
		}
	})
	dcfg := b.DispatcherConfig()
	dcfg.Transactional = true // each effect commits with the completion of its inbox row
	disp, err := processors.NewDispatcher(b.Pool(), dcfg, logger)
	if err != nil {
		return err
	}
	for _, step := range demoSteps {
		processors.Handle(disp, "order."+step, func(ctx context.Context, ev demoEvent, msg *message.Message) error {
			tx, _ := postgres.TxFromContext(ctx)
			if err := orders.AppendHandled(ctx, tx, ev.Order, ev.Step); err != nil {
				return err
			}
			d, _ := bus.DeliveryOf(msg)
			if step == "paid" && o.flakyEvery > 0 && orderNumber(ev.Order)%o.flakyEvery == 0 && d.Attempts == 0 {
				counters.retried.Add(1)
				return fmt.Errorf("payment provider timed out for %s (the demo's injected failure; rolled back, retried)", ev.Order)
			}
			return nil
		})
	}
	disp.AddTo(router)

	runCtx, stopRouter := context.WithCancel(ctx)
	defer stopRouter()
	routerDone := make(chan error, 1)
	go func() { routerDone <- router.Run(runCtx) }()
	select {
	case <-router.Running():
	case err := <-routerDone:
		return fmt.Errorf("router: %w", err)
	}

	// 3. Once everything was relayed, the broker delivers a few events again
	// (as brokers do after a crash or a rebalance); the inbox drops them.
	total := int64(len(written))
	if err := waitFor(ctx, "relay", func() (bool, error) {
		n, err := countCompleted(ctx, pool, postgres.OutboxTable(cfg.Outbox.Table))
		return n >= total, err
	}); err != nil {
		return a.demoFailed(err, stopRouter, routerDone)
	}
	if err := waitFor(ctx, "ingest", func() (bool, error) { return counters.received.Load() >= total, nil }); err != nil {
		return a.demoFailed(err, stopRouter, routerDone)
	}
	if cfg.Broker == bus.BrokerPostgres {
		// The postgres broker stores each event once per group already (its
		// queue is an inbox table), so a second publish never reaches the
		// ingest: nothing to wait for.
		fmt.Fprintf(a.stdout, "the postgres broker absorbs duplicate publishes itself (one queue row per event and group)\n")
		dupes = nil
	}
	for _, m := range dupes {
		if err := b.Publisher().Publish(topic, m); err != nil {
			return a.demoFailed(fmt.Errorf("publish a duplicate: %w", err), stopRouter, routerDone)
		}
	}
	redelivered := int64(len(dupes))
	if dedups, err := b.DeduplicatesPublishes(ctx); err != nil {
		return a.demoFailed(err, stopRouter, routerDone)
	} else if dedups && len(dupes) > 0 {
		// Published again with the same ids, the copies are stored once by
		// the broker: they never reach the ingest.
		fmt.Fprintf(a.stdout, "the %s broker stored the %d duplicate publishes once (same message ids): they never reach the inbox\n", cfg.Broker, len(dupes))
		redelivered = 0
	}
	if err := waitFor(ctx, "dispatch", func() (bool, error) {
		if counters.received.Load() < total+redelivered {
			return false, nil
		}
		n, err := countCompleted(ctx, pool, postgres.InboxTable(cfg.Inbox.Table))
		return n >= total, err
	}); err != nil {
		return a.demoFailed(err, stopRouter, routerDone)
	}
	stopRouter()
	if err := <-routerDone; err != nil {
		return fmt.Errorf("router: %w", err)
	}

	// 4. The summary, from the database.
	s, err := demoSummary(ctx, pool, cfg, orders)
	if err != nil {
		return err
	}
	s.written, s.received, s.retried = total, counters.received.Load(), counters.retried.Load()
	s.print(a.stdout, o.orders)
	fmt.Fprintf(a.stdout, "done in %s\n", time.Since(start).Round(10*time.Millisecond))
	if !s.ok(o.orders) {
		return errors.New("demo: the pipeline did not deliver every event exactly once in order")
	}
	return nil
}

func (a *app) demoFailed(err error, stop context.CancelFunc, done <-chan error) error {
	stop()
	<-done
	return err
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func orderID(i int) string { return fmt.Sprintf("order-%03d", i) }

func orderNumber(id string) int {
	var n int
	_, _ = fmt.Sscanf(id, "order-%d", &n)
	return n
}

// demoTables are the omnibus tables the demo migrates and drops.
func demoTables(cfg bus.Config) []postgres.Table {
	return []postgres.Table{
		postgres.OutboxTable(cfg.Outbox.Table),
		postgres.InboxTable(cfg.Inbox.Table),
		postgres.InboxTable(cfg.Postgres.QueueTable),
	}
}

// resetDemoTables drops what an earlier run left (see dropDemoTables) so
// each run starts clean, and creates the demo's orders table.
func resetDemoTables(ctx context.Context, pool *pgxpool.Pool, cfg bus.Config, orders demo.Orders) error {
	if err := dropDemoTables(ctx, pool, cfg, orders); err != nil {
		return err
	}
	return orders.Create(ctx, pool)
}

// dropDemoTables drops the demo's outbox, inbox and queue tables with their
// lanes tables, trigger functions and migration records (postgres.Drop), and
// its orders table.
func dropDemoTables(ctx context.Context, pool *pgxpool.Pool, cfg bus.Config, orders demo.Orders) error {
	tables := demoTables(cfg)
	if err := postgres.Drop(ctx, pool, tables...); err != nil {
		return fmt.Errorf("drop the demo's tables: %w", err)
	}
	return orders.Drop(ctx, pool)
}

// deleteDemoStreams deletes the demo's Redis stream and its dead-letter
// stream (their consumer groups go with them).
func deleteDemoStreams(ctx context.Context, cfg bus.Config, topic string) error {
	r := redis.Section(cfg)
	opts := &goredis.Options{Addr: r.Addr, Username: r.Username, Password: r.Password, DB: r.DB}
	if r.TLS {
		opts.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	client := goredis.NewClient(opts)
	defer client.Close()
	stream := r.StreamPrefix + topic
	if err := redis.DeleteTopic(ctx, client, stream); err != nil {
		return fmt.Errorf("delete the demo's streams %s at %s: %w", stream, r.Addr, err)
	}
	return nil
}

// writeDemoOrders writes every order's steps, each change with its event in
// one transaction, orders interleaved; it returns the events written and the
// copies the broker will deliver twice.
func writeDemoOrders(ctx context.Context, b *omnibus.Bus, orders demo.Orders, topic string, o demoOptions) (written, dupes []*message.Message, err error) {
	for _, step := range demoSteps {
		for i := 1; i <= o.orders; i++ {
			id := orderID(i)
			payload, _ := json.Marshal(demoEvent{Order: id, Step: step})
			msg := message.NewMessage(watermill.NewUUID(), payload)
			bus.SetPartitionKey(msg, id)
			bus.SetEventType(msg, "order."+step)
			err := pgx.BeginFunc(ctx, b.Pool(), func(tx pgx.Tx) error {
				if err := orders.Upsert(ctx, tx, id, step); err != nil {
					return err
				}
				return b.Outbox().Enqueue(ctx, tx, topic, msg)
			})
			if err != nil {
				return nil, nil, fmt.Errorf("write %s %s: %w", id, step, err)
			}
			written = append(written, msg)
		}
	}
	for i := 0; i < o.duplicates && i < len(written); i++ {
		dupes = append(dupes, written[(i*7)%len(written)].Copy())
	}
	return written, dupes, nil
}

// waitFor polls cond until it holds or ctx ends.
func waitFor(ctx context.Context, what string, cond func() (bool, error)) error {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		ok, err := cond()
		if err != nil {
			return fmt.Errorf("wait for %s: %w", what, err)
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("demo: %s did not finish in time: %w", what, ctx.Err())
		case <-t.C:
		}
	}
}

// countCompleted counts the completed rows of an outbox or inbox table.
func countCompleted(ctx context.Context, pool *pgxpool.Pool, t postgres.Table) (int64, error) {
	adm, err := postgres.NewAdmin(pool, t)
	if err != nil {
		return 0, err
	}
	st, err := adm.Stats(ctx)
	return st.Completed, err
}

type demoResult struct {
	written, received, retried int64
	relayed, outboxFailed      int64
	stored, dispatched         int64
	inboxFailed, effects       int64
	inOrder, outOfOrder        int
	firstBad                   string
}

func demoSummary(ctx context.Context, pool *pgxpool.Pool, cfg bus.Config, orders demo.Orders) (demoResult, error) {
	var s demoResult
	stats := func(t postgres.Table) (postgres.Stats, error) {
		adm, err := postgres.NewAdmin(pool, t)
		if err != nil {
			return postgres.Stats{}, err
		}
		return adm.Stats(ctx)
	}
	out, err := stats(postgres.OutboxTable(cfg.Outbox.Table))
	if err != nil {
		return s, err
	}
	s.relayed, s.outboxFailed = out.Completed, out.Failed
	in, err := stats(postgres.InboxTable(cfg.Inbox.Table))
	if err != nil {
		return s, err
	}
	s.stored, s.dispatched, s.inboxFailed = in.Pending+in.Failed+in.Completed, in.Completed, in.Failed
	ids, handled, err := orders.Handled(ctx, pool)
	if err != nil {
		return s, err
	}
	for i, h := range handled {
		s.effects += int64(len(h))
		if slices.Equal(h, demoSteps) {
			s.inOrder++
		} else {
			s.outOfOrder++
			if s.firstBad == "" {
				s.firstBad = fmt.Sprintf("%s saw %v", ids[i], h)
			}
		}
	}
	return s, nil
}

func (s demoResult) ok(orders int) bool {
	return s.outOfOrder == 0 && s.inOrder == orders && s.outboxFailed == 0 && s.inboxFailed == 0 &&
		s.relayed == s.written && s.stored == s.written && s.dispatched == s.written && s.effects == s.written
}

func (s demoResult) print(w io.Writer, orders int) {
	row := func(label string, v int64) { fmt.Fprintf(w, "  %-32s %6d\n", label, v) }
	fmt.Fprintf(w, "\n  %-32s %6s\n", "stage", "events")
	row("written to the outbox", s.written)
	row("relayed to the broker", s.relayed)
	row("received from the broker", s.received)
	row("deduplicated by the inbox", s.received-s.stored)
	row("stored in the inbox", s.stored)
	row("handled (effects applied once)", s.effects)
	row("retried after a failure", s.retried)
	row("failed", s.outboxFailed+s.inboxFailed)
	order := fmt.Sprintf("verified: %d of %d orders saw %s in order", s.inOrder, orders, strings.Join(demoSteps, " → "))
	if s.outOfOrder > 0 || s.inOrder != orders {
		order = fmt.Sprintf("VIOLATED: %d of %d orders out of order (%s)", s.outOfOrder, orders, s.firstBad)
	}
	fmt.Fprintf(w, "  %-32s %s\n\n", "per-key order", order)
}
