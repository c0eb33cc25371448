package kafka_test

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/internal/testenv"
	"github.com/omnibus-go/omnibus/transports/kafka"
)

// TestPublisher_RefusesWhatTheSubscriberCannotDecode publishes each message
// the subscriber's decoder would refuse (and so dead-letter): Publish fails
// with a permanent error naming the field, and nothing of the call is
// written, neither the bad message nor a good one published with it. The
// first record on the topic is the one published after them.
func TestPublisher_RefusesWhatTheSubscriberCannotDecode(t *testing.T) {
	t.Parallel()
	brokers := testenv.Kafka(t)
	topic := testenv.KafkaTopic(t, brokers, 1)
	pub := newPublisher(t, testPublisherConfig(brokers))

	withMetadata := func(k, v string) *message.Message {
		msg := message.NewMessage(watermill.NewUUID(), []byte("x"))
		msg.Metadata.Set(k, v)
		return msg
	}
	nonUTF8Key := message.NewMessage(watermill.NewUUID(), []byte("x"))
	bus.SetPartitionKey(nonUTF8Key, "order-\xfe")
	cases := []struct {
		name string
		msg  *message.Message
		says string // in the error
	}{
		{"empty UUID", message.NewMessage("", []byte("x")), "message uuid is empty"},
		{"UUID not UTF-8", message.NewMessage("id-\xff", []byte("x")), `message uuid "id-\xff" is not valid UTF-8`},
		{"empty metadata key", withMetadata("", "v"), `metadata key "" is empty`},
		{"metadata key not UTF-8", withMetadata("k\xff", "v"), `metadata key "k\xff" is not valid UTF-8`},
		{"metadata value not UTF-8", withMetadata("k", "v\xff"), `the value of metadata key "k" is not valid UTF-8`},
		{"partition key not UTF-8", nonUTF8Key, `the value of metadata key "partition_key" is not valid UTF-8`},
		{"reserved metadata key", withMetadata(kafka.HeaderUUID, "spoofed"), `metadata key "` + kafka.HeaderUUID + `" is reserved`},
		{"nil message", nil, "message 2 of 2 is nil"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			good := message.NewMessage(watermill.NewUUID(), []byte("good"))
			for _, msgs := range [][]*message.Message{{tc.msg}, {good, tc.msg}} {
				if tc.msg == nil && len(msgs) == 1 {
					continue
				}
				err := pub.Publish(topic, msgs...)
				require.Error(t, err, "publish of %d message(s), the last one bad", len(msgs))
				assert.Equal(t, bus.ClassPermanent, bus.ClassOf(err), "class of %v", err)
				assert.ErrorIs(t, err, kafka.ErrUnencodable)
				assert.Contains(t, err.Error(), tc.says)
				assert.Contains(t, err.Error(), topic, "the error names the topic")
			}
		})
	}

	marker := message.NewMessage(watermill.NewUUID(), []byte("marker"))
	require.NoError(t, pub.Publish(topic, marker))
	first := consumeRaw(t, brokers, topic, 1, 30*time.Second)[0]
	assert.Equal(t, marker.UUID, header(first, kafka.HeaderUUID), "the first record written is the marker: nothing of the refused calls was sent")
	assert.Equal(t, int64(0), first.Offset)

	sub := newSubscriber(t, testSubscriberConfig(brokers, groupName(t)))
	msgs, err := sub.Subscribe(context.Background(), topic)
	require.NoError(t, err)
	got := receive(t, msgs, 30*time.Second, "subscriber")
	assert.Equal(t, marker.UUID, got.UUID)
	got.Ack()
}
