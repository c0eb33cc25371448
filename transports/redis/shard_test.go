package redis_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omnibus-go/omnibus/bus"
	omniredis "github.com/omnibus-go/omnibus/transports/redis"
)

const testShards = 8

func (e *env) shardedPublisher(shards int) *omniredis.Publisher {
	e.t.Helper()
	pub, err := omniredis.NewPublisher(omniredis.PublisherConfig{Client: e.client, StreamPrefix: e.prefix, Shards: shards}, nil)
	require.NoError(e.t, err)
	e.t.Cleanup(func() { _ = pub.Close() })
	return pub
}

func (e *env) shardedSubscriberConfig(group string, lease time.Duration) omniredis.SubscriberConfig {
	cfg := e.fastSubscriberConfig(group)
	cfg.Shards = testShards
	cfg.ShardLease = lease
	cfg.OrderByKey = true
	return cfg
}

// firstSeen records, like an inbox, the first handling of each message, in
// the order handlers ran, across every consumer.
type firstSeen struct {
	mu    sync.Mutex
	seen  map[string]bool
	order map[string][]int // by key, the sequence numbers in first-handling order
	total int
}

func newFirstSeen() *firstSeen {
	return &firstSeen{seen: map[string]bool{}, order: map[string][]int{}}
}

func (f *firstSeen) handle(msg *message.Message) {
	f.mu.Lock()
	if !f.seen[msg.UUID] {
		f.seen[msg.UUID] = true
		key := bus.PartitionKey(msg)
		seq, _ := strconv.Atoi(string(msg.Payload))
		f.order[key] = append(f.order[key], seq)
		f.total++
	}
	f.mu.Unlock()
}

func (f *firstSeen) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.total
}

// outOfOrder returns, per key, how many messages were first handled after
// a later one of their key.
func (f *firstSeen) outOfOrder() map[string]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	bad := map[string]int{}
	for key, seqs := range f.order {
		for i := 1; i < len(seqs); i++ {
			if seqs[i] < seqs[i-1] {
				bad[key]++
			}
		}
	}
	return bad
}

// consumeInto runs a consumer of topic that hands every message to seen,
// acking after a short random pause, until ctx ends or the channel closes.
func consumeInto(msgs <-chan *message.Message, seen *firstSeen, wg *sync.WaitGroup) {
	wg.Go(func() {
		for msg := range msgs {
			seen.handle(msg)
			time.Sleep(time.Duration(rand.IntN(200)) * time.Microsecond)
			msg.Ack()
		}
	})
}

// With the topic sharded, every key's messages are handled in publish order
// although three consumers share the group and consumers leave and join
// (each change moves shards between them) while messages flow.
func TestSharding_KeyOrderHoldsWhileConsumersJoinAndLeave(t *testing.T) {
	forEachServer(t, func(t *testing.T, e *env) {
		const (
			topic = "orders"
			keys  = 40
			n     = 4000
		)
		pub := e.shardedPublisher(testShards)
		cfg := e.shardedSubscriberConfig("g", 600*time.Millisecond)
		seen := newFirstSeen()
		var wg sync.WaitGroup
		start := func() *omniredis.Subscriber {
			s, err := omniredis.NewSubscriber(cfg, nil)
			require.NoError(t, err)
			msgs, err := s.Subscribe(context.Background(), topic)
			require.NoError(t, err)
			consumeInto(msgs, seen, &wg)
			return s
		}
		subs := []*omniredis.Subscriber{start(), start(), start()}

		published := make(chan struct{})
		go func() {
			defer close(published)
			for i := range n {
				key := "key-" + strconv.Itoa(i%keys)
				msg := message.NewMessage(watermill.NewUUID(), []byte(strconv.Itoa(i)))
				bus.SetPartitionKey(msg, key)
				if err := pub.Publish(topic, msg); err != nil {
					t.Error(err)
					return
				}
				if i%500 == 499 {
					time.Sleep(50 * time.Millisecond)
				}
			}
		}()

		// Churn: one leaves, a new one joins, another leaves.
		time.Sleep(300 * time.Millisecond)
		require.NoError(t, subs[0].Close())
		subs = append(subs[1:], start())
		time.Sleep(400 * time.Millisecond)
		require.NoError(t, subs[0].Close())
		subs = append(subs[1:], start())

		<-published
		require.Eventually(t, func() bool { return seen.count() == n }, 30*time.Second, 20*time.Millisecond,
			"handled %d of %d messages", seen.count(), n)
		assert.Empty(t, seen.outOfOrder(), "keys whose messages were first handled out of publish order")
		require.Eventually(t, func() bool {
			st, err := omniredis.ShardStatus(context.Background(), e.client, e.prefix+topic, "g")
			require.NoError(t, err)
			require.Len(t, st, testShards)
			live := map[string]bool{}
			for _, s := range subs {
				live[s.Consumer()] = true
			}
			for _, s := range st {
				if !live[s.Owner] || s.Lag != 0 || s.Pending != 0 || s.Leases < 1 {
					return false
				}
			}
			return true
		}, 10*time.Second, 50*time.Millisecond, "every shard owned by a live consumer, nothing left")
		var taken int64
		for _, s := range subs {
			require.NoError(t, s.Close())
			taken += s.Stats().ShardsTaken
		}
		wg.Wait()
		assert.Positive(t, taken, "the consumers took shards")
		for i := range testShards {
			stream := e.prefix + topic + ":shard:{" + strconv.Itoa(i) + "}"
			assert.Zero(t, e.pending(stream, "g"), "entries left pending in %s", stream)
		}
	})
}

