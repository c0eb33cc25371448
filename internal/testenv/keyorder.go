package testenv

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
)

// Ledger records what handlers acked, per key, and checks the order an
// inbox would see: each key's messages, duplicates dropped, in publish
// order, none missing. The transports' ordering tests share it.
type Ledger struct {
	mu   sync.Mutex
	seen map[string]bool
	keys map[string][]int
}

// NewLedger returns an empty ledger.
func NewLedger() *Ledger { return &Ledger{seen: map[string]bool{}, keys: map[string][]int{}} }

// Handled records msg (its "seq" metadata under its partition key) unless
// its UUID was recorded before: a redelivery the inbox would drop.
func (l *Ledger) Handled(msg *message.Message) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.seen[msg.UUID] {
		return
	}
	l.seen[msg.UUID] = true
	seq, _ := strconv.Atoi(msg.Metadata.Get("seq"))
	k := bus.PartitionKey(msg)
	l.keys[k] = append(l.keys[k], seq)
}

// Count is the number of distinct messages recorded.
func (l *Ledger) Count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.seen)
}

// Check fails the test for a key of PublishKeyed's whose messages are
// missing or out of order.
func (l *Ledger) Check(t *testing.T, keys, perKey int) {
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

// PublishKeyed publishes the messages from to to (seq in metadata) to each
// of keys keys ("key-0" …), keys interleaved, one call per seq.
func PublishKeyed(t *testing.T, pub message.Publisher, topic string, keys, from, to int) {
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

// ConsumeInto hands sub's messages of topic to the ledger, each after delay
// plus a short random handling time, until ctx ends; handedOut (optional)
// counts the messages received.
func ConsumeInto(t *testing.T, ctx context.Context, sub message.Subscriber, topic string, l *Ledger, handedOut *atomic.Int64, delay time.Duration) {
	t.Helper()
	msgs, err := sub.Subscribe(ctx, topic)
	require.NoError(t, err)
	go func() {
		for msg := range msgs {
			if handedOut != nil {
				handedOut.Add(1)
			}
			time.Sleep(delay + time.Duration(rand.IntN(300))*time.Microsecond)
			l.Handled(msg)
			msg.Ack()
		}
	}()
}

// StallProxy forwards TCP to a server and can stall both directions, as a
// stopped process or a partition would.
type StallProxy struct {
	ln     net.Listener
	paused atomic.Bool
}

// NewStallProxy listens on a loopback port and forwards to target until the
// test ends.
func NewStallProxy(t *testing.T, target string) *StallProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &StallProxy{ln: ln}
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

// Addr is the proxy's host:port.
func (p *StallProxy) Addr() string { return p.ln.Addr().String() }

// Stall stops (true) or resumes (false) the traffic.
func (p *StallProxy) Stall(on bool) { p.paused.Store(on) }

func (p *StallProxy) pipe(dst, src net.Conn) {
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
