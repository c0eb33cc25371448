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
	e := newEnv(t)

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
		},
		func(t *testing.T) (message.Publisher, message.Subscriber) { return newPubSub(t, "universal") },
		newPubSub,
	)
}
