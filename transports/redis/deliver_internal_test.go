package redis

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omnibus-go/omnibus/internal/testenv"
)

// A consumer paused past its shard lease, with a message waiting for its
// consumer to take it, hands nothing out when it wakes: the lease ran out
// while the message waited, and the shard's next owner delivers the entry.
// (Before, the lease was looked at before the wait only.)
func TestDeliver_AMessageWaitingForItsConsumerIsNotHandedOutOnceTheShardLeaseRunsOut(t *testing.T) {
	t.Parallel()
	s, err := NewSubscriber(SubscriberConfig{Client: testenv.Redis(t), ConsumerGroup: "g"}, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	sub := newSubscription(context.Background(), s, "orders", "orders:shard:{0}")
	t.Cleanup(sub.cancel)
	// No renewal runs: the lease runs out at until, as for a consumer that
	// was stopped (SIGSTOP, a long GC pause) while the message waited.
	until := time.Now().Add(300 * time.Millisecond)
	sub.fence = &fence{key: "orders:shard:{0}:owner:g", value: "1 c", token: 1, until: until}
	sub.msgs.Add(1)
	go sub.deliverLoop()

	e := &entry{id: "1-0", msg: message.NewMessage("m1", nil)}
	sub.slots <- struct{}{}
	sub.mu.Lock()
	sub.held[e.id] = e
	sub.mu.Unlock()
	sub.start(e)
	testenv.Eventually(t, time.Second, func() bool { return len(sub.ready) == 0 }, "the deliverer to take the entry")

	time.Sleep(time.Until(until) + 100*time.Millisecond)
	select {
	case m := <-sub.out:
		t.Fatalf("handed out %s after the shard lease ran out", m.UUID)
	case <-time.After(200 * time.Millisecond):
	}
	assert.Error(t, sub.ctx.Err(), "the subscription stops once its lease is no longer surely ours")
	sub.mu.Lock()
	defer sub.mu.Unlock()
	assert.Contains(t, sub.held, e.id, "the entry stays held, to be handed back, not dropped")
}
