package processors_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/internal/testenv"
	"github.com/omnibus-go/omnibus/middleware"
	"github.com/omnibus-go/omnibus/processors"
	"github.com/omnibus-go/omnibus/transports/kafka"
	"github.com/omnibus-go/omnibus/transports/postgres"
	omniredis "github.com/omnibus-go/omnibus/transports/redis"
)

// --- helpers shared by the inbox and dispatcher tests ---

// newInboxTable migrates a fresh inbox table for the test and drops it after.
func newInboxTable(t *testing.T) (*pgxpool.Pool, *postgres.Inbox) {
	t.Helper()
	pool := testenv.Postgres(t)
	name := testenv.Name(t)
	require.NoError(t, postgres.Migrate(context.Background(), pool, postgres.InboxTable(name)))
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), fmt.Sprintf(`DROP TABLE IF EXISTS %q, %q CASCADE`, name, name+"_lanes"))
	})
	in, err := postgres.NewInbox(postgres.InboxConfig{Table: name})
	require.NoError(t, err)
	return pool, in
}

// effects is a table handlers write their side effects to.
type effects struct {
	pool *pgxpool.Pool
	name string
}

func newEffects(t *testing.T, pool *pgxpool.Pool) effects {
	t.Helper()
	name := testenv.Name(t) + "_fx"
	_, err := pool.Exec(context.Background(), `CREATE TABLE `+pgx.Identifier{name}.Sanitize()+` (event_id text NOT NULL, note text)`)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), `DROP TABLE IF EXISTS `+pgx.Identifier{name}.Sanitize())
	})
	return effects{pool: pool, name: name}
}

func (e effects) write(ctx context.Context, db effectsDB, eventID, note string) error {
	return db.exec(ctx, `INSERT INTO `+pgx.Identifier{e.name}.Sanitize()+` VALUES ($1, $2)`, eventID, note)
}

// effectsDB is a handler's transaction of either stack.
type effectsDB interface {
	exec(ctx context.Context, sql string, args ...any) error
	pid(ctx context.Context, t *testing.T) uint32
}

// pgxEffectsDB is a postgres.DB: a pgx.Tx, pool or connection.
type pgxEffectsDB struct{ db postgres.DB }

func (d pgxEffectsDB) exec(ctx context.Context, sql string, args ...any) error {
	_, err := d.db.Exec(ctx, sql, args...)
	return err
}

func (d pgxEffectsDB) pid(ctx context.Context, t *testing.T) uint32 {
	var pid uint32
	require.NoError(t, d.db.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid))
	return pid
}

// sqlEffectsDB is a database/sql transaction.
type sqlEffectsDB struct{ tx *sql.Tx }

func (d sqlEffectsDB) exec(ctx context.Context, sql string, args ...any) error {
	_, err := d.tx.ExecContext(ctx, sql, args...)
	return err
}

func (d sqlEffectsDB) pid(ctx context.Context, t *testing.T) uint32 {
	var pid uint32
	require.NoError(t, d.tx.QueryRowContext(ctx, `SELECT pg_backend_pid()`).Scan(&pid))
	return pid
}

func (e effects) count(t *testing.T) int {
	t.Helper()
	var n int
	require.NoError(t, e.pool.QueryRow(context.Background(), `SELECT count(*) FROM `+pgx.Identifier{e.name}.Sanitize()).Scan(&n))
	return n
}

// inboxRow is the bookkeeping of one inbox row.
type inboxRow struct {
	status    string
	attempts  int
	lastError *string
}

func rowOf(t *testing.T, pool *pgxpool.Pool, in *postgres.Inbox, group, messageID string) (inboxRow, bool) {
	t.Helper()
	var r inboxRow
	err := pool.QueryRow(context.Background(), `SELECT status, attempts, last_error FROM `+pgx.Identifier{in.Table()}.Sanitize()+
		` WHERE consumer_group = $1 AND message_id = $2`, group, messageID).Scan(&r.status, &r.attempts, &r.lastError)
	if errors.Is(err, pgx.ErrNoRows) {
		return r, false
	}
	require.NoError(t, err)
	return r, true
}

