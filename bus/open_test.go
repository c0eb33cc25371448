package bus_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/internal/testenv"
	_ "github.com/omnibus-go/omnibus/transports/all"
	"github.com/omnibus-go/omnibus/transports/kafka"
	"github.com/omnibus-go/omnibus/transports/rabbitmq"
	"github.com/omnibus-go/omnibus/transports/redis"
)

// brokerConfig returns a config for broker whose tables, streams and topics
// belong to the test.
func brokerConfig(t *testing.T, broker string) bus.Config {
	cfg := bus.Config{Broker: broker}
	switch broker {
	case bus.BrokerPostgres:
		testenv.Postgres(t) // fails with instructions when PostgreSQL is down
		cfg.Postgres.URL = testenv.PostgresURL()
		cfg.Postgres.MaxConns = 4
		cfg.Postgres.QueueTable = testenv.Name(t)
		testenv.DropPostgresPrefix(t, cfg.Postgres.QueueTable)
		cfg.Postgres.QueueGroups = []string{"smoke", "other"}
	case kafka.Name:
		kafka.SetSection(&cfg, kafka.Config{ConnectionConfig: kafka.ConnectionConfig{Brokers: testenv.Kafka(t)}})
	case rabbitmq.Name:
		rabbitmq.SetSection(&cfg, rabbitmq.Config{URL: testenv.RabbitMQ(t), ExchangePrefix: testenv.RabbitMQPrefix(t), QueueExpires: time.Minute})
	case redis.Name:
		testenv.Redis(t)
		redis.SetSection(&cfg, redis.Config{Addr: testenv.RedisAddr(), StreamPrefix: testenv.RedisPrefix(t)})
	}
	return cfg
}

// TestOpen_EveryBrokerPassesTheSmokeTest runs the same code against every
// broker: only Config.Broker (and the broker's section) changes.
func TestOpen_EveryBrokerPassesTheSmokeTest(t *testing.T) {
	t.Parallel()
	for _, broker := range []string{bus.BrokerMemory, bus.BrokerPostgres, kafka.Name, rabbitmq.Name, redis.Name} {
		t.Run(broker, func(t *testing.T) {
			t.Parallel()
			smoke(t, brokerConfig(t, broker))
		})
	}
}

func smoke(t *testing.T, cfg bus.Config) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	b, err := bus.OpenBroker(ctx, cfg)
	require.NoError(t, err)
	defer func() { require.NoError(t, b.Close()) }()
	assert.Equal(t, cfg.Broker, b.BrokerName())

	topic := testenv.Name(t)
	sub, err := b.Subscriber("smoke")
	require.NoError(t, err)
	msgs, err := sub.Subscribe(ctx, topic)
	require.NoError(t, err)

	const perKey = 5
	keys := []string{"order-1", "order-2"}
	sent := map[string]*message.Message{}
	for i := range perKey {
		for _, k := range keys {
			msg := message.NewMessage(watermill.NewUUID(), fmt.Appendf(nil, `{"key":%q,"seq":%d}`, k, i))
			bus.SetPartitionKey(msg, k)
			bus.SetEventType(msg, "order.step")
			msg.Metadata.Set("seq", fmt.Sprint(i))
			sent[msg.UUID] = msg
			require.NoError(t, b.Publisher().Publish(topic, msg))
		}
	}
	require.NoError(t, b.Publisher().Close(), "the shared publisher's Close is a no-op")

	next := map[string]int{}
	for received := 0; received < len(sent); {
		select {
		case msg, ok := <-msgs:
			require.True(t, ok, "subscription ended after %d of %d messages", received, len(sent))
			want, known := sent[msg.UUID]
			require.True(t, known, "unexpected message %s", msg.UUID)
			assert.Equal(t, string(want.Payload), string(msg.Payload), "payload carried unchanged")
			for _, k := range []string{bus.KeyPartitionKey, bus.KeyEventType, "seq"} {
				assert.Equal(t, want.Metadata.Get(k), msg.Metadata.Get(k), "metadata %s carried unchanged", k)
			}
			_, hasDelivery := bus.DeliveryOf(msg)
			assert.True(t, hasDelivery, "every broker puts a bus.Delivery in the context")
			key := bus.PartitionKey(msg)
			assert.Equal(t, fmt.Sprint(next[key]), msg.Metadata.Get("seq"), "messages of %s in publish order", key)
			next[key]++
			msg.Ack()
			received++
		case <-ctx.Done():
			t.Fatalf("received %d of %d messages before the deadline", received, len(sent))
		}
	}
}

