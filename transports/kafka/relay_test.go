package kafka_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/internal/testenv"
	"github.com/omnibus-go/omnibus/middleware"
	"github.com/omnibus-go/omnibus/processors"
	"github.com/omnibus-go/omnibus/transports/postgres"
)

// TestOutboxRelay_KafkaOutageSpendsNoAttemptsAndKeepsOrder relays an outbox
// to Kafka while every produce request fails (broker errors, or dropped
// connections, injected with kfake's request control): the relay keeps
// probing, no row spends an attempt, and once the brokers answer again every
// event reaches the topic, in order per key.
func TestOutboxRelay_KafkaOutageSpendsNoAttemptsAndKeepsOrder(t *testing.T) {
	t.Parallel()
	outages := map[string]func(c *kfake.Cluster, topic string) (probes func() int, heal func()){
		"produce errors": func(c *kfake.Cluster, topic string) (func() int, func()) {
			f := c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: topic, Err: kerr.NotEnoughReplicas, Count: -1})
			return f.Hits, f.Remove
		},
		"dropped connections": func(c *kfake.Cluster, _ string) (func() int, func()) {
			var down atomic.Bool
			var hits atomic.Int64
			down.Store(true)
			c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
				if !down.Load() {
					c.DropControl()
					return nil, nil, false
				}
				c.KeepControl()
				hits.Add(1)
				return nil, errors.New("injected: connection dropped"), true
			})
			return func() int { return int(hits.Load()) }, func() { down.Store(false) }
		},
	}
	for name, outage := range outages {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			const keys, perKey = 5, 6
			cluster := testenv.NewKafkaCluster(t)
			brokers := cluster.ListenAddrs()
			topic := testenv.KafkaTopic(t, brokers, 3)

			pool := testenv.Postgres(t)
			table := testenv.Name(t)
			require.NoError(t, postgres.Migrate(context.Background(), pool, postgres.OutboxTable(table)))
			t.Cleanup(func() {
				_, _ = pool.Exec(context.Background(), fmt.Sprintf(`DROP TABLE IF EXISTS %q, %q CASCADE`, table, table+"_lanes"))
			})
			outbox, err := postgres.NewOutbox(postgres.OutboxConfig{Table: table})
			require.NoError(t, err)
			want := map[string][]string{}
			for seq := 0; seq < perKey; seq++ {
				for k := 0; k < keys; k++ {
					key := "order-" + strconv.Itoa(k)
					msg := message.NewMessage(watermill.NewUUID(), []byte(key+"/"+strconv.Itoa(seq)))
					bus.SetPartitionKey(msg, key)
					require.NoError(t, outbox.Enqueue(context.Background(), pool, topic, msg))
					want[key] = append(want[key], msg.UUID)
				}
			}

			probes, heal := outage(cluster, topic)
			pcfg := testPublisherConfig(brokers)
			pcfg.Retries = 1
			pcfg.RetryBackoff = 10 * time.Millisecond
			pub := newPublisher(t, pcfg)
			relay, err := processors.NewOutboxRelay(pool, processors.OutboxRelayConfig{
				Publisher:  pub,
				Subscriber: postgres.SubscriberConfig{Table: table, PollInterval: 20 * time.Millisecond},
				Retry:      middleware.RetryConfig{Base: middleware.NoDelay, TransientDelay: 20 * time.Millisecond},
				Breaker:    middleware.CircuitBreakerConfig{FailureThreshold: 1, OpenTimeout: 50 * time.Millisecond},
			}, nil)
			require.NoError(t, err)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- relay.Run(ctx) }()
			t.Cleanup(func() {
				cancel()
				assert.NoError(t, <-done)
			})

			testenv.Eventually(t, 30*time.Second, func() bool { return probes() >= 5 },
				"the relay keeps probing Kafka during the outage")
			completed, spent := outboxState(t, pool, table)
			assert.Zero(t, completed, "nothing can be completed while Kafka refuses every record")
			assert.Zero(t, spent, "the outage spends no attempts")

			heal()
			testenv.Eventually(t, 60*time.Second, func() bool {
				completed, _ := outboxState(t, pool, table)
				return completed == keys*perKey
			}, "every row is relayed once Kafka answers again")
			_, spent = outboxState(t, pool, table)
			assert.Zero(t, spent, "no attempt was spent, during the outage or after it")

			// Everything is on the topic, in order per key.
			sub := newSubscriber(t, testSubscriberConfig(brokers, groupName(t)))
			msgs, err := sub.Subscribe(context.Background(), topic)
			require.NoError(t, err)
			got := map[string][]string{}
			seen := map[string]bool{}
			for len(seen) < keys*perKey {
				m := receive(t, msgs, 30*time.Second, fmt.Sprintf("consumer (%d of %d)", len(seen), keys*perKey))
				if !seen[m.UUID] {
					seen[m.UUID] = true
					got[bus.PartitionKey(m)] = append(got[bus.PartitionKey(m)], m.UUID)
				}
				m.Ack()
			}
			assert.Equal(t, want, got, "per key, events reach Kafka in the order they were written")
		})
	}
}

func outboxState(t testing.TB, pool interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, table string) (completed, attempts int) {
	t.Helper()
	err := pool.QueryRow(context.Background(),
		// A leased row's attempts include the delivery under way (counted at
		// lease, taken back by its settlement when it was not a failure).
		`SELECT count(*) FILTER (WHERE status = 'completed'), coalesce(sum(attempts - (locked_by IS NOT NULL)::int), 0) FROM `+pgx.Identifier{table}.Sanitize()).
		Scan(&completed, &attempts)
	require.NoError(t, err)
	return completed, attempts
}
