package kafka_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/internal/testenv"
	"github.com/omnibus-go/omnibus/transports/kafka"
)

// TestPublisher_BrokerFaultsAreTransient injects produce errors and dropped
// connections with kfake's request control: Publish fails with an error
// bus.ClassOf reports transient, and succeeds again, in order, once the
// fault is gone.
func TestPublisher_BrokerFaultsAreTransient(t *testing.T) {
	t.Parallel()
	cluster := testenv.NewKafkaCluster(t)
	brokers := cluster.ListenAddrs()
	topic := testenv.KafkaTopic(t, brokers, 1)

	cfg := testPublisherConfig(brokers)
	cfg.Retries = 2
	cfg.RetryBackoff = 10 * time.Millisecond
	pub := newPublisher(t, cfg)
	var delivered []string
	publish := func(payload string) error {
		msg := message.NewMessage(watermill.NewUUID(), []byte(payload))
		bus.SetPartitionKey(msg, "k")
		err := pub.Publish(topic, msg)
		if err == nil {
			delivered = append(delivered, msg.UUID)
		}
		return err
	}
	require.NoError(t, publish("before"))

	t.Run("produce errors", func(t *testing.T) {
		fault := cluster.Fault(kfake.Fault{
			Keys:  []kmsg.Key{kmsg.Produce},
			Topic: topic,
			Err:   kerr.NotEnoughReplicas,
			Count: -1,
		})
		err := publish("during produce errors")
		fault.Remove()
		require.Error(t, err, "publish while every produce request fails")
		assert.Equal(t, bus.ClassTransient, bus.ClassOf(err), "class of %v", err)
		assert.ErrorIs(t, err, sarama.ErrNotEnoughReplicas, "the broker's error is kept in the chain")
		t.Logf("publish error: %v", err)
		require.NoError(t, publish("after produce errors"))
	})

	t.Run("dropped connections", func(t *testing.T) {
		var dropping atomic.Bool
		dropping.Store(true)
		cluster.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
			if !dropping.Load() {
				cluster.DropControl()
				return nil, nil, false
			}
			cluster.KeepControl()
			return nil, errors.New("injected: connection dropped"), true // closes the connection
		})
		err := publish("during dropped connections")
		dropping.Store(false)
		require.Error(t, err, "publish while every produce request loses its connection")
		assert.Equal(t, bus.ClassTransient, bus.ClassOf(err), "class of %v", err)
		t.Logf("publish error: %v", err)
		require.NoError(t, publish("after dropped connections"))
	})

	t.Run("publish gives up with its message context", func(t *testing.T) {
		release := make(chan struct{})
		cluster.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
			cluster.SleepControl(func() { <-release }) // hold the request
			return nil, nil, false
		})
		msg := message.NewMessage(watermill.NewUUID(), []byte("slow"))
		bus.SetPartitionKey(msg, "k")
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		msg.SetContext(ctx)
		err := pub.Publish(topic, msg)
		close(release)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		assert.Equal(t, bus.ClassCounted, bus.ClassOf(err), "a publish that timed out was attempted: counted (%v)", err)
		require.NoError(t, publish("after the held request"))
	})

	// What was acknowledged is on the topic, in publish order. (The held
	// record was written too, once released: it is skipped below.)
	sub := newSubscriber(t, testSubscriberConfig(brokers, groupName(t)))
	msgs, err := sub.Subscribe(context.Background(), topic)
	require.NoError(t, err)
	var got []string
	for len(got) < len(delivered) {
		m := receive(t, msgs, 30*time.Second, "subscriber")
		m.Ack()
		if string(m.Payload) == "slow" {
			continue
		}
		if len(got) == 0 || got[len(got)-1] != m.UUID {
			got = append(got, m.UUID)
		}
	}
	assert.Equal(t, delivered, got, "acknowledged messages, in publish order")
}

func TestPublisher_CloseIsIdempotentAndRefusesLaterPublishes(t *testing.T) {
	t.Parallel()
	brokers := testenv.Kafka(t)
	pub, err := kafka.NewPublisher(testPublisherConfig(brokers), nil)
	require.NoError(t, err)
	topic := testenv.KafkaTopic(t, brokers, 1)
	require.NoError(t, pub.Publish(topic, message.NewMessage(watermill.NewUUID(), []byte("x"))))
	require.NoError(t, pub.Close())
	require.NoError(t, pub.Close())
	err = pub.Publish(topic, message.NewMessage(watermill.NewUUID(), []byte("x")))
	require.ErrorIs(t, err, kafka.ErrClosed)
	assert.Equal(t, bus.ClassTransient, bus.ClassOf(err))
}

// TestPublisher_BrokerRejectionsAreClassifiedPerError has the broker reject
// produce requests with errors of each class: a rejection of the record's
// content is counted (it spends an attempt, so a record the broker keeps
// rejecting reaches its budget), an invalid topic and a record above
// MaxMessageBytes are permanent, and an authorization failure is transient.
// After each, the next Publish goes through.
func TestPublisher_BrokerRejectionsAreClassifiedPerError(t *testing.T) {
	t.Parallel()
	cluster := testenv.NewKafkaCluster(t)
	brokers := cluster.ListenAddrs()
	topic := testenv.KafkaTopic(t, brokers, 1)

	cfg := testPublisherConfig(brokers)
	cfg.Retries = 1
	cfg.RetryBackoff = 10 * time.Millisecond
	pub := newPublisher(t, cfg)
	publish := func(payload []byte) error {
		msg := message.NewMessage(watermill.NewUUID(), payload)
		bus.SetPartitionKey(msg, "k")
		return pub.Publish(topic, msg)
	}

	for _, tc := range []struct {
		kerr      *kerr.Error
		saramaErr sarama.KError
		want      bus.Class
	}{
		{kerr.InvalidRecord, sarama.ErrInvalidRecord, bus.ClassCounted},
		{kerr.MessageTooLarge, sarama.ErrMessageSizeTooLarge, bus.ClassCounted},
		{kerr.CorruptMessage, sarama.ErrInvalidMessage, bus.ClassCounted},
		{kerr.PolicyViolation, sarama.ErrPolicyViolation, bus.ClassCounted},
		{kerr.InvalidTimestamp, sarama.ErrInvalidTimestamp, bus.ClassCounted},
		{kerr.InvalidTopicException, sarama.ErrInvalidTopic, bus.ClassPermanent},
		{kerr.TopicAuthorizationFailed, sarama.ErrTopicAuthorizationFailed, bus.ClassTransient},
		{kerr.ThrottlingQuotaExceeded, sarama.ErrThrottlingQuotaExceeded, bus.ClassTransient},
	} {
		t.Run(tc.kerr.Message, func(t *testing.T) {
			fault := cluster.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: topic, Err: tc.kerr, Count: -1})
			err := publish([]byte("rejected"))
			fault.Remove()
			require.Error(t, err, "publish while the broker rejects every produce request with %s", tc.kerr.Message)
			assert.ErrorIs(t, err, tc.saramaErr, "the broker's error is kept in the chain")
			assert.Equal(t, tc.want, bus.ClassOf(err), "class of %v", err)
			require.NoError(t, publish([]byte("after")), "publish after the rejections stopped")
		})
	}

	t.Run("larger than MaxMessageBytes", func(t *testing.T) {
		err := publish(make([]byte, kafka.DefaultMaxMessageBytes+1))
		require.Error(t, err)
		assert.Equal(t, bus.ClassPermanent, bus.ClassOf(err), "class of %v", err)
		require.NoError(t, publish([]byte("after")))
	})
}
