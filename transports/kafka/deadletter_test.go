package kafka_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/internal/testenv"
	"github.com/omnibus-go/omnibus/transports/kafka"
)

// TestSubscriber_GiveUpGoesToDeadLetterTopic fails one message until its
// budget runs out (as the Retry middleware would settle it): it lands on the
// dead-letter topic with the error, attempt count and origin, and the
// messages after it in its partition, of its own key too, go on.
func TestSubscriber_GiveUpGoesToDeadLetterTopic(t *testing.T) {
	t.Parallel()
	brokers := testenv.Kafka(t)
	topic := testenv.KafkaTopic(t, brokers, 2)

	poison := message.NewMessage(watermill.NewUUID(), []byte("poison"))
	after := message.NewMessage(watermill.NewUUID(), []byte("after"))
	other := message.NewMessage(watermill.NewUUID(), []byte("other"))
	for _, m := range []*message.Message{poison, after} {
		bus.SetPartitionKey(m, "order-1")
	}
	bus.SetPartitionKey(other, "order-2")
	pub := newPublisher(t, testPublisherConfig(brokers))
	require.NoError(t, pub.Publish(topic, poison, after, other))

	cfg := testSubscriberConfig(brokers, groupName(t))
	cfg.MaxAttempts = 3
	sub := newSubscriber(t, cfg)
	msgs, err := sub.Subscribe(context.Background(), topic)
	require.NoError(t, err)

	var poisonAttempts []int
	var poisonDelivery bus.Delivery
	gotAfter, gotOther := false, false
	for !gotAfter || !gotOther {
		m := receive(t, msgs, 30*time.Second, "subscriber")
		d, ok := bus.DeliveryOf(m)
		require.True(t, ok, "no Delivery in the message context")
		switch m.UUID {
		case poison.UUID:
			require.False(t, gotAfter, "a later message of the key was delivered before the poison message was settled")
			poisonAttempts = append(poisonAttempts, d.Attempts)
			poisonDelivery = d
			s := bus.Settlement{Class: bus.ClassCounted, Error: "poison pill: cannot bill order-1"}
			s.GiveUp = d.Attempts+1 >= d.MaxAttempts
			bus.Settle(m, s)
			m.Nack()
		case after.UUID:
			gotAfter = true
			m.Ack()
		case other.UUID:
			gotOther = true
			m.Ack()
		}
	}
	assert.Equal(t, []int{0, 1, 2}, poisonAttempts, "attempts seen by the poison message's deliveries")
	assert.Equal(t, topic, poisonDelivery.Topic)
	assert.Equal(t, topic, poisonDelivery.Source)
	assert.Equal(t, 3, poisonDelivery.MaxAttempts)
	assert.Equal(t, strconv.Itoa(int(poisonDelivery.Partition))+"/"+strconv.FormatInt(poisonDelivery.Offset, 10), poisonDelivery.ID)

	dl := consumeRaw(t, brokers, kafka.DeadLetterTopicFor("", topic), 1, 30*time.Second)[0]
	assert.Equal(t, "order-1", string(dl.Key))
	assert.Equal(t, "poison", string(dl.Value))
	assert.Equal(t, poison.UUID, header(dl, kafka.HeaderUUID))
	assert.Equal(t, kafka.DeadLetterReasonGaveUp, header(dl, kafka.HeaderDeadLetterReason))
	assert.Equal(t, "poison pill: cannot bill order-1", header(dl, kafka.HeaderDeadLetterError))
	assert.Equal(t, "3", header(dl, kafka.HeaderDeadLetterAttempts))
	assert.Equal(t, "counted", header(dl, kafka.HeaderDeadLetterClass))
	assert.Equal(t, topic, header(dl, kafka.HeaderDeadLetterTopic))
	assert.Equal(t, strconv.Itoa(int(poisonDelivery.Partition)), header(dl, kafka.HeaderDeadLetterPartition))
	assert.Equal(t, strconv.FormatInt(poisonDelivery.Offset, 10), header(dl, kafka.HeaderDeadLetterOffset))
	assert.Equal(t, cfg.ConsumerGroup, header(dl, kafka.HeaderDeadLetterGroup))
	assert.Equal(t, "order-1", header(dl, bus.KeyPartitionKey), "original headers are kept")
}