func countRows(t *testing.T, pool *pgxpool.Pool, in *postgres.Inbox, where string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(),
		`SELECT count(*) FROM `+pgx.Identifier{in.Table()}.Sanitize()+` WHERE `+where, args...).Scan(&n))
	return n
}

// startDispatcher runs a dispatcher (built by build, so the test can register
// handlers first) until the test ends.
func startDispatcher(t *testing.T, pool *pgxpool.Pool, cfg processors.DispatcherConfig, register func(d *processors.Dispatcher)) *processors.Dispatcher {
	t.Helper()
	if cfg.Subscriber.PollInterval == 0 {
		cfg.Subscriber.PollInterval = 20 * time.Millisecond
	}
	d, err := processors.NewDispatcher(pool, cfg, nil)
	require.NoError(t, err)
	if register != nil {
		register(d)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		assert.NoError(t, <-done)
	})
	return d
}

func startIngest(t *testing.T, pool *pgxpool.Pool, cfg processors.InboxIngestConfig) *processors.InboxIngest {
	t.Helper()
	g, err := processors.NewInboxIngest(pool, cfg, nil)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		assert.NoError(t, <-done)
	})
	return g
}

// fastRetry retries after tens of milliseconds.
var fastRetry = middleware.RetryConfig{Base: 30 * time.Millisecond, Cap: 100 * time.Millisecond, TransientDelay: 30 * time.Millisecond}

// watched wraps a broker subscriber and counts how its messages were settled.
type watched struct {
	message.Subscriber
	acks, nacks atomic.Int64
}

func (w *watched) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	in, err := w.Subscriber.Subscribe(ctx, topic)
	if err != nil {
		return nil, err
	}
	out := make(chan *message.Message)
	go func() {
		defer close(out)
		for m := range in {
			go func() {
				select {
				case <-m.Acked():
					w.acks.Add(1)
				case <-m.Nacked():
					w.nacks.Add(1)
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

// redisBroker is one test's Redis: a publisher and subscribers of a prefix of its own.
type redisBroker struct {
	t      *testing.T
	prefix string
}

func newRedisBroker(t *testing.T) redisBroker {
	t.Helper()
	return redisBroker{t: t, prefix: testenv.RedisPrefix(t)}
}

func (b redisBroker) publisher() message.Publisher {
	pub, err := omniredis.NewPublisher(omniredis.PublisherConfig{Client: testenv.Redis(b.t), StreamPrefix: b.prefix}, nil)
	require.NoError(b.t, err)
	b.t.Cleanup(func() { _ = pub.Close() })
	return pub
}

func (b redisBroker) subscriber(group string) *watched {
	sub, err := omniredis.NewSubscriber(omniredis.SubscriberConfig{
		Client: testenv.Redis(b.t), StreamPrefix: b.prefix, ConsumerGroup: group,
		BlockTime: 100 * time.Millisecond, ClaimIdle: time.Second, ClaimInterval: 100 * time.Millisecond,
		NackDelay: 20 * time.Millisecond,
	}, nil)
	require.NoError(b.t, err)
	b.t.Cleanup(func() { _ = sub.Close() })
	return &watched{Subscriber: sub}
}

// kafkaBroker is the shared kfake cluster with a topic of the test's own.
type kafkaBroker struct {
	t       *testing.T
	brokers []string
}

func newKafkaBroker(t *testing.T) kafkaBroker {
	t.Helper()
	return kafkaBroker{t: t, brokers: testenv.Kafka(t)}
}

func (b kafkaBroker) topic() string { return testenv.KafkaTopic(b.t, b.brokers, 2) }

func (b kafkaBroker) publisher() message.Publisher {
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{ConnectionConfig: kafka.ConnectionConfig{Brokers: b.brokers, ClientID: "omnibus-test"}}, nil)
	require.NoError(b.t, err)
	b.t.Cleanup(func() { _ = pub.Close() })
	return pub
}

func (b kafkaBroker) subscriber(group string) *watched {
	sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{
		ConnectionConfig: kafka.ConnectionConfig{Brokers: b.brokers, ClientID: "omnibus-test"},
		ConsumerGroup:    group,
		SessionTimeout:   6 * time.Second, HeartbeatInterval: 100 * time.Millisecond, RebalanceTimeout: 10 * time.Second,
		CommitInterval: 100 * time.Millisecond, NackDelay: 10 * time.Millisecond,
		Tune: func(c *sarama.Config) {
			c.Consumer.Group.Rebalance.Retry.Backoff = 100 * time.Millisecond
			c.Metadata.Retry.Backoff = 50 * time.Millisecond
			c.Consumer.MaxWaitTime = 100 * time.Millisecond
		},
	}, nil)
	require.NoError(b.t, err)
	b.t.Cleanup(func() { _ = sub.Close() })
	return &watched{Subscriber: sub}
}

// counter counts handler calls per event id.
type counter struct {
	mu    sync.Mutex
	calls map[string]int
	order []string
}

func newCounter() *counter { return &counter{calls: map[string]int{}} }

func (c *counter) add(id string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls[id]++
	c.order = append(c.order, id)
	return c.calls[id]
}

func (c *counter) total() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.order)
}

