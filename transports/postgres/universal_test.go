package postgres

import (
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/tests"
	"github.com/stretchr/testify/require"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/internal/testenv"
)

// keyedPublisher gives every message the topic as its partition key, so the
// whole topic is one ordered key.
type keyedPublisher struct{ message.Publisher }

func (p keyedPublisher) Publish(topic string, msgs ...*message.Message) error {
	for _, m := range msgs {
		bus.SetPartitionKey(m, topic)
	}
	return p.Publisher.Publish(topic, msgs...)
}

// universalTable migrates one outbox table shared by every constructor call of
// one suite run (topics keep the tests apart; the shared pool keeps the
// connection count bounded).
func universalTable(t *testing.T) (*Outbox, func(t *testing.T) *Subscriber) {
	pool, ob := newOutbox(t)
	return ob, func(t *testing.T) *Subscriber {
		sub, err := NewSubscriber(pool, SubscriberConfig{
			Table:         ob.Table(),
			Lease:         2 * time.Second,
			CloseTimeout:  time.Second,
			PollInterval:  200 * time.Millisecond,
			SweepInterval: -1,
		}, nil)
		require.NoError(t, err)
		return sub
	}
}

func TestUniversal_Unkeyed(t *testing.T) {
	t.Parallel()
	ob, newSub := universalTable(t)
	pool := testenv.Postgres(t)
	tests.TestPubSub(t, tests.Features{
		ConsumerGroups:      false, // an outbox table has one stream of rows per topic
		ExactlyOnceDelivery: false, // at least once: a lease can expire under a slow handler
		GuaranteedOrder:     false, // unkeyed rows are delivered concurrently
		Persistent:          true,
	}, func(t *testing.T) (message.Publisher, message.Subscriber) {
		return ob.Publisher(pool), newSub(t)
	}, nil)
}

func TestUniversal_KeyedGuaranteedOrder(t *testing.T) {
	t.Parallel()
	ob, newSub := universalTable(t)
	pool := testenv.Postgres(t)
	tests.TestPubSub(t, tests.Features{
		ConsumerGroups:      false,
		ExactlyOnceDelivery: false,
		GuaranteedOrder:     true, // one key per topic: delivered in insert order
		Persistent:          true,
		// One key is delivered strictly one message at a time; the full-size
		// variant pushes 10,000 messages through a single key, which under
		// -race on two cores takes minutes. Semantics are the same.
		ForceShort: true,
	}, func(t *testing.T) (message.Publisher, message.Subscriber) {
		return keyedPublisher{ob.Publisher(pool)}, newSub(t)
	}, nil)
}
