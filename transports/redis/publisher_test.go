package redis_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/internal/testenv"
	omniredis "github.com/omnibus-go/omnibus/transports/redis"
	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// pipelineCounter counts the pipelines and single commands of XADD a client
// sends (the client's own connection set-up is left out).
type pipelineCounter struct {
	mu        sync.Mutex
	pipelines []int // XADDs per pipeline
	singles   int
}

func countXAdds(cmds []goredis.Cmder) int {
	n := 0
	for _, c := range cmds {
		if c.Name() == "xadd" {
			n++
		}
	}
	return n
}

func (h *pipelineCounter) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (h *pipelineCounter) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		h.mu.Lock()
		h.singles += countXAdds([]goredis.Cmder{cmd})
		h.mu.Unlock()
		return next(ctx, cmd)
	}
}

func (h *pipelineCounter) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		if n := countXAdds(cmds); n > 0 {
			h.mu.Lock()
			h.pipelines = append(h.pipelines, n)
			h.mu.Unlock()
		}
		return next(ctx, cmds)
	}
}

func TestPublisher_MultiMessagePublishIsOnePipelineInOrder(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	client := testenv.NewRedisClient(t)
	hook := &pipelineCounter{}
	client.AddHook(hook)
	pub, err := omniredis.NewPublisher(omniredis.PublisherConfig{Client: client, StreamPrefix: e.prefix}, nil)
	require.NoError(t, err)
	defer pub.Close()

	var msgs []*message.Message
	for range 100 {
		m := message.NewMessage(watermill.NewUUID(), []byte("payload"))
		m.Metadata.Set(bus.KeyPartitionKey, "order-1")
		m.Metadata.Set("x", "y")
		msgs = append(msgs, m)
	}
	require.NoError(t, pub.Publish("orders", msgs...))

	hook.mu.Lock()
	assert.Equal(t, []int{100}, hook.pipelines, "one Publish of 100 messages must be one pipeline of 100 XADDs")
	assert.Zero(t, hook.singles)
	hook.mu.Unlock()

	entries, err := e.client.XRange(context.Background(), e.prefix+"orders", "-", "+").Result()
	require.NoError(t, err)
	require.Len(t, entries, 100)
	for i, entry := range entries {
		got, err := omniredis.DefaultMarshaler{}.Unmarshal(entry.Values)
		require.NoError(t, err)
		assert.Equal(t, msgs[i].UUID, got.UUID, "entry %d out of order", i)
		assert.Equal(t, "payload", string(got.Payload))
		assert.Equal(t, "order-1", bus.PartitionKey(got))
		assert.Equal(t, "y", got.Metadata.Get("x"))
	}
}

func TestPublisher_ConcurrentPublishesShareRoundTrips(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	client := testenv.NewRedisClient(t)
	hook := &pipelineCounter{}
	client.AddHook(hook)
	pub, err := omniredis.NewPublisher(omniredis.PublisherConfig{Client: client, StreamPrefix: e.prefix, Pipelines: 1}, nil)
	require.NoError(t, err)
	defer pub.Close()

	const callers, each = 32, 20
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() {
			for range each {
				assert.NoError(t, pub.Publish("orders", message.NewMessage(watermill.NewUUID(), []byte("x"))))
			}
		})
	}
	wg.Wait()
	n, err := e.client.XLen(context.Background(), e.prefix+"orders").Result()
	require.NoError(t, err)
	assert.EqualValues(t, callers*each, n)
	hook.mu.Lock()
	defer hook.mu.Unlock()
	trips := hook.singles + len(hook.pipelines)
	assert.Less(t, trips, callers*each, "concurrent Publish calls never shared a round trip")
}

func TestPublisher_MaxLenTrimsApproximately(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	pub, err := omniredis.NewPublisher(omniredis.PublisherConfig{Client: e.client, StreamPrefix: e.prefix, MaxLen: 100}, nil)
	require.NoError(t, err)
	defer pub.Close()
	for range 10 {
		e.publish(pub, "orders", 100)
	}
	n, err := e.client.XLen(context.Background(), e.prefix+"orders").Result()
	require.NoError(t, err)
	assert.GreaterOrEqual(t, n, int64(100))
	assert.Less(t, n, int64(1000), "MaxLen did not trim")
}

func TestPublisher_ConnectionRefusedIsTransient(t *testing.T) {
	t.Parallel()
	client := goredis.NewClient(&goredis.Options{Addr: closedAddr(t), MaxRetries: -1, DialTimeout: time.Second})
	defer client.Close()
	pub, err := omniredis.NewPublisher(omniredis.PublisherConfig{Client: client}, nil)
	require.NoError(t, err)
	defer pub.Close()

	for _, n := range []int{1, 3} {
		var msgs []*message.Message
		for range n {
			msgs = append(msgs, message.NewMessage(watermill.NewUUID(), []byte("x")))
		}
		err := pub.Publish("orders", msgs...)
		require.Error(t, err)
		assert.Equal(t, bus.ClassTransient, bus.ClassOf(err), "connection refused must be transient: %v", err)
	}
}

