package memory

import (
	"github.com/omnibus-go/omnibus/bus"

	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func memMsg(key string, seq int) *message.Message {
	m := message.NewMessage(watermill.NewUUID(), fmt.Appendf(nil, "%s-%d", key, seq))
	if key != "" {
		bus.SetPartitionKey(m, key)
	}
	return m
}

func receive(t *testing.T, ctx context.Context, ch <-chan *message.Message) *message.Message {
	t.Helper()
	select {
	case m, ok := <-ch:
		require.True(t, ok, "subscription closed")
		return m
	case <-ctx.Done():
		t.Fatal("no message before the deadline")
		return nil
	}
}

// newBroker is a broker for the test, closed when it ends, and a context
// that bounds the test's waits.
func newBroker(t *testing.T) (context.Context, *Broker) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	b := NewBroker(nil)
	t.Cleanup(func() { _ = b.Close() })
	return ctx, b
}

func memSub(t *testing.T, b *Broker, group, topic string, ctx context.Context) <-chan *message.Message {
	t.Helper()
	s, err := b.Subscriber(group)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	ch, err := s.Subscribe(ctx, topic)
	require.NoError(t, err)
	return ch
}

func TestMemory_EveryGroupReceivesEveryMessageHeldUntilSubscribed(t *testing.T) {
	t.Parallel()
	ctx, b := newBroker(t)
	// Published before anyone subscribed: held for the first groups, and
	// for a while after every group known acked them.
	require.NoError(t, b.Publish("t", memMsg("", 1), memMsg("", 2)))
	for _, g := range []string{"a", "b"} {
		ch := memSub(t, b, g, "t", ctx)
		got := map[string]bool{}
		for range 2 {
			m := receive(t, ctx, ch)
			got[string(m.Payload)] = true
			d, ok := bus.DeliveryOf(m)
			require.True(t, ok)
			assert.Equal(t, Source, d.Source)
			assert.Equal(t, "t", d.Topic)
			m.Ack()
		}
		assert.Equal(t, map[string]bool{"-1": true, "-2": true}, got, "group %s", g)
	}
}

func TestMemory_OneKeyAtATimeInOrderAndANackedHeadHoldsItsKey(t *testing.T) {
	t.Parallel()
	ctx, b := newBroker(t)
	ch := memSub(t, b, "g", "t", ctx)
	require.NoError(t, b.Publish("t", memMsg("k", 0), memMsg("k", 1), memMsg("other", 0)))

	first := receive(t, ctx, ch)
	second := receive(t, ctx, ch)
	assert.Equal(t, "k-0", string(first.Payload))
	assert.Equal(t, "other-0", string(second.Payload), "another key is not held back by k")
	second.Ack()

	// A transient failure: delivered again, ahead of k-1, no attempt spent.
	d, _ := bus.DeliveryOf(first)
	assert.Equal(t, 0, d.Attempts)
	bus.Settle(first, bus.Settlement{Class: bus.ClassTransient, RetryAt: time.Now()})
	first.Nack()
	again := receive(t, ctx, ch)
	assert.Equal(t, "k-0", string(again.Payload), "the nacked head comes back before the rest of its key")
	d, _ = bus.DeliveryOf(again)
	assert.Equal(t, 0, d.Attempts, "transient failures spend no attempt")
	assert.Equal(t, first.UUID, again.UUID)

	// A counted failure spends one.
	bus.Settle(again, bus.Settlement{Class: bus.ClassCounted, RetryAt: time.Now()})
	again.Nack()
	third := receive(t, ctx, ch)
	assert.Equal(t, "k-0", string(third.Payload))
	d, _ = bus.DeliveryOf(third)
	assert.Equal(t, 1, d.Attempts)
	third.Ack()
	assert.Equal(t, "k-1", string(receive(t, ctx, ch).Payload))
}

