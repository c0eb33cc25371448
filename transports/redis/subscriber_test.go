package redis_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
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

func TestSubscriber_ReclaimsEntriesOfADeadConsumer(t *testing.T) {
	t.Parallel()
	forEachServer(t, testReclaimsEntriesOfADeadConsumer)
}

func testReclaimsEntriesOfADeadConsumer(t *testing.T, e *env) {
	ctx := context.Background()
	const topic, group = "orders", "billing"
	stream := e.prefix + topic

	sub := e.subscriber(e.fastSubscriberConfig(group))
	require.NoError(t, sub.SubscribeInitialize(topic))
	published := e.publish(e.publisher(), topic, 20)

	// A consumer reads half the entries and dies without acking them.
	readAt := time.Now()
	res, err := e.client.XReadGroup(ctx, &goredis.XReadGroupArgs{
		Group: group, Consumer: "dead", Streams: []string{stream, ">"}, Count: 10,
	}).Result()
	require.NoError(t, err)
	require.Len(t, res[0].Messages, 10)
	deadIDs := map[string]bool{}
	for _, xm := range res[0].Messages {
		deadIDs[xm.ID] = true
	}

	msgs := e.subscribe(sub, topic)
	got := map[string]bus.Delivery{}
	for len(got) < len(published) {
		msg := receive(t, msgs, 10*time.Second)
		d, ok := bus.DeliveryOf(msg)
		require.True(t, ok, "message carries no Delivery")
		if deadIDs[d.ID] {
			// Redis keeps an entry's idle time in whole milliseconds: allow one.
			assert.GreaterOrEqual(t, time.Since(readAt), time.Second-time.Millisecond,
				"entry %s of the dead consumer was reclaimed before ClaimIdle (1s)", d.ID)
		}
		got[msg.UUID] = d
		msg.Ack()
	}

	for _, m := range published {
		d, ok := got[m.UUID]
		require.True(t, ok, "message %s was lost", m.UUID)
		want := 0
		if deadIDs[d.ID] {
			want = 1 // the dead consumer's delivery counts
		}
		assert.Equal(t, want, d.Attempts, "attempts of entry %s", d.ID)
		assert.Equal(t, stream, d.Source)
		assert.Equal(t, topic, d.Topic)
	}
	assert.EqualValues(t, 10, sub.Stats().Reclaimed)
	testenv.Eventually(t, 5*time.Second, func() bool { return e.pending(stream, group) == 0 },
		"entries still pending after every message was acked")
}

func TestSubscriber_CloseHandsHeldEntriesBackAtOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const topic, group = "orders", "billing"

	cfg := e.fastSubscriberConfig(group)
	cfg.ClaimIdle = time.Minute // a reclaim by idle time would take a minute
	cfg.MaxInFlight = 4
	first := e.subscriber(cfg)
	require.NoError(t, first.SubscribeInitialize(topic))
	published := e.publish(e.publisher(), topic, 10)

	msgs := e.subscribe(first, topic)
	held := receive(t, msgs, 5*time.Second) // handed out, never acked
	_ = held
	testenv.Eventually(t, 5*time.Second, func() bool { return e.pending(e.prefix+topic, group) == 4 },
		"the first subscriber should hold MaxInFlight (4) entries")
	require.NoError(t, first.Close())

	second := e.subscriber(cfg)
	msgs = e.subscribe(second, topic)
	seen := map[string]bool{}
	for len(seen) < len(published) {
		msg := receive(t, msgs, 5*time.Second) // well below ClaimIdle
		d, _ := bus.DeliveryOf(msg)
		assert.Equal(t, 0, d.Attempts, "an interrupted delivery must not count as an attempt")
		seen[msg.UUID] = true
		msg.Ack()
	}
}

func TestSubscriber_NackWithSettlementDelayRedeliversLaterThenDeadLetters(t *testing.T) {
	t.Parallel()
	forEachServer(t, testNackWithSettlementDelayRedeliversLaterThenDeadLetters)
}