// A consumer that lost its shard's lease (here taken from it in Redis, as
// another consumer does after a pause longer than the lease) acknowledges
// nothing of the shard and hands out nothing more; the shard's next owner,
// itself again once the lease is free, delivers the unacknowledged entry
// first and the rest of its key after it.
func TestSharding_ConsumerThatLostItsLeaseIsFenced(t *testing.T) {
	e := newEnv(t)
	const topic = "payments"
	pub := e.shardedPublisher(testShards)
	cfg := e.shardedSubscriberConfig("g", 500*time.Millisecond)
	sub := e.subscriber(cfg)
	msgs := e.subscribe(sub, topic)

	send := func(payload string) {
		msg := message.NewMessage(watermill.NewUUID(), []byte(payload))
		bus.SetPartitionKey(msg, "k")
		require.NoError(t, pub.Publish(topic, msg))
	}
	send("1")
	first := receive(t, msgs, 5*time.Second)
	require.Equal(t, "1", string(first.Payload))

	shard := e.prefix + topic + ":shard:{" + strconv.Itoa(bus.ShardOf("k", testShards)) + "}"
	owner := shard + ":owner:g"
	require.NoError(t, e.client.Set(context.Background(), owner, "999999 someone-else", 2*time.Second).Err())
	first.Ack()
	send("2")

	select {
	case m := <-msgs:
		t.Fatalf("a fenced consumer handed out %q", m.Payload)
	case <-time.After(time.Second):
	}
	assert.EqualValues(t, 1, e.pending(shard, "g"), "the acknowledgement after the lease was lost must not count")
	assert.Positive(t, sub.Stats().ShardsLost)

	// The lease ends: the consumer, still a member, takes the shard again
	// and finishes what the previous owner left before anything new.
	again := receive(t, msgs, 10*time.Second)
	assert.Equal(t, "1", string(again.Payload))
	d, ok := bus.DeliveryOf(again)
	require.True(t, ok)
	assert.Equal(t, first.UUID, again.UUID)
	assert.Positive(t, d.Attempts, "a takeover counts the interrupted delivery")
	again.Ack()
	next := receive(t, msgs, 5*time.Second)
	assert.Equal(t, "2", string(next.Payload))
	next.Ack()
}

// A topic's shard count is recorded on first use; a publisher or subscriber
// with another count refuses it, naming the key and both counts.
func TestSharding_AnotherShardCountIsRefused(t *testing.T) {
	e := newEnv(t)
	const topic = "invoices"
	pub := e.shardedPublisher(testShards)
	e.publish(withKey(pub), topic, 1)

	cfg := e.shardedSubscriberConfig("g", time.Second)
	cfg.Shards = 4
	sub := e.subscriber(cfg)
	_, err := sub.Subscribe(context.Background(), topic)
	require.Error(t, err)
	require.ErrorIs(t, err, omniredis.ErrShardCount)
	for _, want := range []string{"redis.shards", "4", "8 shards", "drain"} {
		assert.Contains(t, err.Error(), want)
	}

	other := e.shardedPublisher(4)
	err = other.Publish(topic, message.NewMessage(watermill.NewUUID(), []byte("x")))
	require.ErrorIs(t, err, omniredis.ErrShardCount)
	assert.Equal(t, bus.ClassTransient, bus.ClassOf(err), "a relay waits for the operator instead of failing events")

	unsharded := e.shardedPublisher(1)
	err = unsharded.Publish(topic, message.NewMessage(watermill.NewUUID(), []byte("x")))
	require.ErrorIs(t, err, omniredis.ErrShardCount, "one shard is a count too: it would write beside the shards")
}

// withKey gives every message a partition key of its own before publishing.
type keyedPublisher struct{ message.Publisher }

func withKey(p message.Publisher) keyedPublisher { return keyedPublisher{p} }

func (p keyedPublisher) Publish(topic string, msgs ...*message.Message) error {
	for i, m := range msgs {
		bus.SetPartitionKey(m, fmt.Sprintf("key-%d", i))
	}
	return p.Publisher.Publish(topic, msgs...)
}

func TestSharding_ConfigRefusesBadValues(t *testing.T) {
	e := newEnv(t)
	for _, n := range []int{-1, bus.MaxShards + 1} {
		_, err := omniredis.NewPublisher(omniredis.PublisherConfig{Client: e.client, Shards: n}, nil)
		require.Error(t, err)
		assert.True(t, strings.Contains(err.Error(), "Shards"), err.Error())
		cfg := e.fastSubscriberConfig("g")
		cfg.Shards = n
		_, err = omniredis.NewSubscriber(cfg, nil)
		require.Error(t, err)
		assert.Contains(t, err.Error(), "Shards")
	}
	cfg := e.fastSubscriberConfig("g")
	cfg.ShardLease = time.Millisecond
	_, err := omniredis.NewSubscriber(cfg, nil)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "ShardLease")
}

// DeleteTopic removes a sharded topic whole: streams, shards, the recorded
// count, leases, lease counters and memberships.
func TestSharding_DeleteTopicLeavesNothing(t *testing.T) {
	e := newEnv(t)
	const topic = "gone"
	pub := e.shardedPublisher(testShards)
	e.publish(withKey(pub), topic, 50)
	sub := e.subscriber(e.shardedSubscriberConfig("g", time.Second))
	msgs := e.subscribe(sub, topic)
	for range 50 {
		receive(t, msgs, 5*time.Second).Ack()
	}
	require.NoError(t, sub.Close())
	keys, err := e.client.Keys(context.Background(), e.prefix+topic+"*").Result()
	require.NoError(t, err)
	require.Greater(t, len(keys), testShards, "the topic left keys to delete: %v", keys)

	require.NoError(t, omniredis.DeleteTopic(context.Background(), e.client, e.prefix+topic))
	keys, err = e.client.Keys(context.Background(), e.prefix+topic+"*").Result()
	require.NoError(t, err)
	assert.Empty(t, keys)
}