func (c *counter) distinct() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.calls)
}

func (c *counter) snapshot() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.order...)
}

type orderEvent struct {
	OrderID string `json:"order_id"`
	Step    string `json:"step"`
}

// --- InboxIngest ---

func TestInboxIngest_SameBrokerMessageThreeTimesIsStoredAndHandledOnce(t *testing.T) {
	t.Parallel()
	for _, broker := range []string{"redis", "kafka"} {
		t.Run(broker, func(t *testing.T) {
			t.Parallel()
			pool, in := newInboxTable(t)
			var (
				pub   message.Publisher
				sub   *watched
				topic string
			)
			switch broker {
			case "redis":
				b := newRedisBroker(t)
				pub, sub, topic = b.publisher(), b.subscriber("billing"), "orders"
			case "kafka":
				b := newKafkaBroker(t)
				pub, sub, topic = b.publisher(), b.subscriber("billing_"+testenv.Name(t)), b.topic()
			}
			msg := message.NewMessage(watermill.NewUUID(), []byte(`{"order_id":"o-1","step":"paid"}`))
			bus.SetEventType(msg, "order.paid")
			bus.SetPartitionKey(msg, "o-1")
			for range 3 {
				require.NoError(t, pub.Publish(topic, msg.Copy()))
			}

			startIngest(t, pool, processors.InboxIngestConfig{
				Subscriber: sub, Topic: topic, ConsumerGroup: "billing",
				Inbox: postgres.InboxConfig{Table: in.Table()}, Retry: fastRetry,
			})
			handled := newCounter()
			startDispatcher(t, pool, processors.DispatcherConfig{
				Subscriber: postgres.SubscriberConfig{Table: in.Table(), ConsumerGroup: "billing"},
				Retry:      fastRetry,
			}, func(d *processors.Dispatcher) {
				processors.Handle(d, "order.paid", func(_ context.Context, ev orderEvent, m *message.Message) error {
					assert.Equal(t, "o-1", ev.OrderID)
					handled.add(bus.EventID(m))
					return nil
				})
			})

			testenv.Eventually(t, 30*time.Second, func() bool { return sub.acks.Load() >= 3 }, "all three deliveries acked by the broker")
			testenv.Eventually(t, 10*time.Second, func() bool { return handled.total() >= 1 }, "the message handled")
			testenv.Eventually(t, 10*time.Second, func() bool {
				r, ok := rowOf(t, pool, in, "billing", msg.UUID)
				return ok && r.status == "completed"
			}, "its row completed")
			assert.Equal(t, 1, countRows(t, pool, in, "true"), "stored once")
			assert.Equal(t, []string{msg.UUID}, handled.snapshot(), "handled once")
			assert.Equal(t, int64(3), sub.acks.Load())
			assert.Zero(t, sub.nacks.Load())
		})
	}
}