func testNackWithSettlementDelayRedeliversLaterThenDeadLetters(t *testing.T, e *env) {
	ctx := context.Background()
	const topic, group = "orders", "billing"
	stream := e.prefix + topic
	const delay = 200 * time.Millisecond
	const budget = 3

	sub := e.subscriber(e.fastSubscriberConfig(group))
	require.NoError(t, sub.SubscribeInitialize(topic))
	pub := e.publisher()
	poison := message.NewMessage(watermill.NewUUID(), []byte("poison"))
	poison.Metadata.Set("k", "v")
	require.NoError(t, pub.Publish(topic, poison))

	msgs := e.subscribe(sub, topic)
	var entryID string
	var retryAt time.Time
	for attempt := range budget {
		msg := receive(t, msgs, 5*time.Second)
		require.Equal(t, poison.UUID, msg.UUID)
		d, _ := bus.DeliveryOf(msg)
		if attempt > 0 {
			// Measured against the RetryAt the settlement carried: a time
			// taken after Settle and Nack would be later than it.
			early := retryAt.Sub(time.Now())
			assert.LessOrEqual(t, early, time.Duration(0),
				"redelivered %s before the settlement's retry time", early)
			assert.Equal(t, entryID, d.ID, "redelivery of another entry")
		}
		entryID = d.ID
		assert.Equal(t, attempt, d.Attempts, "delivery count must grow with each counted failure")
		assert.EqualValues(t, attempt+1, pendingDeliveries(t, e, stream, group, d.ID))

		st := bus.Settlement{Class: bus.ClassCounted, Error: fmt.Sprintf("boom %d", attempt)}
		if attempt == budget-1 {
			st.GiveUp = true
			st.Error = "boom: budget spent"
		} else {
			st.RetryAt = time.Now().Add(delay)
			retryAt = st.RetryAt
		}
		require.True(t, bus.Settle(msg, st))
		msg.Nack()
	}

	deadLetter := stream + omniredis.DefaultDeadLetterSuffix
	testenv.Eventually(t, 5*time.Second, func() bool { return e.pending(stream, group) == 0 },
		"a given-up entry must no longer be pending")
	entries, err := e.client.XRange(ctx, deadLetter, "-", "+").Result()
	require.NoError(t, err)
	require.Len(t, entries, 1, "dead-letter stream %s", deadLetter)
	dl, err := omniredis.DefaultMarshaler{}.Unmarshal(entries[0].Values)
	require.NoError(t, err)
	assert.Equal(t, poison.UUID, dl.UUID)
	assert.Equal(t, "poison", string(dl.Payload))
	assert.Equal(t, "v", dl.Metadata.Get("k"))
	assert.Equal(t, omniredis.DeadLetterReasonGaveUp, dl.Metadata.Get(omniredis.KeyDeadLetterReason))
	assert.Equal(t, "boom: budget spent", dl.Metadata.Get(omniredis.KeyDeadLetterError))
	assert.Equal(t, "counted", dl.Metadata.Get(omniredis.KeyDeadLetterClass))
	assert.Equal(t, strconv.Itoa(budget), dl.Metadata.Get(omniredis.KeyDeadLetterAttempts))
	assert.Equal(t, stream, dl.Metadata.Get(omniredis.KeyDeadLetterStream))
	assert.Equal(t, entryID, dl.Metadata.Get(omniredis.KeyDeadLetterID))
	assert.Equal(t, group, dl.Metadata.Get(omniredis.KeyDeadLetterGroup))
	assert.EqualValues(t, 1, sub.Stats().DeadLettered)

	select {
	case msg := <-msgs:
		t.Fatalf("dead-lettered message %s delivered again", msg.UUID)
	case <-time.After(2 * delay):
	}
}

func TestSubscriber_TransientNackSpendsNoAttempt(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const topic, group = "orders", "billing"
	sub := e.subscriber(e.fastSubscriberConfig(group))
	require.NoError(t, sub.SubscribeInitialize(topic))
	e.publish(e.publisher(), topic, 1)
	msgs := e.subscribe(sub, topic)

	for range 3 {
		msg := receive(t, msgs, 5*time.Second)
		d, _ := bus.DeliveryOf(msg)
		require.Equal(t, 0, d.Attempts, "a transient failure spent an attempt")
		bus.Settle(msg, bus.Settlement{Class: bus.ClassTransient, RetryAt: time.Now().Add(20 * time.Millisecond), Error: "broker down"})
		msg.Nack()
	}
	msg := receive(t, msgs, 5*time.Second)
	d, _ := bus.DeliveryOf(msg)
	assert.Equal(t, 0, d.Attempts)
	msg.Ack()
}