// TestSubscriber_UndecodableRecordGoesToDeadLetterTopic writes a record
// whose UUID header is empty: it is dead-lettered with the decoding error,
// never delivered, and the next record of its partition is.
func TestSubscriber_UndecodableRecordGoesToDeadLetterTopic(t *testing.T) {
	t.Parallel()
	brokers := testenv.Kafka(t)
	topic := testenv.KafkaTopic(t, brokers, 1)

	sc := sarama.NewConfig()
	sc.Producer.Return.Successes = true
	raw, err := sarama.NewSyncProducer(brokers, sc)
	require.NoError(t, err)
	defer func() { _ = raw.Close() }()
	_, badOffset, err := raw.SendMessage(&sarama.ProducerMessage{
		Topic:   topic,
		Key:     sarama.StringEncoder("k"),
		Value:   sarama.StringEncoder("garbled"),
		Headers: []sarama.RecordHeader{{Key: []byte(kafka.HeaderUUID), Value: nil}},
	})
	require.NoError(t, err)
	good := message.NewMessage(watermill.NewUUID(), []byte("good"))
	bus.SetPartitionKey(good, "k")
	require.NoError(t, newPublisher(t, testPublisherConfig(brokers)).Publish(topic, good))

	cfg := testSubscriberConfig(brokers, groupName(t))
	cfg.DeadLetterTopic = "dead.{topic}"
	sub := newSubscriber(t, cfg)
	msgs, err := sub.Subscribe(context.Background(), topic)
	require.NoError(t, err)
	m := receive(t, msgs, 30*time.Second, "subscriber")
	assert.Equal(t, good.UUID, m.UUID, "the first message delivered is the one after the undecodable record")
	m.Ack()

	dl := consumeRaw(t, brokers, "dead."+topic, 1, 30*time.Second)[0]
	assert.Equal(t, "garbled", string(dl.Value))
	assert.Equal(t, kafka.DeadLetterReasonUndecodable, header(dl, kafka.HeaderDeadLetterReason))
	assert.True(t, strings.Contains(header(dl, kafka.HeaderDeadLetterError), kafka.ErrUndecodable.Error()),
		"dead letter error %q does not say why", header(dl, kafka.HeaderDeadLetterError))
	assert.Equal(t, strconv.FormatInt(badOffset, 10), header(dl, kafka.HeaderDeadLetterOffset))
	assert.Equal(t, "0", header(dl, kafka.HeaderDeadLetterAttempts))
}

// TestSubscriber_DeadLetterOfARecordAboveTheDefaultSizeIsWritten gives up
// on a record larger than DefaultMaxMessageBytes that its topic accepts (the
// topic and its dead-letter topic allow 4 MiB): the dead letter is written,
// not refused by a local size limit and retried forever while the
// partition waits.
func TestSubscriber_DeadLetterOfARecordAboveTheDefaultSizeIsWritten(t *testing.T) {
	t.Parallel()
	brokers := testenv.Kafka(t)
	topic := testenv.Name(t)
	const limit = 4 << 20
	createTopicWithConfig(t, brokers, topic, map[string]string{"max.message.bytes": strconv.Itoa(limit)})
	createTopicWithConfig(t, brokers, kafka.DeadLetterTopicFor("", topic), map[string]string{"max.message.bytes": strconv.Itoa(limit)})

	big := message.NewMessage(watermill.NewUUID(), make([]byte, kafka.DefaultMaxMessageBytes+100_000))
	bus.SetPartitionKey(big, "k")
	pcfg := testPublisherConfig(brokers)
	pcfg.MaxMessageBytes = limit - 1024
	require.NoError(t, newPublisher(t, pcfg).Publish(topic, big))

	sub := newSubscriber(t, testSubscriberConfig(brokers, groupName(t)))
	msgs, err := sub.Subscribe(context.Background(), topic)
	require.NoError(t, err)
	m := receive(t, msgs, 30*time.Second, "subscriber")
	require.Equal(t, big.UUID, m.UUID)
	bus.Settle(m, bus.Settlement{Class: bus.ClassPermanent, GiveUp: true, Error: "cannot handle it"})
	m.Nack()

	dl := consumeRaw(t, brokers, kafka.DeadLetterTopicFor("", topic), 1, 30*time.Second)[0]
	assert.Equal(t, big.UUID, header(dl, kafka.HeaderUUID))
	assert.Len(t, dl.Value, len(big.Payload), "the dead letter keeps the whole value")
	assert.Equal(t, kafka.DeadLetterReasonGaveUp, header(dl, kafka.HeaderDeadLetterReason))
}

// createTopicWithConfig creates topic with one partition and the given topic
// configs, and waits until it has a leader.
func createTopicWithConfig(t *testing.T, brokers []string, topic string, configs map[string]string) {
	t.Helper()
	cfg := sarama.NewConfig()
	admin, err := sarama.NewClusterAdmin(brokers, cfg)
	require.NoError(t, err, "connect to create topic %q", topic)
	defer func() { _ = admin.Close() }()
	entries := make(map[string]*string, len(configs))
	for k, v := range configs {
		entries[k] = &v
	}
	require.NoError(t, admin.CreateTopic(topic, &sarama.TopicDetail{NumPartitions: 1, ReplicationFactor: 1, ConfigEntries: entries}, false),
		"create topic %q", topic)
	testenv.Eventually(t, 30*time.Second, func() bool {
		md, err := admin.DescribeTopics([]string{topic})
		return err == nil && len(md) == 1 && errors.Is(md[0].Err, sarama.ErrNoError) && len(md[0].Partitions) == 1
	}, "topic %q has a leader", topic)
}