func TestInboxIngest_TwoConsumerGroupsEachStoreAndHandleEveryMessageOnce(t *testing.T) {
	t.Parallel()
	pool, in := newInboxTable(t)
	b := newRedisBroker(t)
	pub := b.publisher()
	const n = 30
	var ids []string
	for i := range n {
		m := message.NewMessage(watermill.NewUUID(), fmt.Appendf(nil, `{"order_id":"o-%d","step":"created"}`, i%7))
		bus.SetEventType(m, "order.created")
		bus.SetPartitionKey(m, fmt.Sprintf("o-%d", i%7))
		ids = append(ids, m.UUID)
		require.NoError(t, pub.Publish("orders", m))
		if i%10 == 0 {
			require.NoError(t, pub.Publish("orders", m.Copy()), "a redelivery by the sender")
		}
	}
	groups := map[string]*counter{}
	for _, g := range []string{"billing", "shipping"} {
		c := newCounter()
		groups[g] = c
		startIngest(t, pool, processors.InboxIngestConfig{
			Subscriber: b.subscriber(g), Topic: "orders", ConsumerGroup: g,
			Inbox: postgres.InboxConfig{Table: in.Table()}, Retry: fastRetry, HandlerName: "ingest_" + g,
		})
		startDispatcher(t, pool, processors.DispatcherConfig{
			Subscriber: postgres.SubscriberConfig{Table: in.Table(), ConsumerGroup: g},
			Retry:      fastRetry, HandlerName: "dispatch_" + g,
		}, func(d *processors.Dispatcher) {
			processors.Handle(d, "order.created", func(_ context.Context, _ orderEvent, m *message.Message) error {
				c.add(m.UUID)
				return nil
			})
		})
	}
	for g, c := range groups {
		testenv.Eventually(t, 30*time.Second, func() bool { return c.distinct() >= n }, "group %s to handle every message", g)
		testenv.Eventually(t, 10*time.Second, func() bool {
			return countRows(t, pool, in, "consumer_group = $1 AND status = 'completed'", g) == n
		}, "group %s rows completed", g)
		assert.Equal(t, n, c.total(), "group %s handled a message more than once", g)
		assert.ElementsMatch(t, ids, c.snapshot(), "group %s", g)
	}
	assert.Equal(t, 2*n, countRows(t, pool, in, "true"), "every message stored once per group")
}

func TestInboxIngest_InlineHandlerErrorStoresNothingAndTheBrokerRedelivers(t *testing.T) {
	t.Parallel()
	pool, in := newInboxTable(t)
	fx := newEffects(t, pool)
	b := newRedisBroker(t)
	pub := b.publisher()
	sub := b.subscriber("billing")

	type seen struct{ committedRows, effects int }
	var (
		mu    sync.Mutex
		calls []seen
	)
	startIngest(t, pool, processors.InboxIngestConfig{
		Subscriber: sub, Topic: "orders", ConsumerGroup: "billing",
		Inbox: postgres.InboxConfig{Table: in.Table()}, Retry: fastRetry,
		Inline: func(m *message.Message) error {
			tx, ok := postgres.TxFromContext(m.Context())
			if !ok {
				return errors.New("no transaction in the inline handler's context")
			}
			// What the earlier attempts left behind, as others see it.
			var s seen
			if err := pool.QueryRow(m.Context(), `SELECT (SELECT count(*) FROM `+pgx.Identifier{in.Table()}.Sanitize()+
				` WHERE message_id = $1), (SELECT count(*) FROM `+pgx.Identifier{fx.name}.Sanitize()+`)`,
				bus.EventID(m)).Scan(&s.committedRows, &s.effects); err != nil {
				return err
			}
			mu.Lock()
			calls = append(calls, s)
			n := len(calls)
			mu.Unlock()
			if err := fx.write(m.Context(), pgxEffectsDB{tx}, bus.EventID(m), fmt.Sprintf("call %d", n)); err != nil {
				return err
			}
			if n == 1 {
				return errors.New("payment service said no")
			}
			return nil
		},
	})
	msg := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
	bus.SetPartitionKey(msg, "o-1")
	require.NoError(t, pub.Publish("orders", msg))

	testenv.Eventually(t, 20*time.Second, func() bool { return sub.acks.Load() >= 1 }, "the redelivery to succeed")
	mu.Lock()
	got := append([]seen(nil), calls...)
	mu.Unlock()
	require.Len(t, got, 2, "one failed call, one redelivery")
	assert.Equal(t, seen{}, got[0])
	assert.Equal(t, seen{}, got[1], "the failed call left no inbox row and no effect")
	assert.Equal(t, int64(1), sub.nacks.Load(), "the failure nacked the broker message")
	r, ok := rowOf(t, pool, in, "billing", msg.UUID)
	require.True(t, ok)
	assert.Equal(t, "completed", r.status, "inline success stores the row completed")
	assert.Equal(t, 1, fx.count(t))

	// A later duplicate is acked without running the handler.
	require.NoError(t, pub.Publish("orders", msg.Copy()))
	testenv.Eventually(t, 20*time.Second, func() bool { return sub.acks.Load() >= 2 }, "the duplicate acked")
	mu.Lock()
	assert.Len(t, calls, 2)
	mu.Unlock()
	assert.Equal(t, 1, countRows(t, pool, in, "true"))
}