func TestSubscriber_PlainNackRedeliversAfterNackDelayAndNeverDeadLetters(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	const topic, group = "orders", "billing"
	stream := e.prefix + topic
	cfg := e.fastSubscriberConfig(group)
	cfg.NackDelay = 150 * time.Millisecond
	sub := e.subscriber(cfg)
	require.NoError(t, sub.SubscribeInitialize(topic))
	e.publish(e.publisher(), topic, 1)
	msgs := e.subscribe(sub, topic)

	var last time.Time
	for i := range 6 {
		msg := receive(t, msgs, 5*time.Second)
		d, _ := bus.DeliveryOf(msg)
		require.Equal(t, i, d.Attempts)
		if i > 0 {
			assert.GreaterOrEqual(t, time.Since(last), cfg.NackDelay, "redelivered before NackDelay")
		}
		last = time.Now()
		if i == 5 {
			msg.Ack()
			break
		}
		msg.Nack()
	}
	testenv.Eventually(t, 5*time.Second, func() bool { return e.pending(stream, group) == 0 }, "acked entry still pending")
	n, err := e.client.Exists(ctx, stream+omniredis.DefaultDeadLetterSuffix).Result()
	require.NoError(t, err)
	assert.Zero(t, n, "a plain nack must never dead-letter")
}

// A message's context carries its delivery while a handler runs, and ends
// once the message is settled: work a handler left running on it stops.
func TestSubscriber_AMessagesContextEndsWhenItIsSettled(t *testing.T) {
	t.Parallel()
	msgs := subscribeTo(t, 2)
	for _, settle := range []func(*message.Message) bool{(*message.Message).Ack, (*message.Message).Nack} {
		msg := receive(t, msgs, 5*time.Second)
		ctx := msg.Context()
		_, ok := bus.DeliveryFromContext(ctx)
		require.True(t, ok, "the message's context carries no delivery")
		require.NoError(t, ctx.Err(), "the context ended before the message was settled")
		done := ctx.Done() // asked for before the settlement
		settle(msg)
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatal("the message's context did not end when it was settled")
		}
		assert.ErrorIs(t, ctx.Err(), context.Canceled)
		assert.ErrorIs(t, context.Cause(ctx), context.Canceled)
		select {
		case <-ctx.Done(): // asked for after it
		default:
			t.Error("a Done channel asked for after the settlement is open")
		}
	}
}

// Contexts derived from a message's context (a Timeout middleware's, a
// handler's context.WithCancel or context.AfterFunc) end with it, and
// deriving them starts no goroutine that waits for it to end.
func TestSubscriber_ContextsDerivedFromAMessagesEndWithItWithoutAGoroutineEach(t *testing.T) {
	t.Parallel()
	msg := receive(t, subscribeTo(t, 1), 5*time.Second)

	const derived = 200
	watchers := cancelWatchers() // other tests' own, if any
	children := make([]context.Context, 0, derived)
	var ran atomic.Int32
	stopped := context.AfterFunc(msg.Context(), func() { t.Error("a stopped AfterFunc ran") })
	for i := range derived {
		var child context.Context
		var cancel context.CancelFunc
		switch i % 3 {
		case 0:
			child, cancel = context.WithTimeout(msg.Context(), time.Hour)
		case 1:
			child, cancel = context.WithCancel(msg.Context())
		default:
			context.AfterFunc(msg.Context(), func() { ran.Add(1) })
			continue
		}
		t.Cleanup(cancel)
		children = append(children, child)
	}
	assert.Less(t, cancelWatchers()-watchers, derived/4,
		"deriving %d contexts from a message's started a goroutine for each that waits for it", derived)
	assert.True(t, stopped(), "an AfterFunc could not be stopped before the message was settled")

	msg.Ack()
	for i, child := range children {
		select {
		case <-child.Done():
		case <-time.After(5 * time.Second):
			t.Fatalf("derived context %d did not end when the message was settled", i)
		}
		assert.ErrorIs(t, child.Err(), context.Canceled)
	}
	testenv.Eventually(t, 5*time.Second, func() bool { return int(ran.Load()) == derived/3 },
		"AfterFuncs of a message's context did not all run when it was settled")
}

