package rabbitmq_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/transports/rabbitmq"
)

// getDead reads the next message of a group's dead-letter queue.
func getDead(t *testing.T, cc rabbitmq.ConnectionConfig, topic, group string) amqp.Delivery {
	t.Helper()
	conn, err := amqp.Dial(cc.URL)
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	var d amqp.Delivery
	require.Eventually(t, func() bool {
		var ok bool
		d, ok, err = ch.Get(cc.ExchangePrefix+topic+"."+group+".dead-letter", true)
		require.NoError(t, err)
		return ok
	}, 10*time.Second, 20*time.Millisecond, "a message in the dead-letter queue")
	return d
}

func keyed(key, seq string) *message.Message {
	msg := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
	bus.SetPartitionKey(msg, key)
	msg.Metadata.Set("seq", seq)
	return msg
}

// A nacked message comes back after its delay, and the messages of its
// key wait for it; one given up on goes to the dead-letter queue with the
// reason, and its key moves on.
func TestSubscriber_NackHoldsTheKeyThenGiveUpDeadLetters(t *testing.T) {
	t.Parallel()
	cc := conn(t, 2)
	pub, err := rabbitmq.NewPublisher(rabbitmq.PublisherConfig{ConnectionConfig: cc, Groups: []string{"g"}}, nil)
	require.NoError(t, err)
	defer pub.Close()
	sub, err := rabbitmq.NewSubscriber(rabbitmq.SubscriberConfig{ConnectionConfig: cc, ConsumerGroup: "g", NackDelay: 200 * time.Millisecond}, nil)
	require.NoError(t, err)
	defer sub.Close()
	msgs, err := sub.Subscribe(context.Background(), "orders")
	require.NoError(t, err)
	require.NoError(t, pub.Publish("orders", keyed("k", "1"), keyed("k", "2"), keyed("other", "1")))

	type got struct {
		key, seq string
		attempts int
		at       time.Time
	}
	var order []got
	for len(order) < 4 {
		select {
		case m := <-msgs:
			d, _ := bus.DeliveryOf(m)
			order = append(order, got{bus.PartitionKey(m), m.Metadata.Get("seq"), d.Attempts, time.Now()})
			switch {
			case bus.PartitionKey(m) == "k" && m.Metadata.Get("seq") == "1" && d.Attempts == 0:
				m.Nack() // no settlement: NackDelay, counted
			case bus.PartitionKey(m) == "k" && m.Metadata.Get("seq") == "1":
				require.True(t, bus.Settle(m, bus.Settlement{Class: bus.ClassPermanent, GiveUp: true, Error: "card declined"}))
				m.Nack()
			default:
				m.Ack()
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("only %+v arrived", order)
		}
	}
	var keyK []string
	var attempts []int
	for _, g := range order {
		if g.key == "k" {
			keyK = append(keyK, g.seq)
			attempts = append(attempts, g.attempts)
		}
	}
	assert.Equal(t, []string{"1", "1", "2"}, keyK, "the key waits for its nacked head: %+v", order)
	assert.Equal(t, []int{0, 1, 0}, attempts, "the retry carries the counted attempt")
	var first, retry time.Time
	for _, g := range order {
		if g.key == "k" && g.seq == "1" {
			if first.IsZero() {
				first = g.at
			} else {
				retry = g.at
			}
		}
	}
	assert.GreaterOrEqual(t, retry.Sub(first), 200*time.Millisecond, "redelivered after NackDelay")

	dead := getDead(t, cc, "orders", "g")
	assert.Equal(t, "1", dead.Headers["seq"])
	assert.Equal(t, bus.DeadLetterReasonGaveUp, dead.Headers[bus.KeyDeadLetterReason])
	assert.Equal(t, "card declined", dead.Headers[bus.KeyDeadLetterError])
	assert.Equal(t, "orders", dead.Headers[bus.KeyDeadLetterTopic])
	assert.Equal(t, "g", dead.Headers[bus.KeyDeadLetterGroup])
	assert.EqualValues(t, 1, sub.Stats().DeadLettered)
}

// A message this transport did not write (a header that is not a string)
// is dead-lettered with the reason, and the next one is delivered.
func TestSubscriber_UndecodableMessageIsDeadLettered(t *testing.T) {
	t.Parallel()
	cc := conn(t, 1)
	sub, err := rabbitmq.NewSubscriber(rabbitmq.SubscriberConfig{ConnectionConfig: cc, ConsumerGroup: "g"}, nil)
	require.NoError(t, err)
	defer sub.Close()
	msgs, err := sub.Subscribe(context.Background(), "orders")
	require.NoError(t, err)

	raw, err := amqp.Dial(cc.URL)
	require.NoError(t, err)
	defer raw.Close()
	ch, err := raw.Channel()
	require.NoError(t, err)
	require.NoError(t, ch.Publish(cc.ExchangePrefix+"orders", "shard.0", true, false, amqp.Publishing{
		MessageId: "bad-1", Headers: amqp.Table{"amount": int32(7)}, Body: []byte("?"),
	}))
	pub, err := rabbitmq.NewPublisher(rabbitmq.PublisherConfig{ConnectionConfig: cc}, nil)
	require.NoError(t, err)
	defer pub.Close()
	good := keyed("k", "1")
	require.NoError(t, pub.Publish("orders", good))

	select {
	case m := <-msgs:
		assert.Equal(t, good.UUID, m.UUID)
		m.Ack()
	case <-time.After(10 * time.Second):
		t.Fatal("the good message did not arrive")
	}
	dead := getDead(t, cc, "orders", "g")
	assert.Equal(t, "bad-1", dead.MessageId)
	assert.Equal(t, bus.DeadLetterReasonUndecodable, dead.Headers[bus.KeyDeadLetterReason])
	assert.Contains(t, dead.Headers[bus.KeyDeadLetterError], `header "amount" is a int32, not a string`)
}

// A message no queue takes is an error naming the way out, not a drop; a
// broker that cannot be reached is a transient error.
func TestPublisher_RefusesWhatNoQueueTakesAndMarksOutagesTransient(t *testing.T) {
	t.Parallel()
	cc := conn(t, 1)
	pub, err := rabbitmq.NewPublisher(rabbitmq.PublisherConfig{ConnectionConfig: cc}, nil)
	require.NoError(t, err)
	defer pub.Close()
	err = pub.Publish("nobody-listens", keyed("k", "1"))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "no queue took it")
	assert.Contains(t, err.Error(), "rabbitmq.groups")
	assert.NotEqual(t, bus.ClassTransient, bus.ClassOf(err))

	down := cc
	down.URL = "amqp://guest:secret-pw@127.0.0.1:1/"
	pub2, err := rabbitmq.NewPublisher(rabbitmq.PublisherConfig{ConnectionConfig: down}, nil)
	require.NoError(t, err)
	err = pub2.Publish("orders", keyed("k", "1"))
	require.Error(t, err)
	assert.Equal(t, bus.ClassTransient, bus.ClassOf(err))
	assert.NotContains(t, err.Error(), "secret-pw")

	bad := keyed("k", "1")
	bad.Metadata.Set("x-death", "mine")
	err = pub.Publish("orders", bad)
	require.Error(t, err)
	assert.Contains(t, err.Error(), `metadata key "x-death" is a header RabbitMQ sets itself`)
}

