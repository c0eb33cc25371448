package redis_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/internal/testenv"
	"github.com/omnibus-go/omnibus/middleware"
	"github.com/omnibus-go/omnibus/processors"
	"github.com/omnibus-go/omnibus/transports/postgres"
	omniredis "github.com/omnibus-go/omnibus/transports/redis"
	goredis "github.com/redis/go-redis/v9"
)

// TestOutboxRelay_RedisOutageSpendsNoAttemptsAndKeepsKeyOrder relays an
// outbox to Redis Streams through a TCP proxy that is not listening at
// first: every publish is refused, the relay must spend no attempts, and once
// the proxy listens everything arrives, in order per key.
func TestOutboxRelay_RedisOutageSpendsNoAttemptsAndKeepsKeyOrder(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	// Redis is "down": nothing listens on the proxy's address yet.
	proxy := newProxy(t, testenv.RedisAddr())
	// Fail fast while the proxy refuses: no command retries, one dial try.
	client := goredis.NewClient(&goredis.Options{Addr: proxy.addr, DialTimeout: time.Second, MaxRetries: -1, DialerRetries: 1})
	t.Cleanup(func() { _ = client.Close() })

	r := startRelay(t, client, e.prefix)
	r.waitForFailedPublishes(t, 5, "Redis was unreachable")

	proxy.start() // Redis is back

	r.checkDelivered(t, e.client)

	// And a consumer group reading the stream one key at a time sees the
	// same order.
	cfg := e.fastSubscriberConfig("billing")
	cfg.OrderByKey = true
	msgs := e.subscribe(e.subscriber(cfg), r.topic)
	consumed := map[string][]string{}
	for range len(r.all) {
		msg := receive(t, msgs, 10*time.Second)
		consumed[bus.PartitionKey(msg)] = append(consumed[bus.PartitionKey(msg)], string(msg.Payload))
		msg.Ack()
	}
	assert.Equal(t, r.want, consumed, "consumed order per key differs from the outbox order")
}

// TestOutboxRelay_RedisOutOfMemorySpendsNoAttemptsAndDeliversInOrder relays
// an outbox to a private Redis whose maxmemory (1 byte) refuses every
// write with OOM: the relay must spend no attempts while it lasts, and once
// maxmemory is lifted everything arrives, once and in order per key.
func TestOutboxRelay_RedisOutOfMemorySpendsNoAttemptsAndDeliversInOrder(t *testing.T) {
	t.Parallel()
	_, client := startPlainRedis(t, "--maxmemory", "1", "--maxmemory-policy", "noeviction")
	ctx := context.Background()

	r := startRelay(t, client, "")
	r.waitForFailedPublishes(t, 5, "Redis was out of memory")
	require.True(t, goredis.IsOOMError(r.lastErr()), "the publishes failed with %v, not OOM", r.lastErr())

	require.NoError(t, client.ConfigSet(ctx, "maxmemory", "0").Err(), "lift maxmemory on the private server")

	r.checkDelivered(t, client)
}

// relayRun is an OutboxRelay over an outbox table of its own, publishing to
// Redis through a countingPublisher.
type relayRun struct {
	table, topic, prefix string
	want                 map[string][]string // payloads per key, in outbox order
	all                  []string
	pub                  *countingPublisher
}

// startRelay fills an outbox with 4 keys of 10 events each and starts an
// OutboxRelay publishing them to client under prefix. The relay retries
// transient failures every 20 ms and stops when the test ends.
func startRelay(t *testing.T, client goredis.UniversalClient, prefix string) *relayRun {
	t.Helper()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	table := testenv.Name(t)
	require.NoError(t, postgres.Migrate(ctx, pool, postgres.OutboxTable(table)))
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), fmt.Sprintf(`DROP TABLE IF EXISTS %q, %q CASCADE`, table, table+"_lanes"))
	})
	outbox, err := postgres.NewOutbox(postgres.OutboxConfig{Table: table})
	require.NoError(t, err)

	r := &relayRun{table: table, topic: "orders", prefix: prefix, want: map[string][]string{}}
	const keys, perKey = 4, 10
	for i := range keys * perKey {
		key := "order-" + strconv.Itoa(i%keys)
		payload := key + "/" + strconv.Itoa(len(r.want[key]))
		msg := message.NewMessage(watermill.NewUUID(), []byte(payload))
		bus.SetPartitionKey(msg, key)
		require.NoError(t, outbox.Enqueue(ctx, pool, r.topic, msg))
		r.want[key] = append(r.want[key], payload)
		r.all = append(r.all, payload)
	}

	pub, err := omniredis.NewPublisher(omniredis.PublisherConfig{Client: client, StreamPrefix: prefix}, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	r.pub = &countingPublisher{Publisher: pub}

	relay, err := processors.NewOutboxRelay(pool, processors.OutboxRelayConfig{
		Publisher:  r.pub,
		Subscriber: postgres.SubscriberConfig{Table: table, PollInterval: 20 * time.Millisecond},
		Retry:      middleware.RetryConfig{Base: middleware.NoDelay, TransientDelay: 20 * time.Millisecond},
		Breaker:    middleware.CircuitBreakerConfig{FailureThreshold: 1, OpenTimeout: 50 * time.Millisecond},
	}, nil)
	require.NoError(t, err)
	relayCtx, stopRelay := context.WithCancel(ctx)
	relayDone := make(chan error, 1)
	go func() { relayDone <- relay.Run(relayCtx) }()
	t.Cleanup(func() {
		stopRelay()
		assert.NoError(t, <-relayDone)
	})
	return r
}

