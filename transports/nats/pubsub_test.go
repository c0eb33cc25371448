package nats_test

import (
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/tests"
	"github.com/stretchr/testify/require"

	"github.com/omnibus-go/omnibus/internal/testenv"
	"github.com/omnibus-go/omnibus/transports/nats"
)

// TestPubSub runs Watermill's universal suite. Flags: consumer groups yes,
// persistent yes; no "new subscriber receives old messages" (the suite means
// every new subscriber of one group reading everything again, while here the
// group's first consumer keeps its shard; a new group does start at the
// stream's first message, tested in TestNewGroupReadsFromTheStart); no
// guaranteed total order (a subscription hands out the messages of different keys at once;
// per-key order is tested on its own), no exactly-once, no restart command
// (the server is not ours to restart).
func TestPubSub(t *testing.T) {
	t.Parallel()
	url := testenv.NATS(t)
	prefix := testenv.NATSPrefix(t)
	newPubSub := func(t *testing.T, group string) (message.Publisher, message.Subscriber) {
		conn := nats.ConnectionConfig{URL: url, SubjectPrefix: prefix}
		pub, err := nats.NewPublisher(nats.PublisherConfig{ConnectionConfig: conn}, nil)
		require.NoError(t, err)
		sub, err := nats.NewSubscriber(nats.SubscriberConfig{
			ConnectionConfig: conn, ConsumerGroup: group, ShardLease: 2 * time.Second, NackDelay: 10 * time.Millisecond,
		}, nil)
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