// A topic's shard count is recorded on first use; another count is
// refused with both counts and the key.
func TestShardCount_AnotherCountIsRefused(t *testing.T) {
	t.Parallel()
	cc := conn(t, 4)
	pub, err := rabbitmq.NewPublisher(rabbitmq.PublisherConfig{ConnectionConfig: cc, Groups: []string{"g"}}, nil)
	require.NoError(t, err)
	defer pub.Close()
	require.NoError(t, pub.Publish("orders", keyed("k", "1")))

	other := cc
	other.Shards = 8
	sub, err := rabbitmq.NewSubscriber(rabbitmq.SubscriberConfig{ConnectionConfig: other, ConsumerGroup: "g"}, nil)
	require.NoError(t, err)
	_, err = sub.Subscribe(context.Background(), "orders")
	require.Error(t, err)
	var sce *rabbitmq.ShardCountError
	require.ErrorAs(t, err, &sce)
	assert.Equal(t, 8, sce.Configured)
	assert.Equal(t, 4, sce.Recorded)
	assert.ErrorIs(t, err, rabbitmq.ErrShardCount)
	assert.ErrorIs(t, err, bus.ErrInvalidConfig)
	assert.Contains(t, err.Error(), "rabbitmq.shards: 8, but topic \"orders\" was set up with 4 shards")
	pub8, err := rabbitmq.NewPublisher(rabbitmq.PublisherConfig{ConnectionConfig: other}, nil)
	require.NoError(t, err)
	defer pub8.Close()
	assert.True(t, errors.Is(pub8.Publish("orders", keyed("k", "2")), rabbitmq.ErrShardCount))
}

// Concurrent Publish calls share channels; a return reaches the call whose
// message it is, and no other.
func TestPublisher_ConcurrentCallsGetTheirOwnReturns(t *testing.T) {
	t.Parallel()
	cc := conn(t, 2)
	sub, err := rabbitmq.NewSubscriber(rabbitmq.SubscriberConfig{ConnectionConfig: cc, ConsumerGroup: "g"}, nil)
	require.NoError(t, err)
	require.NoError(t, sub.SubscribeInitialize("orders")) // only orders has a queue
	pub, err := rabbitmq.NewPublisher(rabbitmq.PublisherConfig{ConnectionConfig: cc, Channels: 2}, nil)
	require.NoError(t, err)
	defer pub.Close()
	var wg sync.WaitGroup
	var routedErrs, unroutedOK atomic.Int64
	for g := range 16 {
		wg.Go(func() {
			for i := range 25 {
				if g%4 == 0 {
					if pub.Publish("nobody-listens", keyed("k", strconv.Itoa(i))) == nil {
						unroutedOK.Add(1)
					}
				} else if pub.Publish("orders", keyed("k", strconv.Itoa(i))) != nil {
					routedErrs.Add(1)
				}
			}
		})
	}
	wg.Wait()
	assert.Zero(t, routedErrs.Load(), "routed messages succeed next to refused ones")
	assert.Zero(t, unroutedOK.Load(), "every unroutable message is refused")
}
