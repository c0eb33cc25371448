package kafka_test

import (
	"context"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omnibus-go/omnibus/internal/testenv"
	"github.com/omnibus-go/omnibus/transports/kafka"
)

// TestClient_CallerOwnedClientIsUsedNotClosed passes one sarama client to
// a publisher and a subscriber: both work through it, and after both are
// closed the client is still open.
func TestClient_CallerOwnedClientIsUsedNotClosed(t *testing.T) {
	t.Parallel()
	brokers := testenv.Kafka(t)
	topic := testenv.KafkaTopic(t, brokers, 1)

	sc := sarama.NewConfig()
	sc.Producer.Return.Successes = true
	sc.Consumer.Offsets.Initial = sarama.OffsetOldest
	sc.Consumer.Group.Heartbeat.Interval = 100 * time.Millisecond
	client, err := sarama.NewClient(brokers, sc)
	require.NoError(t, err)
	defer func() { _ = client.Close() }()

	pub, err := kafka.NewPublisher(kafka.PublisherConfig{Client: client}, nil)
	require.NoError(t, err)
	msg := message.NewMessage(watermill.NewUUID(), []byte("x"))
	require.NoError(t, pub.Publish(topic, msg))
	require.NoError(t, pub.Close())
	assert.False(t, client.Closed(), "the publisher closed the caller's client")

	sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{Client: client, ConsumerGroup: groupName(t)}, nil)
	require.NoError(t, err)
	msgs, err := sub.Subscribe(context.Background(), topic)
	require.NoError(t, err)
	_, err = sub.Subscribe(context.Background(), topic)
	assert.Error(t, err, "a second subscription on one sarama client is refused")
	got := receive(t, msgs, 30*time.Second, "subscriber")
	assert.Equal(t, msg.UUID, got.UUID)
	got.Ack()
	require.NoError(t, sub.Close())
	assert.False(t, client.Closed(), "the subscriber closed the caller's client")

	_, err = client.Partitions(topic)
	assert.NoError(t, err, "the caller's client still works")
}

func TestClient_CallerClientWithoutReturnedSuccessesIsRefused(t *testing.T) {
	t.Parallel()
	client, err := sarama.NewClient(testenv.Kafka(t), sarama.NewConfig())
	require.NoError(t, err)
	defer func() { _ = client.Close() }()
	_, err = kafka.NewPublisher(kafka.PublisherConfig{Client: client}, nil)
	assertFieldError(t, err, "Client")
}

func TestSubscriber_CloseIsIdempotentAndEndsSubscriptions(t *testing.T) {
	t.Parallel()
	brokers := testenv.Kafka(t)
	topic := testenv.KafkaTopic(t, brokers, 1)
	sub, err := kafka.NewSubscriber(testSubscriberConfig(brokers, groupName(t)), nil)
	require.NoError(t, err)
	msgs, err := sub.Subscribe(context.Background(), topic)
	require.NoError(t, err)
	require.NoError(t, sub.Close())
	require.NoError(t, sub.Close())
	_, open := <-msgs
	assert.False(t, open, "the channel is closed by Close")
	_, err = sub.Subscribe(context.Background(), topic)
	assert.ErrorIs(t, err, kafka.ErrClosed)
}

// TestClient_CallerClientOlderThanRecordHeadersIsRefused: a caller's client
// configured for brokers older than 0.11 cannot write or read the headers
// the UUID and metadata travel in, so both configs refuse it up front
// instead of failing every record.
func TestClient_CallerClientOlderThanRecordHeadersIsRefused(t *testing.T) {
	t.Parallel()
	sc := sarama.NewConfig()
	sc.Version = sarama.V0_10_2_0
	sc.Producer.Return.Successes = true
	client, err := sarama.NewClient(testenv.Kafka(t), sc)
	require.NoError(t, err)
	defer func() { _ = client.Close() }()
	_, err = kafka.NewPublisher(kafka.PublisherConfig{Client: client}, nil)
	assertFieldError(t, err, "Client")
	_, err = kafka.NewSubscriber(kafka.SubscriberConfig{Client: client, ConsumerGroup: groupName(t)}, nil)
	assertFieldError(t, err, "Client")
}
