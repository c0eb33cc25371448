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
		assert.Equal(t, bus.ClassTransient, bus.ClassOf(err), "class of %v", err)
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