// subscribeTo publishes n messages to a topic of its own and subscribes to
// it with the fast test settings.
func subscribeTo(t *testing.T, n int) <-chan *message.Message {
	e := newEnv(t)
	const topic = "orders"
	sub := e.subscriber(e.fastSubscriberConfig("billing"))
	require.NoError(t, sub.SubscribeInitialize(topic))
	e.publish(e.publisher(), topic, n)
	return e.subscribe(sub, topic)
}

// cancelWatchers counts the goroutines the context package started to pass
// a parent's end on to a derived context (for parents it cannot register
// with).
func cancelWatchers() int {
	var b strings.Builder
	_ = pprof.Lookup("goroutine").WriteTo(&b, 2)
	n := 0
	for _, g := range strings.Split(b.String(), "\n\n") {
		if strings.Contains(g, "context.(*cancelCtx).propagateCancel") {
			n++
		}
	}
	return n
}

func TestSubscriber_SlowHandlerKeepsItsEntry(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const topic, group = "orders", "billing"
	cfg := e.fastSubscriberConfig(group) // ClaimIdle 1s
	slow := e.subscriber(cfg)
	require.NoError(t, slow.SubscribeInitialize(topic))
	e.publish(e.publisher(), topic, 1)
	msg := receive(t, e.subscribe(slow, topic), 5*time.Second)

	other := e.subscriber(cfg)
	stolen := e.subscribe(other, topic)
	select {
	case m := <-stolen:
		t.Fatalf("entry %s reclaimed from a live subscriber whose handler runs past ClaimIdle", m.UUID)
	case <-time.After(2500 * time.Millisecond):
	}
	msg.Ack()
	testenv.Eventually(t, 5*time.Second, func() bool { return e.pending(e.prefix+topic, group) == 0 }, "acked entry still pending")
}

// One subscription hands its entries out in stream order, however many are
// in flight (one goroutine hands out; see deliver.go), when none is nacked.
func TestSubscriber_HandsEntriesOutInStreamOrder(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const topic, n = "orders", 3000
	sub := e.subscriber(e.fastSubscriberConfig("billing"))
	require.NoError(t, sub.SubscribeInitialize(topic))
	pub := e.publisher()
	var want []string
	for chunk := range 30 {
		msgs := make([]*message.Message, n/30)
		for i := range msgs {
			msgs[i] = message.NewMessage(watermill.NewUUID(), []byte(strconv.Itoa(chunk*len(msgs)+i)))
			want = append(want, string(msgs[i].Payload))
		}
		require.NoError(t, pub.Publish(topic, msgs...))
	}
	got := make([]string, 0, n)
	msgs := e.subscribe(sub, topic)
	for len(got) < n {
		msg := receive(t, msgs, 10*time.Second)
		got = append(got, string(msg.Payload))
		go msg.Ack() // as a router does
	}
	for i := range want {
		require.Equal(t, want[i], got[i], "message %d of %d out of stream order", i, n)
	}
}

// A message whose handler takes long does not hold back the others: their
// acks are noticed, their slots freed and their entries acknowledged while
// it is still out.
func TestSubscriber_ASlowMessageDoesNotHoldBackTheOthersAcks(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const topic, group, n = "orders", "billing", 40
	cfg := e.fastSubscriberConfig(group)
	cfg.MaxInFlight = 4
	sub := e.subscriber(cfg)
	require.NoError(t, sub.SubscribeInitialize(topic))
	e.publish(e.publisher(), topic, n)
	msgs := e.subscribe(sub, topic)

	slow := receive(t, msgs, 5*time.Second)
	for range n - 1 {
		receive(t, msgs, 5*time.Second).Ack()
	}
	testenv.Eventually(t, 5*time.Second, func() bool { return e.pending(e.prefix+topic, group) == 1 },
		"the others' entries acknowledged while the slow one is out")
	slow.Ack()
	testenv.Eventually(t, 5*time.Second, func() bool { return e.pending(e.prefix+topic, group) == 0 }, "acked entry still pending")
}

