package rabbitmq_test

import (
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/tests"
	"github.com/stretchr/testify/require"

	"github.com/omnibus-go/omnibus/internal/testenv"
	"github.com/omnibus-go/omnibus/transports/rabbitmq"
)

// TestPubSub runs Watermill's universal suite. Flags: consumer groups yes,
// persistent yes; no guaranteed total order (a subscription hands out the
// messages of different keys at once; per-key order is tested on its own),
// no exactly-once, no restart command (the server is not ours to restart).
func TestPubSub(t *testing.T) {
	t.Parallel()
	url := testenv.RabbitMQ(t)
	prefix := testenv.RabbitMQPrefix(t)
	newPubSub := func(t *testing.T, group string) (message.Publisher, message.Subscriber) {
		conn := rabbitmq.ConnectionConfig{URL: url, ExchangePrefix: prefix, QueueExpires: time.Minute}
		pub, err := rabbitmq.NewPublisher(rabbitmq.PublisherConfig{ConnectionConfig: conn}, nil)
		require.NoError(t, err)
		sub, err := rabbitmq.NewSubscriber(rabbitmq.SubscriberConfig{ConnectionConfig: conn, ConsumerGroup: group, NackDelay: 10 * time.Millisecond}, nil)
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
