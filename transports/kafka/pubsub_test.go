package kafka_test

import (
	"testing"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/tests"

	"github.com/omnibus-go/omnibus/internal/testenv"
	"github.com/omnibus-go/omnibus/transports/kafka"
)

// suiteGroup names the consumer group of one universal-suite test. The
// suite calls the constructor several times per test and expects the
// subscribers to share a group (TestContinueAfterSubscribeClose resumes
// where the previous one stopped), while different tests must not share one
// (a group spanning the suite's parallel tests would rebalance constantly).
// The test name is the same for every call within a test and unique across
// them (the suite puts a fresh UUID in it).
func suiteGroup(t *testing.T) string { return "g_" + t.Name() }

func suitePubSub(t *testing.T, group string, marshaler kafka.Marshaler) (message.Publisher, message.Subscriber) {
	brokers := testenv.Kafka(t)
	pcfg := testPublisherConfig(brokers)
	pcfg.Marshaler = marshaler
	pub, err := kafka.NewPublisher(pcfg, nil)
	if err != nil {
		t.Fatalf("new publisher: %v", err)
	}
	scfg := testSubscriberConfig(brokers, group)
	scfg.Marshaler = marshaler
	sub, err := kafka.NewSubscriber(scfg, nil)
	if err != nil {
		t.Fatalf("new subscriber: %v", err)
	}
	return pub, sub
}

// TestPubSub_ConsumerGroup runs Watermill's universal suite against
// keyless records in consumer groups. Keyless records of a partition are
// handed out concurrently, so the suite's order is not promised.
func TestPubSub_ConsumerGroup(t *testing.T) {
	t.Parallel()
	tests.TestPubSub(t,
		tests.Features{
			ConsumerGroups:      true,
			ExactlyOnceDelivery: false,
			GuaranteedOrder:     false,
			Persistent:          true,
			// A new subscriber of the same group resumes at the group's
			// offset; it does not see old messages again.
			NewSubscriberReceivesOldMessages: false,
			// The message context is the subscriber's, not the publisher's.
			ContextPreserved: false,
			// Full sizes: ForceShort is not needed.
		},
		func(t *testing.T) (message.Publisher, message.Subscriber) {
			return suitePubSub(t, suiteGroup(t), kafka.DefaultMarshaler{})
		},
		func(t *testing.T, group string) (message.Publisher, message.Subscriber) {
			return suitePubSub(t, group, kafka.DefaultMarshaler{})
		},
	)
}

// payloadKeyMarshaler keys every record by its payload. The suite checks
// order per payload ("message type"), the transport promises order per
// key: keyed by payload, the suite's order is exactly the transport's, with
// records of different keys still handled concurrently within a partition.
type payloadKeyMarshaler struct{ kafka.DefaultMarshaler }

func (m payloadKeyMarshaler) Marshal(topic string, msg *message.Message) (*sarama.ProducerMessage, error) {
	pm, err := m.DefaultMarshaler.Marshal(topic, msg)
	if err != nil {
		return nil, err
	}
	pm.Key = sarama.ByteEncoder(msg.Payload)
	return pm, nil
}

// TestPubSub_KeyedOrdered runs the universal suite with keyed records and
// GuaranteedOrder: per key, messages arrive in publish order, and the next
// message of a key waits for the previous one's ack (TestNoAck).
func TestPubSub_KeyedOrdered(t *testing.T) {
	t.Parallel()
	tests.TestPubSub(t,
		tests.Features{
			ConsumerGroups:                   true,
			ExactlyOnceDelivery:              false,
			GuaranteedOrder:                  true,
			Persistent:                       true,
			NewSubscriberReceivesOldMessages: false,
			ContextPreserved:                 false,
		},
		func(t *testing.T) (message.Publisher, message.Subscriber) {
			return suitePubSub(t, suiteGroup(t), payloadKeyMarshaler{})
		},
		func(t *testing.T, group string) (message.Publisher, message.Subscriber) {
			return suitePubSub(t, group, payloadKeyMarshaler{})
		},
	)
}