// An entry is acked before its XACK reaches Redis (acks are batched, and
// Redis may be slow). A reclaim that runs in between, on an entry idle for
// ClaimIdle, takes the entry back into the subscription's own pending list:
// that is not a new entry to hand out again.
func TestSubscriber_AnAckOnItsWayIsNotReclaimedFromItself(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const topic, group = "orders", "billing"
	client := testenv.NewRedisClient(t)
	slowAcks := &xackGate{held: make(chan struct{}), arrived: make(chan struct{}, 1)}
	client.AddHook(slowAcks)
	cfg := e.fastSubscriberConfig(group) // ClaimIdle 1s, ClaimInterval 100ms
	cfg.Client = client
	sub := e.subscriber(cfg)
	release := sync.OnceFunc(func() { close(slowAcks.held) })
	t.Cleanup(release) // before the Subscriber's Close, which flushes acks
	require.NoError(t, sub.SubscribeInitialize(topic))
	msgs := e.subscribe(sub, topic)
	published := e.publish(e.publisher(), topic, 1)

	msg := receive(t, msgs, 5*time.Second)
	require.Equal(t, published[0].UUID, msg.UUID)
	msg.Ack()
	select {
	case <-slowAcks.arrived:
	case <-time.After(5 * time.Second):
		t.Fatal("the ack's XACK was never sent")
	}
	// The XACK is held past ClaimIdle and several reclaims.
	select {
	case m := <-msgs:
		t.Fatalf("acked entry %s handed out again: reclaimed from this subscription while its XACK was on its way", m.UUID)
	case <-time.After(2 * time.Second):
	}
	release()
	testenv.Eventually(t, 5*time.Second, func() bool { return e.pending(e.prefix+topic, group) == 0 }, "acked entry still pending")
	select {
	case m := <-msgs:
		t.Fatalf("acked entry %s handed out again after its XACK", m.UUID)
	case <-time.After(1500 * time.Millisecond):
	}
}

// xackGate holds every XACK until held is closed, and signals the first.
type xackGate struct {
	held    chan struct{}
	arrived chan struct{}
}

func (g *xackGate) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (g *xackGate) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		if cmd.Name() == "xack" {
			select {
			case g.arrived <- struct{}{}:
			default:
			}
			<-g.held
		}
		return next(ctx, cmd)
	}
}

func (g *xackGate) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return next
}

func TestSubscriber_UndecodableEntryGoesToDeadLetterStream(t *testing.T) {
	t.Parallel()
	forEachServer(t, testUndecodableEntryGoesToDeadLetterStream)
}

func testUndecodableEntryGoesToDeadLetterStream(t *testing.T, e *env) {
	ctx := context.Background()
	const topic, group = "orders", "billing"
	stream := e.prefix + topic
	sub := e.subscriber(e.fastSubscriberConfig(group))
	require.NoError(t, sub.SubscribeInitialize(topic))

	badID, err := e.client.XAdd(ctx, &goredis.XAddArgs{Stream: stream, Values: []any{"foo", "bar"}}).Result()
	require.NoError(t, err)
	good := e.publish(e.publisher(), topic, 1)[0]

	msg := receive(t, e.subscribe(sub, topic), 5*time.Second)
	assert.Equal(t, good.UUID, msg.UUID)
	msg.Ack()

	testenv.Eventually(t, 5*time.Second, func() bool { return e.pending(stream, group) == 0 }, "entries still pending")
	entries, err := e.client.XRange(ctx, stream+omniredis.DefaultDeadLetterSuffix, "-", "+").Result()
	require.NoError(t, err)
	require.Len(t, entries, 1)
	v := entries[0].Values
	assert.Equal(t, "bar", v["foo"])
	assert.Equal(t, badID, v[omniredis.FieldMetadataPrefix+omniredis.KeyDeadLetterID])
	assert.Equal(t, omniredis.DeadLetterReasonUndecodable, v[omniredis.FieldMetadataPrefix+omniredis.KeyDeadLetterReason])
	assert.NotEmpty(t, v[omniredis.FieldMetadataPrefix+omniredis.KeyDeadLetterError])
	assert.Equal(t, "permanent", v[omniredis.FieldMetadataPrefix+omniredis.KeyDeadLetterClass])
	assert.EqualValues(t, 1, sub.Stats().Undecodable)
}

