package redis_test

import (
	"context"
	"maps"
	"strconv"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omnibus-go/omnibus/bus"
)

// TestPublisher_RefusesWhatItsSubscriberCannotDecode: the subscriber's
// decoder (DefaultMarshaler.Unmarshal, behind XREADGROUP and the
// XAUTOCLAIM script) dead-letters an entry without a non-empty "uuid"
// field. Publish must refuse such a message itself, with a permanent error
// naming what is wrong, before any message of the call is written. A nil
// message is refused the same way rather than panicking.
func TestPublisher_RefusesWhatItsSubscriberCannotDecode(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	pub := e.publisher()
	good := func() *message.Message { return message.NewMessage(watermill.NewUUID(), []byte("ok")) }
	noUUID := func() *message.Message { return message.NewMessage("", []byte("x")) }

	cases := []struct {
		name string
		msgs []*message.Message
		want string // in the error
	}{
		{"empty UUID", []*message.Message{noUUID()}, `field "uuid"`},
		{"empty UUID after a good message", []*message.Message{good(), noUUID()}, `field "uuid"`},
		{"nil message", []*message.Message{nil}, "message 1 of 1 is nil"},
		{"nil message after a good one", []*message.Message{good(), nil}, "message 2 of 2 is nil"},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			topic := "orders-" + strconv.Itoa(i)
			var err error
			require.NotPanics(t, func() { err = pub.Publish(topic, tc.msgs...) }, "Publish panicked")
			require.Error(t, err)
			assert.Equal(t, bus.ClassPermanent, bus.ClassOf(err), "must be permanent: %v", err)
			assert.ErrorContains(t, err, tc.want)
			n, xerr := e.client.XLen(context.Background(), e.prefix+topic).Result()
			require.NoError(t, xerr)
			assert.Zero(t, n, "a refused Publish wrote entries")
		})
	}
}

// edgeMessages are messages at the edges of what DefaultMarshaler accepts;
// the subscriber must decode each to the same UUID, payload and metadata.
func edgeMessages() []*message.Message {
	msg := func(uuid string, payload []byte, md map[string]string) *message.Message {
		m := message.NewMessage(uuid, payload)
		maps.Copy(m.Metadata, md)
		return m
	}
	many := map[string]string{}
	for i := range 500 {
		many["k"+strconv.Itoa(i)] = strconv.Itoa(i)
	}
	return []*message.Message{
		msg("plain", []byte(`{"id":42}`), map[string]string{bus.KeyPartitionKey: "order-42", bus.KeyEventType: "order.paid"}),
		msg("nil-payload", nil, nil),
		msg("empty-payload", []byte{}, nil),
		msg("binary-payload", []byte{0, 0xff, 0xfe, '\n', '\r', 0}, nil),
		msg("empty-metadata-key", []byte("x"), map[string]string{"": "empty key"}),
		msg("empty-metadata-value", []byte("x"), map[string]string{"k": ""}),
		msg("fields-named-like-ours", []byte("x"), map[string]string{"uuid": "u", "payload": "p", "meta:x": "nested prefix", "meta:": "prefix only"}),
		msg("dead-letter-keys", []byte("x"), map[string]string{bus.KeyDeadLetterReason: "kept on a normal stream"}),
		msg("non-utf8-\xff\xfe", []byte("x"), map[string]string{"key-\xff": "value-\xc3\x28", "nul\x00key": "nul\x00value"}),
		msg(" spaces and\ttabs ", []byte("x"), map[string]string{"  ": "  "}),
		msg("many-metadata", []byte("x"), many),
	}
}

// TestCodec_EdgeMessagesRoundTripThroughRedis publishes edgeMessages with
// the Publisher and reads them back with the Subscriber on each of its
// decode paths: XREADGROUP through go-redis's typed command, XREADGROUP read
// raw (every read after a full batch: batches of one here), and the
// XAUTOCLAIM script (entries reclaimed from a consumer that died).
func TestCodec_EdgeMessagesRoundTripThroughRedis(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	const topic = "orders"
	stream := e.prefix + topic
	sent := edgeMessages()
	require.NoError(t, e.publisher().Publish(topic, sent...))

	// A consumer of group "reclaim" reads everything and dies.
	require.NoError(t, e.client.XGroupCreate(ctx, stream, "reclaim", "0").Err())
	_, err := e.client.XReadGroup(ctx, &goredis.XReadGroupArgs{
		Group: "reclaim", Consumer: "gone", Streams: []string{stream, ">"}, Count: int64(len(sent)), Block: -1,
	}).Result()
	require.NoError(t, err)

	for _, group := range []string{"read", "read-raw", "reclaim"} {
		t.Run(group, func(t *testing.T) {
			cfg := e.fastSubscriberConfig(group)
			if group == "read-raw" {
				cfg.BatchSize = 1
			}
			sub := e.subscriber(cfg)
			msgs := e.subscribe(sub, topic)
			received := map[string]*message.Message{}
			for range sent {
				got := receive(t, msgs, 10*time.Second)
				received[got.UUID] = got
				got.Ack()
			}
			for _, want := range sent {
				got, ok := received[want.UUID]
				if assert.True(t, ok, "message %q not received", want.UUID) {
					assertSameMessage(t, want, got)
				}
			}
			assert.Zero(t, sub.Stats().Undecodable, "entries the Publisher wrote were undecodable")
			if group == "reclaim" {
				assert.EqualValues(t, len(sent), sub.Stats().Reclaimed, "the entries were not reclaimed")
			}
		})
	}
}

// assertSameMessage checks that got carries want's UUID, payload and
// metadata (a nil payload or metadata equals an empty one).
func assertSameMessage(t *testing.T, want, got *message.Message) {
	t.Helper()
	assert.Equal(t, want.UUID, got.UUID, "UUID")
	assert.Equal(t, string(want.Payload), string(got.Payload), "payload of %q", want.UUID)
	assert.Equal(t, len(want.Metadata), len(got.Metadata), "metadata of %q: %v, want %v", want.UUID, got.Metadata, want.Metadata)
	for k, v := range want.Metadata {
		gv, ok := got.Metadata[k]
		assert.True(t, ok && gv == v, "metadata %q of %q: got %q (present %v), want %q", k, want.UUID, gv, ok, v)
	}
}
