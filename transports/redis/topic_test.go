package redis_test

import (
	"context"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omnibus-go/omnibus/bus"
	omniredis "github.com/omnibus-go/omnibus/transports/redis"
)

// Issue 25: "ord\x01ers" became a stream that redis-cli --scan shows exactly
// like "orders". The Publisher refuses it, and names a Redis pattern would
// misread, as a permanent error, and writes nothing.
func TestPublisher_InvalidTopicIsPermanentAndWritesNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	pub, err := omniredis.NewPublisher(omniredis.PublisherConfig{Client: e.client, StreamPrefix: e.prefix}, nil)
	require.NoError(t, err)
	defer pub.Close()
	for topic, why := range map[string]string{
		"ord\x01ers":        "U+0001",
		"orders *?[x] ü/..": "redis topics hold no space and none of the glob characters",
		"ord\u200bers":      "U+200B",
	} {
		err := pub.Publish(topic, message.NewMessage(watermill.NewUUID(), []byte("x")))
		require.Error(t, err, "%+q", topic)
		assert.Equal(t, bus.ClassPermanent, bus.ClassOf(err), "class of %v", err)
		assert.ErrorIs(t, err, bus.ErrInvalidTopic)
		assert.Contains(t, err.Error(), why)
		n, err := e.client.Exists(context.Background(), e.prefix+topic).Result()
		require.NoError(t, err)
		assert.Zero(t, n, "no stream was created for %+q", topic)
	}
	require.NoError(t, pub.Publish("orders.v1", message.NewMessage(watermill.NewUUID(), []byte("x"))))
}