func (r *relayRun) lastErr() error {
	r.pub.mu.Lock()
	defer r.pub.mu.Unlock()
	return r.pub.lastErr
}

// waitForFailedPublishes waits for n failed publishes and checks that
// none succeeded, that they were transient and that no attempt was spent.
func (r *relayRun) waitForFailedPublishes(t *testing.T, n int64, why string) {
	t.Helper()
	testenv.Eventually(t, 20*time.Second, func() bool { return r.pub.failures.Load() >= n },
		"the relay made %d failed publishes while %s, want at least %d", r.pub.failures.Load(), why, n)
	assert.Zero(t, r.pub.successes.Load(), "a publish succeeded while %s", why)
	assert.Equal(t, bus.ClassTransient, bus.ClassOf(r.lastErr()), "a publish failing while %s must be transient: %v", why, r.lastErr())
	assert.Zero(t, attemptsSpent(t, r.table), "attempts were spent while %s", why)
}

// checkDelivered waits until every outbox event is in the stream, then
// checks there is each once, in outbox order per key, and that the outbox
// is done without having spent an attempt.
func (r *relayRun) checkDelivered(t *testing.T, client goredis.UniversalClient) {
	t.Helper()
	ctx := context.Background()
	stream := r.prefix + r.topic
	testenv.Eventually(t, 30*time.Second, func() bool {
		n, err := client.XLen(ctx, stream).Result()
		return err == nil && n >= int64(len(r.all))
	}, "not every outbox event reached the stream")
	entries, err := client.XRange(ctx, stream, "-", "+").Result()
	require.NoError(t, err)
	require.Len(t, entries, len(r.all), "events duplicated in the stream")
	got := map[string][]string{}
	for _, entry := range entries {
		msg, err := omniredis.DefaultMarshaler{}.Unmarshal(entry.Values)
		require.NoError(t, err)
		got[bus.PartitionKey(msg)] = append(got[bus.PartitionKey(msg)], string(msg.Payload))
	}
	assert.Equal(t, r.want, got, "stream order per key differs from the outbox order")
	testenv.Eventually(t, 10*time.Second, func() bool { return pendingRows(t, r.table) == 0 }, "outbox rows still pending")
	assert.Zero(t, attemptsSpent(t, r.table), "the outage spent attempts")
}

func attemptsSpent(t *testing.T, table string) int {
	t.Helper()
	var n int
	require.NoError(t, testenv.Postgres(t).QueryRow(context.Background(),
		// A leased row's attempts include the delivery under way.
		`SELECT coalesce(sum(attempts - (locked_by IS NOT NULL)::int), 0) FROM `+pgx.Identifier{table}.Sanitize()).Scan(&n))
	return n
}

func pendingRows(t *testing.T, table string) int {
	t.Helper()
	var n int
	require.NoError(t, testenv.Postgres(t).QueryRow(context.Background(),
		`SELECT count(*) FROM `+pgx.Identifier{table}.Sanitize()+` WHERE status <> 'completed'`).Scan(&n))
	return n
}

// countingPublisher counts the publishes that failed and succeeded.
type countingPublisher struct {
	message.Publisher
	failures, successes atomic.Int64
	mu                  sync.Mutex
	lastErr             error
}

func (p *countingPublisher) Publish(topic string, msgs ...*message.Message) error {
	err := p.Publisher.Publish(topic, msgs...)
	if err != nil {
		p.failures.Add(1)
		p.mu.Lock()
		p.lastErr = err
		p.mu.Unlock()
	} else {
		p.successes.Add(1)
	}
	return err
}

// proxy forwards TCP connections to a target once started. Before start
// nothing listens on its address, so connecting is refused.
type proxy struct {
	t      *testing.T
	addr   string
	target string

	mu    sync.Mutex
	ln    net.Listener
	conns []net.Conn
	wg    sync.WaitGroup
}

func newProxy(t *testing.T, target string) *proxy {
	t.Helper()
	p := &proxy{t: t, addr: closedAddr(t), target: target}
	t.Cleanup(p.stop)
	return p
}

func (p *proxy) start() {
	p.t.Helper()
	ln, err := net.Listen("tcp", p.addr)
	require.NoError(p.t, err, "listen on the proxy's address again")
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	p.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", p.target)
			if err != nil {
				_ = c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, up)
			p.mu.Unlock()
			p.wg.Go(func() { _, _ = io.Copy(up, c); _ = up.Close() })
			p.wg.Go(func() { _, _ = io.Copy(c, up); _ = c.Close() })
		}
	})
}

func (p *proxy) stop() {
	p.mu.Lock()
	if p.ln != nil {
		_ = p.ln.Close()
	}
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}
