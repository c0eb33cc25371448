package redis

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/internal/testenv"
)

// A user who scales out consumers of a single-stream topic that orders by
// key loses per-key order; each subscription says so in its log once other
// consumers of its group receive entries of its stream, and says nothing
// while it reads alone.
func TestSubscribe_WarnsWhenOtherConsumersReadAnUnshardedStream(t *testing.T) {
	t.Parallel()
	client := testenv.Redis(t)
	prefix := testenv.RedisPrefix(t)
	pub, err := NewPublisher(PublisherConfig{Client: client, StreamPrefix: prefix}, nil)
	require.NoError(t, err)
	publish := func(n int) {
		for i := range n {
			msg := message.NewMessage(fmt.Sprintf("m-%d-%d", time.Now().UnixNano(), i), []byte("{}"))
			bus.SetPartitionKey(msg, fmt.Sprintf("key-%d", i%7))
			require.NoError(t, pub.Publish("orders", msg))
		}
	}
	subscribe := func(consumer string) *testenv.LogBuffer {
		var logs testenv.LogBuffer
		sub, err := NewSubscriber(SubscriberConfig{
			Client: client, StreamPrefix: prefix, ConsumerGroup: "g", Consumer: consumer,
			OrderByKey: true, BlockTime: 50 * time.Millisecond,
		}, slog.New(slog.NewJSONHandler(&logs, nil)))
		require.NoError(t, err)
		sub.crowdEvery = 100 * time.Millisecond
		t.Cleanup(func() { _ = sub.Close() })
		msgs, err := sub.Subscribe(context.Background(), "orders")
		require.NoError(t, err)
		go func() {
			for msg := range msgs {
				time.Sleep(time.Millisecond)
				msg.Ack()
			}
		}()
		return &logs
	}
	warned := func(logs *testenv.LogBuffer) []any {
		for _, r := range logs.Records(t) {
			if strings.HasPrefix(fmt.Sprint(r["msg"]), "other consumers of this group receive entries") {
				return r["other_consumers"].([]any)
			}
		}
		return nil
	}

	alone := subscribe("alone")
	publish(50)
	time.Sleep(500 * time.Millisecond) // five listings
	assert.Nil(t, warned(alone), "one consumer reading its stream is not warned")

	second := subscribe("second")
	require.Eventually(t, func() bool {
		publish(20)
		return warned(alone) != nil && warned(second) != nil
	}, 10*time.Second, 100*time.Millisecond, "both consumers warn once both receive entries")
	assert.Equal(t, []any{"second"}, warned(alone))
	assert.Equal(t, []any{"alone"}, warned(second))
	assert.Contains(t, alone.String(), "set redis.shards above 1")
}