func TestSubscriber_TrimmedPendingEntryIsReported(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	const topic, group = "orders", "billing"
	stream := e.prefix + topic
	sub := e.subscriber(e.fastSubscriberConfig(group))
	require.NoError(t, sub.SubscribeInitialize(topic))
	published := e.publish(e.publisher(), topic, 3)

	res, err := e.client.XReadGroup(ctx, &goredis.XReadGroupArgs{
		Group: group, Consumer: "dead", Streams: []string{stream, ">"}, Count: 3,
	}).Result()
	require.NoError(t, err)
	require.NoError(t, e.client.XDel(ctx, stream, res[0].Messages[0].ID).Err())

	msgs := e.subscribe(sub, topic)
	for range 2 {
		msg := receive(t, msgs, 10*time.Second)
		assert.NotEqual(t, published[0].UUID, msg.UUID)
		msg.Ack()
	}
	testenv.Eventually(t, 5*time.Second, func() bool { return sub.Stats().TrimmedPending == 1 },
		"trimmed pending entry not reported (TrimmedPending = %d)", sub.Stats().TrimmedPending)
	testenv.Eventually(t, 5*time.Second, func() bool { return e.pending(stream, group) == 0 }, "entries still pending")
}

func TestSubscriber_OrderByKeyHandsOutOneAtATimeInStreamOrder(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const topic, group = "orders", "billing"
	cfg := e.fastSubscriberConfig(group)
	cfg.OrderByKey = true
	cfg.NackDelay = 10 * time.Millisecond
	sub := e.subscriber(cfg)
	require.NoError(t, sub.SubscribeInitialize(topic))

	const keys, perKey = 5, 40
	var batch []*message.Message
	want := map[string][]string{}
	for i := range keys * perKey {
		key := "key-" + strconv.Itoa(i%keys)
		m := message.NewMessage(watermill.NewUUID(), []byte(key))
		bus.SetPartitionKey(m, key)
		batch = append(batch, m)
		want[key] = append(want[key], m.UUID)
	}
	require.NoError(t, e.publisher().Publish(topic, batch...))

	msgs := e.subscribe(sub, topic)
	var mu sync.Mutex
	busy := map[string]bool{}
	got := map[string][]string{}
	nacked := map[string]bool{}
	var wg sync.WaitGroup
	done := 0
	for done < keys*perKey {
		msg := receive(t, msgs, 10*time.Second)
		key := bus.PartitionKey(msg)
		mu.Lock()
		require.False(t, busy[key], "two messages of key %s out at once", key)
		busy[key] = true
		// Nack every seventh message once: its key must wait for it.
		nack := !nacked[msg.UUID] && len(got[key])%7 == 3
		if nack {
			nacked[msg.UUID] = true
		} else {
			got[key] = append(got[key], msg.UUID)
			done++
		}
		mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(time.Duration(rand.IntN(2000)) * time.Microsecond) // handler work
			mu.Lock()
			busy[key] = false
			mu.Unlock()
			if nack {
				msg.Nack()
			} else {
				msg.Ack()
			}
		}()
	}
	wg.Wait()
	for key, ids := range want {
		assert.True(t, slices.Equal(ids, got[key]), "key %s handled out of stream order", key)
	}
}

func TestSubscriber_SubscribeAfterCloseFails(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	sub := e.subscriber(e.fastSubscriberConfig("g"))
	require.NoError(t, sub.Close())
	_, err := sub.Subscribe(context.Background(), "orders")
	assert.True(t, errors.Is(err, omniredis.ErrClosed), "Subscribe after Close: %v", err)
}

func pendingDeliveries(t *testing.T, e *env, stream, group, id string) int64 {
	t.Helper()
	p, err := e.client.XPendingExt(context.Background(), &goredis.XPendingExtArgs{
		Stream: stream, Group: group, Start: id, End: id, Count: 1,
	}).Result()
	require.NoError(t, err)
	require.Len(t, p, 1, "entry %s not pending", id)
	return p[0].RetryCount
}