func TestInboxIngest_InlineWithTheDispatchersTypedHandlers(t *testing.T) {
	t.Parallel()
	pool, in := newInboxTable(t)
	fx := newEffects(t, pool)
	b := newRedisBroker(t)
	pub := b.publisher()
	sub := b.subscriber("billing")
	d, err := processors.NewDispatcher(pool, processors.DispatcherConfig{
		Subscriber: postgres.SubscriberConfig{Table: in.Table(), ConsumerGroup: "billing"},
	}, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = d.Close() })
	processors.Handle(d, "order.paid", func(ctx context.Context, ev orderEvent, m *message.Message) error {
		tx, ok := postgres.TxFromContext(ctx)
		if !ok {
			return errors.New("no transaction")
		}
		return fx.write(ctx, pgxEffectsDB{tx}, bus.EventID(m), ev.OrderID)
	})
	startIngest(t, pool, processors.InboxIngestConfig{
		Subscriber: sub, Topic: "orders", ConsumerGroup: "billing",
		Inbox: postgres.InboxConfig{Table: in.Table()}, Retry: fastRetry, Inline: d.Dispatch,
	})
	good := message.NewMessage(watermill.NewUUID(), []byte(`{"order_id":"o-9"}`))
	bus.SetEventType(good, "order.paid")
	bad := message.NewMessage(watermill.NewUUID(), []byte(`{not json`))
	bus.SetEventType(bad, "order.paid")
	require.NoError(t, pub.Publish("orders", good, bad))

	testenv.Eventually(t, 20*time.Second, func() bool { return sub.acks.Load() >= 1 }, "the good message acked")
	r, ok := rowOf(t, pool, in, "billing", good.UUID)
	require.True(t, ok)
	assert.Equal(t, "completed", r.status)
	assert.Equal(t, 1, fx.count(t))
	// The malformed one is a permanent failure: Redis dead-letters it (and
	// acks it) at once; nothing of it is stored.
	testenv.Eventually(t, 20*time.Second, func() bool {
		n, err := testenv.Redis(t).XLen(context.Background(), b.prefix+"orders"+omniredis.DefaultDeadLetterSuffix).Result()
		return err == nil && n == 1
	}, "the malformed message dead-lettered")
	_, ok = rowOf(t, pool, in, "billing", bad.UUID)
	assert.False(t, ok, "nothing stored for the failed message")
}

// countingTracer counts the inbox inserts of a pool and their sizes.
type countingTracer struct {
	mu      sync.Mutex
	table   string
	inserts []int
}

func (c *countingTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	// The inbox insert: its second argument is the message ids.
	if strings.HasPrefix(data.SQL, "INSERT INTO") && len(data.Args) > 1 {
		if ids, ok := data.Args[1].([]string); ok {
			c.mu.Lock()
			c.inserts = append(c.inserts, len(ids))
			c.mu.Unlock()
		}
	}
	return ctx
}