func TestClose_LeavesCallersClientUsable(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	client := testenv.NewRedisClient(t)
	pub, err := omniredis.NewPublisher(omniredis.PublisherConfig{Client: client, StreamPrefix: e.prefix}, nil)
	require.NoError(t, err)
	cfg := e.fastSubscriberConfig("billing")
	cfg.Client = client
	sub, err := omniredis.NewSubscriber(cfg, nil)
	require.NoError(t, err)

	msgs, err := sub.Subscribe(ctx, "orders")
	require.NoError(t, err)
	e.publish(pub, "orders", 1)
	receive(t, msgs, 5*time.Second).Ack()

	for range 2 { // Close is idempotent
		require.NoError(t, pub.Close())
		require.NoError(t, sub.Close())
	}
	_, open := <-msgs
	assert.False(t, open, "messages channel open after Close")
	assert.NoError(t, client.Ping(ctx).Err(), "the caller's client was closed")
	assert.NoError(t, client.XAdd(ctx, &goredis.XAddArgs{Stream: e.prefix + "orders", Values: []any{"a", "b"}}).Err())

	assert.True(t, errors.Is(pub.Publish("orders", message.NewMessage(watermill.NewUUID(), nil)), omniredis.ErrClosed))
	_, err = sub.Subscribe(ctx, "orders")
	assert.True(t, errors.Is(err, omniredis.ErrClosed))
}

func TestAddr_OpensAndClosesItsOwnClient(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	pub, err := omniredis.NewPublisher(omniredis.PublisherConfig{Addr: testenv.RedisAddr(), StreamPrefix: e.prefix}, nil)
	require.NoError(t, err)
	sub, err := omniredis.NewSubscriber(omniredis.SubscriberConfig{
		Addr: testenv.RedisAddr(), StreamPrefix: e.prefix, ConsumerGroup: "billing", BlockTime: 100 * time.Millisecond,
	}, nil)
	require.NoError(t, err)
	msgs, err := sub.Subscribe(context.Background(), "orders")
	require.NoError(t, err)
	published := e.publish(pub, "orders", 1)
	msg := receive(t, msgs, 5*time.Second)
	assert.Equal(t, published[0].UUID, msg.UUID)
	msg.Ack()
	require.NoError(t, pub.Close())
	require.NoError(t, sub.Close())
}

// closedAddr returns an address on which nothing listens: connecting to it
// is refused.
func closedAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	return addr
}

func TestPublisher_OutOfMemoryIsTransientAndNothingIsWritten(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, client := startPlainRedis(t, "--maxmemory", "1", "--maxmemory-policy", "noeviction")
	pub, err := omniredis.NewPublisher(omniredis.PublisherConfig{Client: client}, nil)
	require.NoError(t, err)
	defer pub.Close()

	for _, n := range []int{1, 3} { // one XADD, and a pipeline
		var msgs []*message.Message
		for range n {
			msgs = append(msgs, message.NewMessage(watermill.NewUUID(), []byte("x")))
		}
		err := pub.Publish("orders", msgs...)
		require.Error(t, err, "Publish of %d message(s) to a Redis out of memory", n)
		assert.True(t, goredis.IsOOMError(err), "Publish of %d message(s) failed with %v, not OOM", n, err)
		assert.Equal(t, bus.ClassTransient, bus.ClassOf(err), "OOM must be transient: %v", err)
	}
	n, err := client.XLen(ctx, "orders").Result()
	require.NoError(t, err)
	assert.Zero(t, n, "entries were written while Redis refused writes")

	require.NoError(t, client.ConfigSet(ctx, "maxmemory", "0").Err(), "lift maxmemory on the private server")
	require.NoError(t, pub.Publish("orders", message.NewMessage(watermill.NewUUID(), []byte("x"))))
}

// TestPublisher_EntryOverMaxEntryBytesIsPermanentAndNothingIsWritten: a
// value larger than the server takes (proto-max-bulk-len) makes Redis drop
// the connection in the middle of a pipeline, which looks like an outage
// and would be retried for ever, breaking the pipelines of other callers
// each time. The Publisher refuses such an entry before writing anything.
func TestPublisher_EntryOverMaxEntryBytesIsPermanentAndNothingIsWritten(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, client := startPlainRedis(t, "--proto-max-bulk-len", "1mb")
	pub, err := omniredis.NewPublisher(omniredis.PublisherConfig{Client: client, MaxEntryBytes: 1 << 20}, nil)
	require.NoError(t, err)
	defer pub.Close()

	small := func() *message.Message { return message.NewMessage(watermill.NewUUID(), []byte("x")) }
	big := message.NewMessage(watermill.NewUUID(), make([]byte, 2<<20))
	err = pub.Publish("orders", small(), big, small())
	require.Error(t, err)
	assert.Equal(t, bus.ClassPermanent, bus.ClassOf(err), "an entry the server cannot take must be permanent: %v", err)
	assert.ErrorContains(t, err, `"payload"`, "the error must name the field that is too large")
	assert.ErrorContains(t, err, big.UUID, "the error must name the message")
	n, err := client.XLen(ctx, "orders").Result()
	require.NoError(t, err)
	assert.Zero(t, n, "entries of a refused Publish were written")

	require.NoError(t, pub.Publish("orders", small(), small()), "the Publisher must still work")
}

