package nats_test

import (
	"context"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omnibus-go/omnibus/internal/testenv"
	"github.com/omnibus-go/omnibus/transports/nats"
)

const lease = time.Second

func conn(t *testing.T, shards int) nats.ConnectionConfig {
	return nats.ConnectionConfig{URL: testenv.NATS(t), SubjectPrefix: testenv.NATSPrefix(t), Shards: shards}
}

func subscriber(t *testing.T, cc nats.ConnectionConfig, group string) *nats.Subscriber {
	t.Helper()
	sub, err := nats.NewSubscriber(nats.SubscriberConfig{ConnectionConfig: cc, ConsumerGroup: group, ShardLease: lease, Prefetch: 20, NackDelay: 10 * time.Millisecond}, nil)
	require.NoError(t, err)
	return sub
}

// Three consumers of one group, closed and restarted at random while
// messages flow: every key's messages are handled in publish order, none
// missing.
func TestShards_KeyOrderHoldsWhileConsumersComeAndGo(t *testing.T) {
	t.Parallel()
	const keys, perKey = 40, 50
	cc := conn(t, 4)
	pub, err := nats.NewPublisher(nats.PublisherConfig{ConnectionConfig: cc}, nil)
	require.NoError(t, err)
	defer pub.Close()
	l := testenv.NewLedger()
	newSub := func() *nats.Subscriber {
		sub := subscriber(t, cc, "g")
		testenv.ConsumeInto(t, context.Background(), sub, "orders", l, nil, time.Millisecond)
		return sub
	}
	subs := make([]*nats.Subscriber, 3)
	for i := range subs {
		subs[i] = newSub()
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		testenv.PublishKeyed(t, pub, "orders", keys, 0, perKey)
	}()
	deadline, restarts := time.Now().Add(60*time.Second), 0
	for l.Count() < keys*perKey && time.Now().Before(deadline) {
		time.Sleep(150 * time.Millisecond)
		i := rand.IntN(len(subs))
		require.NoError(t, subs[i].Close()) // it gives its shards back at their settled position
		subs[i] = newSub()
		restarts++
	}
	<-done
	testenv.Eventually(t, 30*time.Second, func() bool { return l.Count() == keys*perKey }, "every message handled")
	t.Logf("%d restarts", restarts)
	for _, s := range subs {
		require.NoError(t, s.Close())
	}
	l.Check(t, keys, perKey)
}

// A consumer that dies without giving its shards back (here: its
// connection stalled for good) loses them once its lease has gone
// unrenewed; the others go on from the recorded position, in order.
func TestShards_DeadConsumersShardsAreTakenOver(t *testing.T) {
	t.Parallel()
	const keys, perKey = 20, 30
	cc := conn(t, 4)
	pub, err := nats.NewPublisher(nats.PublisherConfig{ConnectionConfig: cc}, nil)
	require.NoError(t, err)
	defer pub.Close()
	l := testenv.NewLedger()

	px := testenv.NewStallProxy(t, "127.0.0.1:4222")
	deadCfg := cc
	deadCfg.URL = "nats://" + px.Addr()
	dead := subscriber(t, deadCfg, "g")
	var fromDead atomic.Int64
	testenv.ConsumeInto(t, context.Background(), dead, "orders", l, &fromDead, 0)
	testenv.PublishKeyed(t, pub, "orders", keys, 0, perKey/2)
	testenv.Eventually(t, 10*time.Second, func() bool { return l.Count() == keys*perKey/2 }, "the first consumer handles the first half")
	px.Stall(true)
	start := time.Now()
	other := subscriber(t, cc, "g")
	defer other.Close()
	testenv.ConsumeInto(t, context.Background(), other, "orders", l, nil, 0)
	testenv.PublishKeyed(t, pub, "orders", keys, perKey/2, perKey)
	testenv.Eventually(t, 30*time.Second, func() bool { return l.Count() == keys*perKey }, "every message handled")
	took := time.Since(start)
	t.Logf("the shards flowed again %s after the owner died (lease %s)", took, lease)
	assert.Less(t, took, 3*lease+2*time.Second, "taken over within a few leases")
	assert.Equal(t, int64(keys*perKey/2), fromDead.Load(), "the dead consumer handed out nothing after it stalled")
	assert.Equal(t, int64(4), other.Stats().ShardsTaken)
	l.Check(t, keys, perKey)
}

// A consumer stalled past its lease loses its shards to another consumer,
// and when it comes back it hands out nothing more of them: every key stays
// in order.
func TestShards_StalledConsumerIsFenced(t *testing.T) {
	t.Parallel()
	const keys, perKey = 20, 40
	cc := conn(t, 4)
	pub, err := nats.NewPublisher(nats.PublisherConfig{ConnectionConfig: cc}, nil)
	require.NoError(t, err)
	defer pub.Close()
	l := testenv.NewLedger()

	px := testenv.NewStallProxy(t, "127.0.0.1:4222")
	stalledCfg := cc
	stalledCfg.URL = "nats://" + px.Addr()
	stalled := subscriber(t, stalledCfg, "g")
	defer stalled.Close()
	var fromStalled atomic.Int64
	testenv.ConsumeInto(t, context.Background(), stalled, "orders", l, &fromStalled, 20*time.Millisecond) // slow: it holds messages it has not handed out yet
	other := subscriber(t, cc, "g")
	defer other.Close()
	testenv.ConsumeInto(t, context.Background(), other, "orders", l, nil, 0)
	testenv.Eventually(t, 10*time.Second, func() bool { return stalled.Stats().ShardsTaken > 0 && other.Stats().ShardsTaken > 0 }, "both consumers hold shards")

	testenv.PublishKeyed(t, pub, "orders", keys, 0, perKey/2)
	testenv.Eventually(t, 10*time.Second, func() bool { return fromStalled.Load() > 0 }, "the first consumer handles messages")
	px.Stall(true)
	// Until its lease runs out the consumer does not know: it may hand out
	// what it had read. After that, nothing.
	time.Sleep(lease + 100*time.Millisecond)
	atLeaseEnd := fromStalled.Load()
	testenv.PublishKeyed(t, pub, "orders", keys, perKey/2, perKey)
	time.Sleep(3 * lease)
	px.Stall(false)
	testenv.Eventually(t, 30*time.Second, func() bool { return l.Count() == keys*perKey }, "every message handled")
	time.Sleep(lease) // give the stalled one time to misbehave
	assert.Equal(t, atLeaseEnd, fromStalled.Load(), "the stalled consumer handed out nothing once its lease ran out, nor when it came back")
	assert.Positive(t, stalled.Stats().ShardsLost, "it knew it lost its shards")
	l.Check(t, keys, perKey)
}
