package postgres

import (
	"context"
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
		// variant pushes 10,000 messages through a single key in several
		// tests, which under -race on two cores takes minutes: `make soak`
		// runs it (TestSoak_UniversalKeyedFullSize). Semantics are the same.
		ForceShort: true,
	}, func(t *testing.T) (message.Publisher, message.Subscriber) {
		return keyedPublisher{ob.Publisher(pool)}, newSub(t)
	}, nil)
}

// TestUniversal_QueueBroker runs the suite against the `postgres` bus broker
// (an inbox table used as a queue, one row per declared consumer group).
// Flags: persistent; at least once; no guaranteed order (the suite's
// messages carry no partition key, and unkeyed rows go out concurrently).
// ConsumerGroups is false although the broker has groups: they are declared
// up front (postgres.queue_groups) because a message is stored once per
// group at publish time, while the suite makes up new groups as it goes.
// Declared groups each receiving every message are tested by
// TestQueueBroker_EveryDeclaredGroupGetsEveryMessage.
func TestUniversal_QueueBroker(t *testing.T) {
	t.Parallel()
	pool, in := newInbox(t)
	cfg := bus.Config{Broker: bus.BrokerPostgres}.WithDefaults()
	cfg.Postgres.QueueTable = in.Table()
	cfg.Postgres.QueueGroups = []string{"universal"}
	cfg.Relay.Lease = 2 * time.Second
	cfg.Relay.CloseTimeout = time.Second
	cfg.Relay.PollInterval = 200 * time.Millisecond
	cfg.Relay.SweepInterval = -1
	b := &queueBroker{cfg: cfg, pool: pool, inbox: in, groups: cfg.Postgres.QueueGroups}
	tests.TestPubSub(t, tests.Features{
		ConsumerGroups:      false,
		ExactlyOnceDelivery: false,
		GuaranteedOrder:     false,
		Persistent:          true,
	}, func(t *testing.T) (message.Publisher, message.Subscriber) {
		sub, err := b.Subscriber("universal")
		require.NoError(t, err)
		return b.Publisher(), sub
	}, nil)
}

// Every consumer group declared in postgres.queue_groups receives every
// message published through the postgres broker.
func TestQueueBroker_EveryDeclaredGroupGetsEveryMessage(t *testing.T) {
	t.Parallel()
	pool, in := newInbox(t)
	cfg := bus.Config{Broker: bus.BrokerPostgres}.WithDefaults()
	cfg.Postgres.QueueTable = in.Table()
	cfg.Postgres.QueueGroups = []string{"billing", "shipping"}
	cfg.Relay.PollInterval = 20 * time.Millisecond
	b := &queueBroker{cfg: cfg, pool: pool, inbox: in, groups: cfg.Postgres.QueueGroups}
	msgs := []*message.Message{event("k", "1"), event("k", "2"), event("", "3")}
	require.NoError(t, b.Publisher().Publish("orders", msgs...))
	for _, g := range cfg.Postgres.QueueGroups {
		sub, err := b.Subscriber(g)
		require.NoError(t, err)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		ch, err := sub.Subscribe(ctx, "orders")
		require.NoError(t, err)
		got := map[string]bool{}
		for len(got) < len(msgs) {
			select {
			case m := <-ch:
				got[string(m.Payload)] = true
				m.Ack()
			case <-ctx.Done():
				t.Fatalf("group %s received %d of %d messages", g, len(got), len(msgs))
			}
		}
		cancel()
		require.NoError(t, sub.Close())
	}
	_, err := b.Subscriber("undeclared")
	require.Error(t, err, "an undeclared group is refused: it would never receive anything")
}
