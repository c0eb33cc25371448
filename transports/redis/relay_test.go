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
	ctx := context.Background()
	pool := testenv.Postgres(t)
	table := testenv.Name(t)
	require.NoError(t, postgres.Migrate(ctx, pool, postgres.OutboxTable(table)))
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), fmt.Sprintf(`DROP TABLE IF EXISTS %q, %q CASCADE`, table, table+"_lanes"))
	})
	outbox, err := postgres.NewOutbox(postgres.OutboxConfig{Table: table})
	require.NoError(t, err)

	const topic, keys, perKey = "orders", 4, 10
	want := map[string][]string{}
	for i := range keys * perKey {
		key := "order-" + strconv.Itoa(i%keys)
		payload := key + "/" + strconv.Itoa(len(want[key]))
		msg := message.NewMessage(watermill.NewUUID(), []byte(payload))
		bus.SetPartitionKey(msg, key)
		require.NoError(t, outbox.Enqueue(ctx, pool, topic, msg))
		want[key] = append(want[key], payload)
	}

	// Redis is "down": nothing listens on the proxy's address yet.
	proxy := newProxy(t, testenv.RedisAddr())
	// Fail fast while the proxy refuses: no command retries, one dial try.
	client := goredis.NewClient(&goredis.Options{Addr: proxy.addr, DialTimeout: time.Second, MaxRetries: -1, DialerRetries: 1})
	t.Cleanup(func() { _ = client.Close() })
	pub, err := omniredis.NewPublisher(omniredis.PublisherConfig{Client: client, StreamPrefix: e.prefix}, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	counted := &countingPublisher{Publisher: pub}

	relay, err := processors.NewOutboxRelay(pool, processors.OutboxRelayConfig{
		Publisher:  counted,
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

	eventually(t, 20*time.Second, func() bool { return counted.failures.Load() >= 5 },
		"the relay made %d failed publishes while Redis was unreachable, want at least 5", counted.failures.Load())
	assert.Zero(t, counted.successes.Load(), "a publish succeeded while Redis was unreachable")
	var lastErr error
	counted.mu.Lock()
	lastErr = counted.lastErr
	counted.mu.Unlock()
	assert.Equal(t, bus.ClassTransient, bus.ClassOf(lastErr), "refused connection must be transient: %v", lastErr)
	assert.Zero(t, attemptsSpent(t, table), "attempts were spent while Redis was unreachable")

	proxy.start() // Redis is back

	stream := e.prefix + topic
	eventually(t, 30*time.Second, func() bool {
		n, err := e.client.XLen(ctx, stream).Result()
		return err == nil && n >= keys*perKey
	}, "not every outbox event reached the stream")
	entries, err := e.client.XRange(ctx, stream, "-", "+").Result()
	require.NoError(t, err)
	require.Len(t, entries, keys*perKey, "events duplicated in the stream")
	got := map[string][]string{}
	for _, entry := range entries {
		msg, err := omniredis.DefaultMarshaler{}.Unmarshal(entry.Values)
		require.NoError(t, err)
		got[bus.PartitionKey(msg)] = append(got[bus.PartitionKey(msg)], string(msg.Payload))
	}
	assert.Equal(t, want, got, "stream order per key differs from the outbox order")

	// And a consumer group reading the stream one key at a time sees the
	// same order.
	cfg := e.fastSubscriberConfig("billing")
	cfg.OrderByKey = true
	msgs := e.subscribe(e.subscriber(cfg), topic)
	consumed := map[string][]string{}
	for range keys * perKey {
		msg := receive(t, msgs, 10*time.Second)
		consumed[bus.PartitionKey(msg)] = append(consumed[bus.PartitionKey(msg)], string(msg.Payload))
		msg.Ack()
	}
	assert.Equal(t, want, consumed, "consumed order per key differs from the outbox order")

	eventually(t, 10*time.Second, func() bool { return pendingRows(t, table) == 0 }, "outbox rows still pending")
	assert.Zero(t, attemptsSpent(t, table), "the outage spent attempts")
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