func TestMemory_GivingUpDropsTheMessageAndReleasesItsKey(t *testing.T) {
	t.Parallel()
	ctx, b := newBroker(t)
	ch := memSub(t, b, "g", "t", ctx)
	require.NoError(t, b.Publish("t", memMsg("k", 0), memMsg("k", 1)))
	m := receive(t, ctx, ch)
	bus.Settle(m, bus.Settlement{Class: bus.ClassPermanent, GiveUp: true, Error: "poison"})
	m.Nack()
	next := receive(t, ctx, ch)
	assert.Equal(t, "k-1", string(next.Payload))
	next.Ack()
}

func TestMemory_SubscriptionsOfAGroupShareItsMessages(t *testing.T) {
	t.Parallel()
	ctx, b := newBroker(t)
	ch1 := memSub(t, b, "g", "t", ctx)
	ch2 := memSub(t, b, "g", "t", ctx)
	const n = 50
	for i := range n {
		require.NoError(t, b.Publish("t", memMsg(fmt.Sprint("k", i), 0)))
	}
	seen := map[string]int{}
	for range n {
		var m *message.Message
		select {
		case m = <-ch1:
		case m = <-ch2:
		case <-ctx.Done():
			t.Fatal("timeout")
		}
		seen[m.UUID]++
		m.Ack()
	}
	assert.Len(t, seen, n, "each message once within the group")
}

func TestMemory_AMessageInFlightWhenItsSubscriptionEndsIsHandedOutAgain(t *testing.T) {
	t.Parallel()
	ctx, b := newBroker(t)
	s1, err := b.Subscriber("g")
	require.NoError(t, err)
	ch1, err := s1.Subscribe(ctx, "t")
	require.NoError(t, err)
	require.NoError(t, b.Publish("t", memMsg("k", 0)))
	m := receive(t, ctx, ch1)
	require.NoError(t, s1.Close())
	<-m.Context().Done() // the message's context ends with its subscription
	_, open := <-ch1
	assert.False(t, open, "Close closes the channel")

	ch2 := memSub(t, b, "g", "t", ctx)
	assert.Equal(t, m.UUID, receive(t, ctx, ch2).UUID)
}

func TestMemory_AckedMessagesAreDropped(t *testing.T) {
	t.Parallel()
	ctx, b := newBroker(t)
	b.retention = 0
	ch := memSub(t, b, "g", "t", ctx)
	for i := range 10 {
		require.NoError(t, b.Publish("t", memMsg("", i)))
	}
	for range 10 {
		receive(t, ctx, ch).Ack()
	}
	require.Eventually(t, func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		return len(b.topics["t"].log) == 0
	}, 5*time.Second, time.Millisecond, "the log is trimmed once every group acked")

	// With the default retention, acked messages stay for a late group.
	b2 := NewBroker(nil)
	defer b2.Close()
	ch = memSub(t, b2, "early", "t", ctx)
	require.NoError(t, b2.Publish("t", memMsg("", 0)))
	m := receive(t, ctx, ch)
	m.Ack()
	require.Eventually(t, func() bool {
		b2.mu.Lock()
		defer b2.mu.Unlock()
		return b2.topics["t"].groups["early"].committed == 1
	}, 5*time.Second, time.Millisecond)
	assert.Equal(t, m.UUID, receive(t, ctx, memSub(t, b2, "late", "t", ctx)).UUID, "a late group still receives it")
}

func TestMemory_Closed(t *testing.T) {
	t.Parallel()
	b := NewBroker(nil)
	s, err := b.Subscriber("g")
	require.NoError(t, err)
	ch, err := s.Subscribe(context.Background(), "t")
	require.NoError(t, err)
	require.NoError(t, b.Close())
	require.NoError(t, b.Close())
	_, open := <-ch
	assert.False(t, open)
	assert.True(t, errors.Is(b.Publish("t", memMsg("", 0)), ErrClosed))
	_, err = s.Subscribe(context.Background(), "t")
	assert.ErrorIs(t, err, ErrClosed)
	_, err = b.Subscriber("")
	assert.Error(t, err)
}
