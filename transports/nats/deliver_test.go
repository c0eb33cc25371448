package nats_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/internal/testenv"
	"github.com/omnibus-go/omnibus/transports/nats"
)

func keyed(key, seq string) *message.Message {
	msg := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
	bus.SetPartitionKey(msg, key)
	msg.Metadata.Set("seq", seq)
	return msg
}

// rawJS is a JetStream client of the test's own.
func rawJS(t *testing.T) jetstream.JetStream {
	t.Helper()
	nc, err := natsgo.Connect(testenv.NATS(t))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	return js
}

// streamOf is the stream name of topic under cc's prefix.
func streamOf(cc nats.ConnectionConfig, topic string) string {
	b := []byte(cc.SubjectPrefix + topic)
	for i, c := range b {
		if c == '.' {
			b[i] = '_'
		}
	}
	return string(b)
}

// getDead reads the next dead letter of topic's group.
func getDead(t *testing.T, cc nats.ConnectionConfig, topic, group string) jetstream.Msg {
	t.Helper()
	js := rawJS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := js.OrderedConsumer(ctx, streamOf(cc, topic)+"_DEAD_LETTER", jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{cc.SubjectPrefix + topic + ".dead-letter." + group},
	})
	require.NoError(t, err)
	m, err := c.Next(jetstream.FetchMaxWait(10 * time.Second))
	require.NoError(t, err, "a message on the dead-letter subject")
	return m
}

// A nacked message comes back after its delay, and the messages of its key
// wait for it; one given up on goes to the dead-letter subject with the
// reason, and its key moves on.
func TestSubscriber_NackHoldsTheKeyThenGiveUpDeadLetters(t *testing.T) {
	t.Parallel()
	cc := conn(t, 2)
	pub, err := nats.NewPublisher(nats.PublisherConfig{ConnectionConfig: cc}, nil)
	require.NoError(t, err)
	defer pub.Close()
	sub, err := nats.NewSubscriber(nats.SubscriberConfig{ConnectionConfig: cc, ConsumerGroup: "g", NackDelay: 200 * time.Millisecond}, nil)
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
	var first, retry time.Time
	for _, g := range order {
		if g.key != "k" {
			continue
		}
		keyK = append(keyK, g.seq)
		attempts = append(attempts, g.attempts)
		if g.seq == "1" && first.IsZero() {
			first = g.at
		} else if g.seq == "1" {
			retry = g.at
		}
	}
	assert.Equal(t, []string{"1", "1", "2"}, keyK, "the key waits for its nacked head: %+v", order)
	assert.Equal(t, []int{0, 1, 0}, attempts, "the retry carries the counted attempt")
	assert.GreaterOrEqual(t, retry.Sub(first), 200*time.Millisecond, "redelivered after NackDelay")

	dead := getDead(t, cc, "orders", "g")
	h := dead.Headers()
	assert.Equal(t, "1", h.Get("seq"))
	assert.Equal(t, bus.DeadLetterReasonGaveUp, h.Get(bus.KeyDeadLetterReason))
	assert.Equal(t, "card declined", h.Get(bus.KeyDeadLetterError))
	assert.Equal(t, "orders", h.Get(bus.KeyDeadLetterTopic))
	assert.Equal(t, "g", h.Get(bus.KeyDeadLetterGroup))
	assert.Equal(t, "2", h.Get(bus.KeyDeadLetterAttempts))
	assert.NotEmpty(t, h.Get(nats.KeyDeadLetterMessageID))
	assert.EqualValues(t, 1, sub.Stats().DeadLettered)
}

// A message this transport did not write (no Nats-Msg-Id) is dead-lettered
// with the reason, and the next one is delivered.
func TestSubscriber_UndecodableMessageIsDeadLettered(t *testing.T) {
	t.Parallel()
	cc := conn(t, 1)
	sub, err := nats.NewSubscriber(nats.SubscriberConfig{ConnectionConfig: cc, ConsumerGroup: "g"}, nil)
	require.NoError(t, err)
	defer sub.Close()
	msgs, err := sub.Subscribe(context.Background(), "orders")
	require.NoError(t, err)

	js := rawJS(t)
	_, err = js.Publish(context.Background(), cc.SubjectPrefix+"orders.0", []byte("?"))
	require.NoError(t, err)
	pub, err := nats.NewPublisher(nats.PublisherConfig{ConnectionConfig: cc}, nil)
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
	assert.Equal(t, []byte("?"), dead.Data())
	assert.Equal(t, bus.DeadLetterReasonUndecodable, dead.Headers().Get(bus.KeyDeadLetterReason))
	assert.Contains(t, dead.Headers().Get(bus.KeyDeadLetterError), "no Nats-Msg-Id header")
}

