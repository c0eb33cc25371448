package redis_test

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/omnibus-go/omnibus/internal/testenv"
	omniredis "github.com/omnibus-go/omnibus/transports/redis"
	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// env is one test's Redis: the shared client (of the single server or of
// the cluster) and a key prefix of its own.
type env struct {
	t      *testing.T
	client goredis.UniversalClient
	prefix string
}

// newEnv is the single Redis server at OMNIBUS_TEST_REDIS_ADDR.
func newEnv(t *testing.T) *env {
	t.Helper()
	return &env{t: t, client: testenv.Redis(t), prefix: testenv.RedisPrefix(t)}
}

// newClusterEnv is the Redis Cluster at OMNIBUS_TEST_REDIS_CLUSTER_ADDRS.
// Its prefix carries no hash tag, so a test's streams (and their dead-letter
// streams) spread over the cluster's nodes.
func newClusterEnv(t *testing.T) *env {
	t.Helper()
	return &env{t: t, client: testenv.RedisCluster(t), prefix: testenv.RedisClusterPrefix(t)}
}

// forEachServer runs body as two parallel subtests: "single" against the
// single server and "cluster" against the Redis Cluster.
func forEachServer(t *testing.T, body func(t *testing.T, e *env)) {
	t.Helper()
	for _, s := range []struct {
		name string
		env  func(*testing.T) *env
	}{
		{"single", newEnv},
		{"cluster", newClusterEnv},
	} {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			body(t, s.env(t))
		})
	}
}

// fastSubscriberConfig returns a config with short timings so tests run in
// seconds: 100 ms blocks, 1 s claim idle time, 100 ms claim interval.
func (e *env) fastSubscriberConfig(group string) omniredis.SubscriberConfig {
	return omniredis.SubscriberConfig{
		Client:        e.client,
		StreamPrefix:  e.prefix,
		ConsumerGroup: group,
		BlockTime:     100 * time.Millisecond,
		ClaimIdle:     time.Second,
		ClaimInterval: 100 * time.Millisecond,
	}
}

func (e *env) publisher() *omniredis.Publisher {
	e.t.Helper()
	pub, err := omniredis.NewPublisher(omniredis.PublisherConfig{Client: e.client, StreamPrefix: e.prefix}, nil)
	require.NoError(e.t, err)
	e.t.Cleanup(func() { _ = pub.Close() })
	return pub
}

func (e *env) subscriber(cfg omniredis.SubscriberConfig) *omniredis.Subscriber {
	e.t.Helper()
	sub, err := omniredis.NewSubscriber(cfg, nil)
	require.NoError(e.t, err)
	e.t.Cleanup(func() { _ = sub.Close() })
	return sub
}

func (e *env) subscribe(sub *omniredis.Subscriber, topic string) <-chan *message.Message {
	e.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	e.t.Cleanup(cancel)
	msgs, err := sub.Subscribe(ctx, topic)
	require.NoError(e.t, err)
	return msgs
}

// publish publishes n messages with payloads "0".."n-1" and returns them.
func (e *env) publish(pub message.Publisher, topic string, n int) []*message.Message {
	e.t.Helper()
	msgs := make([]*message.Message, n)
	for i := range msgs {
		msgs[i] = message.NewMessage(watermill.NewUUID(), []byte{byte('a' + i%26)})
	}
	require.NoError(e.t, pub.Publish(topic, msgs...))
	return msgs
}

// receive waits up to timeout for one message.
func receive(t *testing.T, msgs <-chan *message.Message, timeout time.Duration) *message.Message {
	t.Helper()
	select {
	case msg, ok := <-msgs:
		require.True(t, ok, "messages channel closed while a message was expected")
		return msg
	case <-time.After(timeout):
		t.Fatalf("no message within %s", timeout)
		return nil
	}
}

// pending returns the number of entries in the group's pending list.
func (e *env) pending(stream, group string) int64 {
	e.t.Helper()
	p, err := e.client.XPending(context.Background(), stream, group).Result()
	require.NoError(e.t, err)
	return p.Count
}
