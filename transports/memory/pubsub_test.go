package memory

import (
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/tests"
	"github.com/stretchr/testify/require"
)

// TestMemory_UniversalPubSubSuite runs Watermill's universal suite against
// one memory broker. Flags: consumer groups and persistence (within the
// broker's life) yes; order only per partition key, which the suite does not
// set, so no guaranteed order; at least once.
func TestMemory_UniversalPubSubSuite(t *testing.T) {
	t.Parallel()
	b := NewBroker(nil)
	t.Cleanup(func() { _ = b.Close() })
	newPubSub := func(t *testing.T, group string) (message.Publisher, message.Subscriber) {
		sub, err := b.Subscriber(group)
		require.NoError(t, err)
		return b.Publisher(), sub
	}
	tests.TestPubSub(t,
		tests.Features{
			ConsumerGroups:                   true,
			Persistent:                       true,
			RequireSingleInstance:            true,
			ExactlyOnceDelivery:              false,
			GuaranteedOrder:                  false,
			NewSubscriberReceivesOldMessages: false,
		},
		func(t *testing.T) (message.Publisher, message.Subscriber) { return newPubSub(t, "universal") },
		newPubSub,
	)
}
