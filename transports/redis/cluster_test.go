package redis_test

import (
	"context"
	"fmt"
	"strconv"
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

// Tests of what only a Redis Cluster can get wrong: keys of one operation
// in different slots (CROSSSLOT) or on different nodes. The core subscriber
// tests also run against the cluster (forEachServer), and so does the
// universal suite (TestPubSub_RedisCluster).

// masterOf returns the address of the master serving key.
func masterOf(t *testing.T, c *goredis.ClusterClient, key string) string {
	t.Helper()
	node, err := c.MasterForKey(context.Background(), key)
	require.NoError(t, err, "find the master of %q", key)
	return node.Options().Addr
}

// topicAcrossNodes returns a topic whose stream (prefix+topic) and whose
// default dead-letter stream are served by different masters, so a test of
// it proves the two need not share a slot.
func topicAcrossNodes(t *testing.T, c *goredis.ClusterClient, prefix string) string {
	t.Helper()
	for i := range 1000 {
		topic := "orders-" + strconv.Itoa(i)
		stream := prefix + topic
		if masterOf(t, c, stream) != masterOf(t, c, stream+omniredis.DefaultDeadLetterSuffix) {
			return topic
		}
	}
	t.Fatal("no topic whose stream and dead-letter stream sit on different nodes; is the cluster a single master?")
	return ""
}

// TestCluster_DeadLetterStreamOnAnotherNodeReceivesGivenUpAndUndecodableEntries
// puts a stream and its dead-letter stream on different nodes (no hash tag)
// and checks both ways into the dead-letter stream: an entry given up on
// after its budget and an entry that cannot be decoded. Each is copied and
// acked; nothing stays pending.
func TestCluster_DeadLetterStreamOnAnotherNodeReceivesGivenUpAndUndecodableEntries(t *testing.T) {
	t.Parallel()
	e := newClusterEnv(t)
	c := testenv.RedisCluster(t)
	ctx := context.Background()
	const group = "billing"
	topic := topicAcrossNodes(t, c, e.prefix)
	stream := e.prefix + topic
	deadLetter := stream + omniredis.DefaultDeadLetterSuffix

	sub := e.subscriber(e.fastSubscriberConfig(group))
	require.NoError(t, sub.SubscribeInitialize(topic))
	badID, err := c.XAdd(ctx, &goredis.XAddArgs{Stream: stream, Values: []any{"foo", "bar"}}).Result()
	require.NoError(t, err)
	poison := e.publish(e.publisher(), topic, 1)[0]

	msgs := e.subscribe(sub, topic)
	msg := receive(t, msgs, 5*time.Second)
	require.Equal(t, poison.UUID, msg.UUID)
	require.True(t, bus.Settle(msg, bus.Settlement{Class: bus.ClassCounted, GiveUp: true, Error: "budget spent"}))
	msg.Nack()

	testenv.Eventually(t, 5*time.Second, func() bool { return e.pending(stream, group) == 0 },
		"entries still pending in %s after dead-lettering", stream)
	entries, err := c.XRange(ctx, deadLetter, "-", "+").Result()
	require.NoError(t, err)
	require.Len(t, entries, 2, "dead-letter stream %s on %s", deadLetter, masterOf(t, c, deadLetter))
	reasons := map[string]string{}
	for _, entry := range entries {
		reasons[fmt.Sprint(entry.Values[omniredis.FieldMetadataPrefix+omniredis.KeyDeadLetterID])] =
			fmt.Sprint(entry.Values[omniredis.FieldMetadataPrefix+omniredis.KeyDeadLetterReason])
	}
	d, _ := bus.DeliveryOf(msg)
	assert.Equal(t, map[string]string{
		badID: omniredis.DeadLetterReasonUndecodable,
		d.ID:  omniredis.DeadLetterReasonGaveUp,
	}, reasons)
	assert.EqualValues(t, 2, sub.Stats().DeadLettered, "given up and undecodable")
	assert.EqualValues(t, 1, sub.Stats().Undecodable)
}

// TestCluster_ConcurrentPublishesToStreamsOnEveryNodeKeepEachStreamsOrder
// publishes from many goroutines to streams spread over every master, so
// the Publisher's shared pipelines mix slots and nodes: every message must
// land, each stream in its publishers' order.
func TestCluster_ConcurrentPublishesToStreamsOnEveryNodeKeepEachStreamsOrder(t *testing.T) {
	t.Parallel()
	e := newClusterEnv(t)
	c := testenv.RedisCluster(t)
	ctx := context.Background()

	var masters sync.Map
	require.NoError(t, c.ForEachMaster(ctx, func(_ context.Context, node *goredis.Client) error {
		masters.Store(node.Options().Addr, true)
		return nil
	}))
	// Two topics per master.
	perMaster := map[string]int{}
	var topics []string
	for i := 0; i < 1000; i++ {
		topic := "t" + strconv.Itoa(i)
		m := masterOf(t, c, e.prefix+topic)
		if perMaster[m] < 2 {
			perMaster[m]++
			topics = append(topics, topic)
		}
	}
	masters.Range(func(addr, _ any) bool {
		require.Equal(t, 2, perMaster[addr.(string)], "no topics found on master %s", addr)
		return true
	})

	pub := e.publisher()
	const perTopic = 60
	sent := make(map[string][]string, len(topics))
	var wg sync.WaitGroup
	var mu sync.Mutex
	for _, topic := range topics {
		wg.Go(func() {
			for i := 0; i < perTopic; i += 3 {
				// Single and multi-message Publish calls, one goroutine per
				// topic: the topic's order is the order of its calls.
				batch := make([]*message.Message, 1+i%2*2)
				for j := range batch {
					batch[j] = message.NewMessage(watermill.NewUUID(), []byte(topic))
				}
				if !assert.NoError(t, pub.Publish(topic, batch...)) {
					return
				}
				mu.Lock()
				for _, m := range batch {
					sent[topic] = append(sent[topic], m.UUID)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()

	for _, topic := range topics {
		entries, err := c.XRange(ctx, e.prefix+topic, "-", "+").Result()
		require.NoError(t, err)
		var got []string
		for _, entry := range entries {
			m, err := omniredis.DefaultMarshaler{}.Unmarshal(entry.Values)
			require.NoError(t, err)
			got = append(got, m.UUID)
		}
		assert.Equal(t, sent[topic], got, "stream of topic %s on %s", topic, masterOf(t, c, e.prefix+topic))
	}
}