// TestSubscriber_OrderByKeyKeepsEachKeysOrderWithManyInFlight: the
// universal suite cannot check per-key order (its order test has no
// partition keys and spreads the stream over ten subscribers), so this
// test does. Publishers of eight keys publish concurrently into one stream
// while the subscription reads it; the first message of every key is held
// until all eight are out at once (several in flight, across keys), later
// ones are handled with random delays and some are nacked once. Each key
// must be handled one message at a time, in the order it was published.
func TestSubscriber_OrderByKeyKeepsEachKeysOrderWithManyInFlight(t *testing.T) {
	t.Parallel()
	forEachServer(t, testOrderByKeyKeepsEachKeysOrderWithManyInFlight)
}

func testOrderByKeyKeepsEachKeysOrderWithManyInFlight(t *testing.T, e *env) {
	const topic, group = "orders", "billing"
	const keys, perKey = 8, 40
	cfg := e.fastSubscriberConfig(group)
	cfg.OrderByKey = true
	cfg.BatchSize = 7 // many small reads, interleaved with the publishers
	cfg.NackDelay = 5 * time.Millisecond
	sub := e.subscriber(cfg)
	require.NoError(t, sub.SubscribeInitialize(topic))
	msgs := e.subscribe(sub, topic)
	pub := e.publisher()

	keyOf := func(k int) string { return "key-" + strconv.Itoa(k) }
	newMsg := func(k, i int) *message.Message {
		m := message.NewMessage(watermill.NewUUID(), []byte(keyOf(k)+"/"+strconv.Itoa(i)))
		bus.SetPartitionKey(m, keyOf(k))
		return m
	}
	var pmu sync.Mutex
	published := map[string][]string{}
	// The first message of every key goes out in one call, so that each
	// key has a message to hold before the stream fills up.
	var firsts []*message.Message
	for k := range keys {
		m := newMsg(k, 0)
		firsts = append(firsts, m)
		published[keyOf(k)] = append(published[keyOf(k)], string(m.Payload))
	}
	require.NoError(t, pub.Publish(topic, firsts...))
	var pubs sync.WaitGroup
	for k := range keys {
		pubs.Go(func() {
			for i := 1; i < perKey; i++ {
				m := newMsg(k, i)
				// One goroutine per key: a key's stream order is the order
				// of its Publish calls.
				if !assert.NoError(t, pub.Publish(topic, m)) {
					return
				}
				pmu.Lock()
				published[keyOf(k)] = append(published[keyOf(k)], string(m.Payload))
				pmu.Unlock()
			}
		})
	}

	var (
		mu      sync.Mutex
		busy    = map[string]bool{}
		handled = map[string][]string{}
		nacked  = map[string]bool{}
		heldOut int // first messages out at once
		allOut  = make(chan struct{})
	)
	var handlers sync.WaitGroup
	for done := 0; done < keys*perKey; {
		msg := receive(t, msgs, 20*time.Second)
		key, payload := bus.PartitionKey(msg), string(msg.Payload)
		mu.Lock()
		require.False(t, busy[key], "two messages of %s out at once (the second is %s)", key, payload)
		busy[key] = true
		first := len(handled[key]) == 0
		nack := !first && !nacked[payload] && rand.IntN(5) == 0
		if nack {
			nacked[payload] = true
		} else {
			handled[key] = append(handled[key], payload)
			done++
		}
		if first {
			if heldOut++; heldOut == keys {
				close(allOut)
			}
		}
		mu.Unlock()
		handlers.Go(func() {
			if first {
				select {
				case <-allOut:
				case <-time.After(20 * time.Second):
					mu.Lock()
					t.Errorf("the first messages of all %d keys were never out at once (at most %d were)", keys, heldOut)
					mu.Unlock()
				}
			} else {
				time.Sleep(time.Duration(rand.IntN(1000)) * time.Microsecond) // handler work
			}
			mu.Lock()
			busy[key] = false
			mu.Unlock()
			if nack {
				msg.Nack()
			} else {
				msg.Ack()
			}
		})
	}
	handlers.Wait()
	pubs.Wait()
	for k := range keys {
		assert.Equal(t, published[keyOf(k)], handled[keyOf(k)], "%s handled out of publish order", keyOf(k))
	}
}
