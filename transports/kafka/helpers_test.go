package kafka_test

import (
	"context"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/omnibus-go/omnibus/internal/testenv"
	"github.com/omnibus-go/omnibus/transports/kafka"
)

// testPublisherConfig is a publisher config for brokers.
func testPublisherConfig(brokers []string) kafka.PublisherConfig {
	return kafka.PublisherConfig{ConnectionConfig: kafka.ConnectionConfig{Brokers: brokers, ClientID: "omnibus-test"}}
}

// testSubscriberConfig is a subscriber config that notices rebalances
// quickly: tests start and stop group members all the time.
func testSubscriberConfig(brokers []string, group string) kafka.SubscriberConfig {
	return kafka.SubscriberConfig{
		ConnectionConfig:  kafka.ConnectionConfig{Brokers: brokers, ClientID: "omnibus-test"},
		ConsumerGroup:     group,
		SessionTimeout:    6 * time.Second,
		HeartbeatInterval: 100 * time.Millisecond,
		RebalanceTimeout:  10 * time.Second,
		CommitInterval:    100 * time.Millisecond,
		NackDelay:         10 * time.Millisecond,
		Tune: func(c *sarama.Config) {
			c.Consumer.Group.Rebalance.Retry.Backoff = 100 * time.Millisecond
			c.Metadata.Retry.Backoff = 50 * time.Millisecond
		},
	}
}

func newPublisher(t testing.TB, cfg kafka.PublisherConfig) *kafka.Publisher {
	t.Helper()
	pub, err := kafka.NewPublisher(cfg, nil)
	require.NoError(t, err, "new publisher")
	t.Cleanup(func() { _ = pub.Close() })
	return pub
}

func newSubscriber(t testing.TB, cfg kafka.SubscriberConfig) *kafka.Subscriber {
	t.Helper()
	sub, err := kafka.NewSubscriber(cfg, nil)
	require.NoError(t, err, "new subscriber")
	t.Cleanup(func() { _ = sub.Close() })
	return sub
}

// groupName is a consumer group name unique to the test.
func groupName(t testing.TB) string { return "g_" + testenv.Name(t) }

// receive reads one message from ch or fails the test after timeout.
func receive(t testing.TB, ch <-chan *message.Message, timeout time.Duration, what string) *message.Message {
	t.Helper()
	select {
	case msg, ok := <-ch:
		require.True(t, ok, "%s: channel closed", what)
		return msg
	case <-time.After(timeout):
		t.Fatalf("%s: nothing received within %s", what, timeout)
		return nil
	}
}

// consumeRaw reads n records of topic from the start with a plain sarama
// consumer, for checking what landed on a topic (a dead-letter topic).
func consumeRaw(t testing.TB, brokers []string, topic string, n int, timeout time.Duration) []*sarama.ConsumerMessage {
	t.Helper()
	cfg := sarama.NewConfig()
	cfg.Consumer.Offsets.Initial = sarama.OffsetOldest
	client, err := sarama.NewClient(brokers, cfg)
	require.NoError(t, err)
	defer func() { _ = client.Close() }()
	consumer, err := sarama.NewConsumerFromClient(client)
	require.NoError(t, err)
	defer func() { _ = consumer.Close() }()

	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var partitions []int32
	for ctx.Err() == nil {
		if err := client.RefreshMetadata(topic); err == nil {
			if partitions, err = client.Partitions(topic); err == nil && len(partitions) > 0 {
				break
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(20 * time.Millisecond): // polling for the topic, with the deadline above
		}
	}
	require.NotEmpty(t, partitions, "topic %q never appeared", topic)

	out := make(chan *sarama.ConsumerMessage)
	for _, p := range partitions {
		pc, err := consumer.ConsumePartition(topic, p, sarama.OffsetOldest)
		require.NoError(t, err)
		defer func() { _ = pc.Close() }()
		go func() {
			for m := range pc.Messages() {
				select {
				case out <- m:
				case <-ctx.Done():
					return
				}
			}
		}()
	}
	var got []*sarama.ConsumerMessage
	for len(got) < n {
		select {
		case m := <-out:
			got = append(got, m)
		case <-ctx.Done():
			t.Fatalf("read %d of %d records from %q within %s", len(got), n, topic, timeout)
		}
	}
	return got
}

func header(rec *sarama.ConsumerMessage, key string) string {
	for _, h := range rec.Headers {
		if string(h.Key) == key {
			return string(h.Value)
		}
	}
	return ""
}
