package redis_test

import (
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/tests"
	omniredis "github.com/omnibus-go/omnibus/transports/redis"
	"github.com/stretchr/testify/require"
)

// TestPubSub runs Watermill's universal suite. Flags: consumer groups yes,
// persistent yes; no guaranteed order (several messages are in flight and a
// group spreads entries over its consumers), no exactly-once, no context
// carried, no restart command (the shared server is not ours to restart).
// Subscribers made by the plain constructor share one group, so a new one
// continues where the last left off rather than receiving old messages
// again.
//
// The suite cannot check OrderByKey: its order tests need total order
// (GuaranteedOrder), publish without partition keys and read with ten
// subscribers. Per-key order is checked by
// TestSubscriber_OrderByKeyKeepsEachKeysOrderWithManyInFlight and
// TestSubscriber_OrderByKeyHandsOutOneAtATimeInStreamOrder.
func TestPubSub(t *testing.T) {
	t.Parallel()
	runUniversalSuite(t, newEnv(t), false)
}

// TestPubSub_RedisCluster runs the same suite against a 3-node Redis
// Cluster, whose streams (and their dead-letter streams) the test prefix
// spreads over the nodes, in short mode (ForceShort): about 5 s instead of
// about 35 s under -race on two cores. Short mode goes through every test
// of the suite, so every command, script and pipeline of the transport
// through a ClusterClient, with fewer messages; the single server's run
// above is full size. TestSoak_PubSubRedisClusterFullSize (`make soak`)
// runs the cluster at full size.
func TestPubSub_RedisCluster(t *testing.T) {
	t.Parallel()
	runUniversalSuite(t, newClusterEnv(t), true)
}

func runUniversalSuite(t *testing.T, e *env, short bool) {
	newPubSub := func(t *testing.T, group string) (message.Publisher, message.Subscriber) {
		pub, err := omniredis.NewPublisher(omniredis.PublisherConfig{Client: e.client, StreamPrefix: e.prefix}, nil)
		require.NoError(t, err)
		cfg := e.fastSubscriberConfig(group)
		cfg.ClaimIdle = 500 * time.Millisecond
		sub, err := omniredis.NewSubscriber(cfg, nil)
		require.NoError(t, err)
		return pub, sub
	}

	tests.TestPubSub(t,
		tests.Features{
			ConsumerGroups:                   true,
			Persistent:                       true,
			ExactlyOnceDelivery:              false,
			GuaranteedOrder:                  false,
			NewSubscriberReceivesOldMessages: false,
			ForceShort:                       short,
		},
		func(t *testing.T) (message.Publisher, message.Subscriber) { return newPubSub(t, "universal") },
		newPubSub,
	)
}