func (c *countingTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func TestInboxIngest_ConcurrentMessagesShareOneInsert(t *testing.T) {
	t.Parallel()
	_, in := newInboxTable(t)
	cfg, err := pgxpool.ParseConfig(testenv.PostgresURL())
	require.NoError(t, err)
	cfg.MaxConns = 3
	tr := &countingTracer{}
	cfg.ConnConfig.Tracer = tr
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	b := newRedisBroker(t)
	pub := b.publisher()
	const n, batch = 300, 64
	msgs := make([]*message.Message, n)
	for i := range msgs {
		msgs[i] = message.NewMessage(watermill.NewUUID(), []byte("x"))
	}
	require.NoError(t, pub.Publish("orders", msgs...))
	sub := b.subscriber("billing")
	startIngest(t, pool, processors.InboxIngestConfig{
		Subscriber: sub, Topic: "orders", ConsumerGroup: "billing",
		Inbox:     postgres.InboxConfig{Table: in.Table()},
		BatchSize: batch, BatchWait: 50 * time.Millisecond, Writers: 1,
	})
	testenv.Eventually(t, 30*time.Second, func() bool { return sub.acks.Load() >= n }, "every message acked")
	assert.Equal(t, n, countRows(t, pool, in, "true"))
	tr.mu.Lock()
	defer tr.mu.Unlock()
	total := 0
	for _, k := range tr.inserts {
		assert.LessOrEqual(t, k, batch, "a statement holds at most BatchSize messages")
		total += k
	}
	assert.Equal(t, n, total)
	assert.Less(t, len(tr.inserts), n/4, "concurrently received messages are stored together (statements: %v)", tr.inserts)
}

func TestInboxIngest_AnInvalidMessageFailsAloneAndPermanently(t *testing.T) {
	t.Parallel()
	pool, in := newInboxTable(t)
	b := newRedisBroker(t)
	pub := b.publisher()
	sub := b.subscriber("billing")
	good := message.NewMessage(watermill.NewUUID(), []byte("ok"))
	big := message.NewMessage(watermill.NewUUID(), []byte("far too big for this inbox"))
	nul := message.NewMessage(watermill.NewUUID(), []byte("ok"))
	nul.Metadata.Set("note", "a\x00b")
	require.NoError(t, pub.Publish("orders", good, big, nul))
	startIngest(t, pool, processors.InboxIngestConfig{
		Subscriber: sub, Topic: "orders", ConsumerGroup: "billing",
		Inbox: postgres.InboxConfig{Table: in.Table(), MaxPayloadBytes: 10}, Retry: fastRetry,
	})
	testenv.Eventually(t, 20*time.Second, func() bool {
		n, err := testenv.Redis(t).XLen(context.Background(), b.prefix+"orders"+omniredis.DefaultDeadLetterSuffix).Result()
		return err == nil && n == 2
	}, "both bad messages dead-lettered")
	testenv.Eventually(t, 20*time.Second, func() bool { return sub.acks.Load() >= 1 }, "the good one acked")
	assert.Equal(t, int64(2), sub.nacks.Load(), "each bad message was nacked once, as permanent")
	_, ok := rowOf(t, pool, in, "billing", good.UUID)
	assert.True(t, ok, "the good message is stored")
	assert.Equal(t, 1, countRows(t, pool, in, "true"))
}

func TestNewInboxIngest_InvalidConfig(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	sub := &watched{}
	for _, tc := range []struct {
		name  string
		cfg   processors.InboxIngestConfig
		field string
	}{
		{"no subscriber", processors.InboxIngestConfig{Topic: "t", ConsumerGroup: "g"}, "Subscriber"},
		{"no topic", processors.InboxIngestConfig{Subscriber: sub, ConsumerGroup: "g"}, "Topic"},
		{"no group", processors.InboxIngestConfig{Subscriber: sub, Topic: "t"}, "ConsumerGroup"},
		{"bad batch", processors.InboxIngestConfig{Subscriber: sub, Topic: "t", ConsumerGroup: "g", BatchSize: -1}, "BatchSize"},
		{"bad table", processors.InboxIngestConfig{Subscriber: sub, Topic: "t", ConsumerGroup: "g", Inbox: postgres.InboxConfig{Table: "a b"}}, "Table"},
	} {
		_, err := processors.NewInboxIngest(pool, tc.cfg, nil)
		require.Error(t, err, tc.name)
		assert.Contains(t, err.Error(), "invalid config: ", tc.name)
		assert.Contains(t, err.Error(), tc.field, tc.name)
	}
	_, err := processors.NewInboxIngest(nil, processors.InboxIngestConfig{Subscriber: sub, Topic: "t", ConsumerGroup: "g"}, nil)
	assert.Error(t, err, "a pool is required")
}