// A relay retry of a message JetStream already stored (same UUID, inside
// the duplicate window) is stored once; bad input is refused by name; a
// server that cannot be reached is a transient error that shows no secret.
func TestPublisher_DedupsRetriesRefusesBadInputMarksOutagesTransient(t *testing.T) {
	t.Parallel()
	cc := conn(t, 2)
	pub, err := nats.NewPublisher(nats.PublisherConfig{ConnectionConfig: cc}, nil)
	require.NoError(t, err)
	defer pub.Close()
	msg := keyed("k", "1")
	require.NoError(t, pub.Publish("orders", msg))
	require.NoError(t, pub.Publish("orders", msg.Copy()), "a retry succeeds")
	info, err := rawJS(t).Stream(context.Background(), streamOf(cc, "orders"))
	require.NoError(t, err)
	assert.EqualValues(t, 1, info.CachedInfo().State.Msgs, "stored once")

	bad := keyed("k", "2")
	bad.Metadata.Set("Nats-Expected-Stream", "other")
	err = pub.Publish("orders", bad)
	require.Error(t, err)
	assert.Contains(t, err.Error(), `metadata key "Nats-Expected-Stream": Nats- headers are set by NATS itself`)
	err = pub.Publish("orders with spaces", keyed("k", "3"))
	require.Error(t, err)
	assert.Contains(t, err.Error(), `topic "orders with spaces" cannot be a NATS subject`)

	down := cc
	down.URL = "nats://user:secret-pw@127.0.0.1:1"
	down.Timeout = time.Second
	pub2, err := nats.NewPublisher(nats.PublisherConfig{ConnectionConfig: down}, nil)
	require.NoError(t, err)
	err = pub2.Publish("orders", keyed("k", "1"))
	require.Error(t, err)
	assert.Equal(t, bus.ClassTransient, bus.ClassOf(err))
	assert.NotContains(t, err.Error(), "secret-pw")
}

// A topic's shard count is recorded on first use; another count is refused
// with both counts and the key.
func TestShardCount_AnotherCountIsRefused(t *testing.T) {
	t.Parallel()
	cc := conn(t, 4)
	pub, err := nats.NewPublisher(nats.PublisherConfig{ConnectionConfig: cc}, nil)
	require.NoError(t, err)
	defer pub.Close()
	require.NoError(t, pub.Publish("orders", keyed("k", "1")))

	other := cc
	other.Shards = 8
	sub, err := nats.NewSubscriber(nats.SubscriberConfig{ConnectionConfig: other, ConsumerGroup: "g"}, nil)
	require.NoError(t, err)
	defer sub.Close()
	_, err = sub.Subscribe(context.Background(), "orders")
	require.Error(t, err)
	var sce *nats.ShardCountError
	require.ErrorAs(t, err, &sce)
	assert.Equal(t, 8, sce.Configured)
	assert.Equal(t, 4, sce.Recorded)
	assert.ErrorIs(t, err, nats.ErrShardCount)
	assert.ErrorIs(t, err, bus.ErrInvalidConfig)
	assert.Contains(t, err.Error(), "nats.shards: 8, but topic \"orders\" was set up with 4 shards")
	pub8, err := nats.NewPublisher(nats.PublisherConfig{ConnectionConfig: other}, nil)
	require.NoError(t, err)
	defer pub8.Close()
	assert.True(t, errors.Is(pub8.Publish("orders", keyed("k", "2")), nats.ErrShardCount))
}

// A group that has never read a topic starts at the stream's first
// message; a group that has, resumes where it settled.
func TestNewGroupReadsFromTheStart(t *testing.T) {
	t.Parallel()
	cc := conn(t, 2)
	pub, err := nats.NewPublisher(nats.PublisherConfig{ConnectionConfig: cc}, nil)
	require.NoError(t, err)
	defer pub.Close()
	for i := range 10 {
		require.NoError(t, pub.Publish("orders", keyed("k"+strconv.Itoa(i%3), strconv.Itoa(i))))
	}
	read := func(n int) []string {
		sub := subscriber(t, cc, "late")
		defer sub.Close()
		msgs, err := sub.Subscribe(context.Background(), "orders")
		require.NoError(t, err)
		var seqs []string
		for len(seqs) < n {
			select {
			case m := <-msgs:
				seqs = append(seqs, m.Metadata.Get("seq"))
				m.Ack()
			case <-time.After(10 * time.Second):
				t.Fatalf("only %v arrived", seqs)
			}
		}
		return seqs
	}
	assert.Len(t, read(10), 10, "every message published before the group existed")
	for i := 10; i < 13; i++ {
		require.NoError(t, pub.Publish("orders", keyed("k", strconv.Itoa(i))))
	}
	assert.ElementsMatch(t, []string{"10", "11", "12"}, read(3), "the group resumes after what it settled")
}

// The message at the head of a shard whose owner died with it unsettled
// is handed to the next owner with an attempt counted for each owner that
// died on it: a message that crashes its consumer runs out of attempts
// instead of killing every consumer in turn.
func TestShards_OwnersDyingOnAMessageCountAttempts(t *testing.T) {
	t.Parallel()
	cc := conn(t, 1)
	pub, err := nats.NewPublisher(nats.PublisherConfig{ConnectionConfig: cc}, nil)
	require.NoError(t, err)
	defer pub.Close()
	require.NoError(t, pub.Publish("orders", keyed("k", "1")))

	for want := range 3 {
		px := testenv.NewStallProxy(t, "127.0.0.1:4222")
		dying := cc
		dying.URL = "nats://" + px.Addr()
		sub := subscriber(t, dying, "g")
		msgs, err := sub.Subscribe(context.Background(), "orders")
		require.NoError(t, err)
		select {
		case m := <-msgs:
			d, _ := bus.DeliveryOf(m)
			assert.Equal(t, want, d.Attempts, "owner %d", want)
		case <-time.After(10 * time.Second):
			t.Fatalf("owner %d got nothing", want)
		}
		px.Stall(true) // it dies holding the message
		go sub.Close()
	}
}