func TestOpen_RefusesInvalidConfigAndUnknownBrokers(t *testing.T) {
	t.Parallel()
	_, err := bus.OpenBroker(context.Background(), bus.Config{Broker: "pigeon"})
	require.ErrorIs(t, err, bus.ErrInvalidConfig)
	assert.Contains(t, err.Error(), `broker: "pigeon" is not one of the brokers linked into this program (memory, postgres, kafka, nats, rabbitmq, redis); to link another, import its transport package`)

	_, err = bus.OpenBroker(context.Background(), bus.Config{Broker: kafka.Name})
	require.ErrorIs(t, err, bus.ErrInvalidConfig)
	assert.Contains(t, err.Error(), "kafka.brokers")

	assert.Equal(t, []string{"kafka", "memory", "nats", "postgres", "rabbitmq", "redis"}, bus.RegisteredBrokers())
}

func TestOpen_PostgresBrokerServesConfiguredGroupsOnly(t *testing.T) {
	t.Parallel()
	cfg := brokerConfig(t, bus.BrokerPostgres)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := bus.OpenBroker(ctx, cfg)
	require.NoError(t, err)
	defer func() { require.NoError(t, b.Close()) }()
	_, err = b.Subscriber("stranger")
	require.Error(t, err)
	assert.Contains(t, err.Error(), `consumer group "stranger" is not in postgres.queue_groups [smoke, other]`)

	// Both configured groups receive the message.
	topic := testenv.Name(t)
	msg := message.NewMessage(watermill.NewUUID(), []byte("hi"))
	require.NoError(t, b.Publisher().Publish(topic, msg))
	for _, g := range []string{"smoke", "other"} {
		sub, err := b.Subscriber(g)
		require.NoError(t, err)
		ch, err := sub.Subscribe(ctx, topic)
		require.NoError(t, err)
		select {
		case got := <-ch:
			assert.Equal(t, msg.UUID, got.UUID, "group %s", g)
			got.Ack()
		case <-ctx.Done():
			t.Fatalf("group %s received nothing", g)
		}
	}
}

// Each transport names the addresses a readiness check dials; bus and the
// command know none of them.
func TestBrokerEndpoints_ComeFromTheTransport(t *testing.T) {
	t.Parallel()
	with := func(broker string, set func(*bus.Config)) bus.Config {
		cfg := bus.Config{Broker: broker}
		if set != nil {
			set(&cfg)
		}
		return cfg
	}
	assert.Nil(t, bus.BrokerEndpoints(with(bus.BrokerMemory, nil)))
	assert.Nil(t, bus.BrokerEndpoints(with(bus.BrokerPostgres, nil)))
	assert.Equal(t, []string{"k1:9092", "k2:9092"}, bus.BrokerEndpoints(with(kafka.Name, func(c *bus.Config) {
		kafka.SetSection(c, kafka.Config{ConnectionConfig: kafka.ConnectionConfig{Brokers: []string{"k1:9092", "k2:9092"}}})
	})))
	assert.Equal(t, []string{"127.0.0.1:6379"}, bus.BrokerEndpoints(with(redis.Name, nil)))
	assert.Equal(t, []string{"127.0.0.1:7001", "127.0.0.1:7002"}, bus.BrokerEndpoints(with(redis.Name, func(c *bus.Config) {
		redis.SetSection(c, redis.Config{ClusterAddrs: []string{"127.0.0.1:7001", "127.0.0.1:7002"}})
	})))
	assert.Equal(t, []string{"127.0.0.1:5672"}, bus.BrokerEndpoints(with(rabbitmq.Name, nil)))
	assert.Equal(t, []string{"mq.internal:5671"}, bus.BrokerEndpoints(with(rabbitmq.Name, func(c *bus.Config) {
		rabbitmq.SetSection(c, rabbitmq.Config{URL: "amqps://u:p@mq.internal/vh"})
	})))
}