// A Publish that times out (its message's deadline passes while Redis does
// not answer) was attempted: it is counted, like any failure of an attempted
// message (DESIGN §3), so a message that always times out reaches its
// budget. A cancelled one (a relay shutting down) is transient.
func TestPublisher_TimeoutIsCountedCancellationTransient(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, client := startPlainRedis(t)
	pub, err := omniredis.NewPublisher(omniredis.PublisherConfig{Client: client}, nil)
	require.NoError(t, err)
	defer pub.Close()
	// The first Publish to a topic reads its shard count; this test is about
	// the writes.
	require.NoError(t, pub.Publish("orders", message.NewMessage(watermill.NewUUID(), []byte("first"))))
	// Hold every write on the private server for a while.
	require.NoError(t, client.Do(ctx, "CLIENT", "PAUSE", "3000", "WRITE").Err())
	defer client.Do(ctx, "CLIENT", "UNPAUSE")

	msg := message.NewMessage(watermill.NewUUID(), []byte("slow"))
	mctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	msg.SetContext(mctx)
	err = pub.Publish("orders", msg)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Equal(t, bus.ClassCounted, bus.ClassOf(err), "a publish that timed out was attempted: %v", err)

	msg = message.NewMessage(watermill.NewUUID(), []byte("cancelled"))
	cctx, stop := context.WithCancel(ctx)
	msg.SetContext(cctx)
	go func() { time.Sleep(100 * time.Millisecond); stop() }()
	err = pub.Publish("orders", msg)
	require.ErrorIs(t, err, context.Canceled)
	assert.Equal(t, bus.ClassTransient, bus.ClassOf(err), "a cancelled publish says nothing about the message: %v", err)
}

// gate holds every XADD to a stream whose name ends in a held suffix until
// the suffix is let go, then fails it with errGated instead of sending it.
type gate struct {
	mu      sync.Mutex
	held    map[string]chan struct{}
	arrived chan string
}

// let lets the XADDs to streams ending in suffix go; a second call does
// nothing.
func (g *gate) let(suffix string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-g.held[suffix]:
	default:
		close(g.held[suffix])
	}
}

var errGated = errors.New("gated")

func (g *gate) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (g *gate) wait(cmd goredis.Cmder) bool {
	if cmd.Name() != "xadd" {
		return false
	}
	stream, _ := cmd.Args()[1].(string)
	g.mu.Lock()
	var release chan struct{}
	for suffix, ch := range g.held {
		if strings.HasSuffix(stream, suffix) {
			release = ch
		}
	}
	g.mu.Unlock()
	if release == nil {
		return false
	}
	g.arrived <- stream
	<-release
	return true
}

func (g *gate) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		if g.wait(cmd) {
			cmd.SetErr(errGated)
			return errGated
		}
		return next(ctx, cmd)
	}
}

func (g *gate) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return next
}

// A Publish that stops waiting when its context ends leaves its request to
// the pipeline that carries it: the late result of that pipeline reaches
// nobody else's Publish (requests are recycled).
func TestPublisher_AnAbandonedCallsLateResultReachesNoOtherCall(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	client := testenv.NewRedisClient(t)
	g := &gate{held: map[string]chan struct{}{"abandoned": make(chan struct{}), "waiting": make(chan struct{})}, arrived: make(chan string, 2)}
	client.AddHook(g)
	pub, err := omniredis.NewPublisher(omniredis.PublisherConfig{Client: client, StreamPrefix: e.prefix, Pipelines: 2}, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	t.Cleanup(func() { g.let("abandoned"); g.let("waiting") }) // first: Close waits for the pipelines

	ctx, cancel := context.WithCancel(context.Background())
	abandoned := message.NewMessage(watermill.NewUUID(), []byte("x"))
	abandoned.SetContext(ctx)
	result := make(chan error, 1)
	go func() { result <- pub.Publish("abandoned", abandoned) }()
	<-g.arrived // its pipeline is on the wire
	cancel()
	err = <-result
	require.ErrorIs(t, err, context.Canceled)

	// The next call is held too, on the other pipeline, until the
	// abandoned call's pipeline has come back with its error.
	waiting := make(chan error, 1)
	go func() { waiting <- pub.Publish("waiting", message.NewMessage(watermill.NewUUID(), []byte("y"))) }()
	<-g.arrived
	g.let("abandoned")
	time.Sleep(50 * time.Millisecond)
	select {
	case err := <-waiting:
		t.Fatalf("a Publish returned before its own pipeline did: %v", err)
	default:
	}
	g.let("waiting")
	err = <-waiting
	require.ErrorIs(t, err, errGated, "its own pipeline's error")

	// And a call after both gets its own result.
	require.NoError(t, pub.Publish("orders", message.NewMessage(watermill.NewUUID(), []byte("z"))))
}
