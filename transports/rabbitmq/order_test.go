package rabbitmq_test

import (
	"context"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omnibus-go/omnibus/internal/testenv"
	"github.com/omnibus-go/omnibus/transports/rabbitmq"
)

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
	l := testenv.NewLedger()
	newSub := func(ctx context.Context) *rabbitmq.Subscriber {
		sub, err := rabbitmq.NewSubscriber(rabbitmq.SubscriberConfig{ConnectionConfig: cc, ConsumerGroup: "g", Prefetch: 20}, nil)
		require.NoError(t, err)
		testenv.ConsumeInto(t, ctx, sub, "orders", l, nil, 0)
		return sub
	}
	subs := make([]*rabbitmq.Subscriber, 3)
	for i := range subs {
		subs[i] = newSub(context.Background())
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		testenv.PublishKeyed(t, pub, "orders", keys, 0, perKey)
	}()
	for l.Count() < keys*perKey {
		time.Sleep(150 * time.Millisecond)
		i := rand.IntN(len(subs))
		require.NoError(t, subs[i].Close()) // what it held goes to the next consumer
		subs[i] = newSub(context.Background())
	}
	<-done
	for _, s := range subs {
		require.NoError(t, s.Close())
	}
	l.Check(t, keys, perKey)
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
	l := testenv.NewLedger()

	px := testenv.NewStallProxy(t, "127.0.0.1:5672")
	stalledCfg := cc
	stalledCfg.URL = "amqp://guest:guest@" + px.Addr() + "/"
	stalled, err := rabbitmq.NewSubscriber(rabbitmq.SubscriberConfig{ConnectionConfig: stalledCfg, ConsumerGroup: "g", Prefetch: 20}, nil)
	require.NoError(t, err)
	defer stalled.Close()
	var fromStalled atomic.Int64
	testenv.ConsumeInto(t, context.Background(), stalled, "orders", l, &fromStalled, 20*time.Millisecond) // slow: it holds messages it has not handed out yet
	time.Sleep(500 * time.Millisecond)                                                                    // the stalled one is active on every shard
	other, err := rabbitmq.NewSubscriber(rabbitmq.SubscriberConfig{ConnectionConfig: cc, ConsumerGroup: "g", Prefetch: 20}, nil)
	require.NoError(t, err)
	defer other.Close()
	testenv.ConsumeInto(t, context.Background(), other, "orders", l, nil, 0)

	testenv.PublishKeyed(t, pub, "orders", keys, 0, perKey/2)
	testenv.Eventually(t, 10*time.Second, func() bool { return fromStalled.Load() > 0 }, "the first consumer handles messages")
	px.Stall(true)
	// Until its lease (the heartbeat) runs out the consumer does not know:
	// it may hand out what it had received. After that, nothing.
	time.Sleep(cc.Heartbeat + 100*time.Millisecond)
	atLeaseEnd := fromStalled.Load()
	testenv.PublishKeyed(t, pub, "orders", keys, perKey/2, perKey)
	time.Sleep(3 * cc.Heartbeat)
	px.Stall(false)
	testenv.Eventually(t, 30*time.Second, func() bool { return l.Count() == keys*perKey }, "every message handled")
	assert.Equal(t, atLeaseEnd, fromStalled.Load(), "the stalled consumer handed out nothing once its lease ran out, nor when it came back")
	assert.Positive(t, stalled.Stats().Fenced+stalled.Stats().AcksLost, "it knew it was fenced")
	l.Check(t, keys, perKey)
}
