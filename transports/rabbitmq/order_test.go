package rabbitmq_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/internal/testenv"
	"github.com/omnibus-go/omnibus/transports/rabbitmq"
)

// ledger records what handlers acked, per key, and checks the order the
// inbox would see: each key's messages, duplicates dropped, in publish
// order, none missing.
type ledger struct {
	mu   sync.Mutex
	seen map[string]bool
	keys map[string][]int
}

func newLedger() *ledger { return &ledger{seen: map[string]bool{}, keys: map[string][]int{}} }

func (l *ledger) handled(msg *message.Message) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.seen[msg.UUID] {
		return // a redelivery of what was handled: the inbox drops it
	}
	l.seen[msg.UUID] = true
	seq, _ := strconv.Atoi(msg.Metadata.Get("seq"))
	k := bus.PartitionKey(msg)
	l.keys[k] = append(l.keys[k], seq)
}

func (l *ledger) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.seen)
}

// check fails the test for a key whose messages are missing or out of order.
func (l *ledger) check(t *testing.T, keys, perKey int) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	for k := range keys {
		key := fmt.Sprintf("key-%d", k)
		want := make([]int, perKey)
		for i := range want {
			want[i] = i
		}
		assert.Equal(t, want, l.keys[key], "key %s: every message once, in publish order", key)
	}
}

// publishKeyed publishes the messages from to to (seq in metadata) to
// each of keys keys, keys interleaved.
func publishKeyed(t *testing.T, pub message.Publisher, topic string, keys, from, to int) {
	t.Helper()
	for i := from; i < to; i++ {
		var batch []*message.Message
		for k := range keys {
			msg := message.NewMessage(watermill.NewUUID(), []byte("{}"))
			bus.SetPartitionKey(msg, fmt.Sprintf("key-%d", k))
			msg.Metadata.Set("seq", strconv.Itoa(i))
			batch = append(batch, msg)
		}
		require.NoError(t, pub.Publish(topic, batch...))
	}
}

// consume hands sub's messages of topic to the ledger, each after a short
// random handling time plus delay, until ctx ends.
func consume(t *testing.T, ctx context.Context, sub message.Subscriber, topic string, l *ledger, handedOut *atomic.Int64, delay time.Duration) {
	t.Helper()
	msgs, err := sub.Subscribe(ctx, topic)
	require.NoError(t, err)
	go func() {
		for msg := range msgs {
			if handedOut != nil {
				handedOut.Add(1)
			}
			time.Sleep(delay + time.Duration(rand.IntN(300))*time.Microsecond)
			l.handled(msg)
			msg.Ack()
		}
	}()
}

func conn(t *testing.T, shards int) rabbitmq.ConnectionConfig {
	return rabbitmq.ConnectionConfig{URL: testenv.RabbitMQ(t), ExchangePrefix: testenv.RabbitMQPrefix(t), Shards: shards,
		Heartbeat: time.Second, QueueExpires: time.Minute}
}

// Three consumers of one group, restarted at random while messages flow:
// every key's messages are handled in publish order, none missing.
func TestShards_KeyOrderHoldsWhileConsumersComeAndGo(t *testing.T) {
	t.Parallel()
	const keys, perKey = 40, 50
	cc := conn(t, 4)
	pub, err := rabbitmq.NewPublisher(rabbitmq.PublisherConfig{ConnectionConfig: cc, Groups: []string{"g"}}, nil)
	require.NoError(t, err)
	defer pub.Close()
	l := newLedger()
	newSub := func(ctx context.Context) *rabbitmq.Subscriber {
		sub, err := rabbitmq.NewSubscriber(rabbitmq.SubscriberConfig{ConnectionConfig: cc, ConsumerGroup: "g", Prefetch: 20}, nil)
		require.NoError(t, err)
		consume(t, ctx, sub, "orders", l, nil, 0)
		return sub
	}
	subs := make([]*rabbitmq.Subscriber, 3)
	for i := range subs {
		subs[i] = newSub(context.Background())
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		publishKeyed(t, pub, "orders", keys, 0, perKey)
	}()
	for l.count() < keys*perKey {
		time.Sleep(150 * time.Millisecond)
		i := rand.IntN(len(subs))
		require.NoError(t, subs[i].Close()) // what it held goes to the next consumer
		subs[i] = newSub(context.Background())
	}
	<-done
	for _, s := range subs {
		require.NoError(t, s.Close())
	}
	l.check(t, keys, perKey)
}

// proxy forwards TCP to RabbitMQ and can stall both directions, as a
// stopped process or a partition would.
type proxy struct {
	ln     net.Listener
	target string
	paused atomic.Bool
}

func newProxy(t *testing.T, target string) *proxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &proxy{ln: ln, target: target}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				_ = c.Close()
				continue
			}
			go p.pipe(c, s)
			go p.pipe(s, c)
		}
	}()
	return p
}

func (p *proxy) pipe(dst, src net.Conn) {
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		for p.paused.Load() {
			time.Sleep(10 * time.Millisecond)
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// A consumer stalled past its lease (here: its traffic stopped for 4×
// the heartbeat) loses its queues to another consumer, and when it comes
// back it hands out nothing more of them: every key stays in order.
func TestShards_StalledConsumerIsFenced(t *testing.T) {
	t.Parallel()
	const keys, perKey = 20, 40
	cc := conn(t, 4)
	pub, err := rabbitmq.NewPublisher(rabbitmq.PublisherConfig{ConnectionConfig: cc, Groups: []string{"g"}}, nil)
	require.NoError(t, err)
	defer pub.Close()
	l := newLedger()

	px := newProxy(t, "127.0.0.1:5672")
	stalledCfg := cc
	stalledCfg.URL = "amqp://guest:guest@" + px.ln.Addr().String() + "/"
	stalled, err := rabbitmq.NewSubscriber(rabbitmq.SubscriberConfig{ConnectionConfig: stalledCfg, ConsumerGroup: "g", Prefetch: 20}, nil)
	require.NoError(t, err)
	defer stalled.Close()
	var fromStalled atomic.Int64
	consume(t, context.Background(), stalled, "orders", l, &fromStalled, 20*time.Millisecond) // slow: it holds messages it has not handed out yet
	time.Sleep(500 * time.Millisecond)                                                        // the stalled one is active on every shard
	other, err := rabbitmq.NewSubscriber(rabbitmq.SubscriberConfig{ConnectionConfig: cc, ConsumerGroup: "g", Prefetch: 20}, nil)
	require.NoError(t, err)
	defer other.Close()
	consume(t, context.Background(), other, "orders", l, nil, 0)

	publishKeyed(t, pub, "orders", keys, 0, perKey/2)
	testenv.Eventually(t, 10*time.Second, func() bool { return fromStalled.Load() > 0 }, "the first consumer handles messages")
	px.paused.Store(true)
	// Until its lease (the heartbeat) runs out the consumer does not know:
	// it may hand out what it had received. After that, nothing.
	time.Sleep(cc.Heartbeat + 100*time.Millisecond)
	atLeaseEnd := fromStalled.Load()
	publishKeyed(t, pub, "orders", keys, perKey/2, perKey)
	time.Sleep(3 * cc.Heartbeat)
	px.paused.Store(false)
	testenv.Eventually(t, 30*time.Second, func() bool { return l.count() == keys*perKey }, "every message handled")
	assert.Equal(t, atLeaseEnd, fromStalled.Load(), "the stalled consumer handed out nothing once its lease ran out, nor when it came back")
	assert.Positive(t, stalled.Stats().Fenced+stalled.Stats().AcksLost, "it knew it was fenced")
	l.check(t, keys, perKey)
}
