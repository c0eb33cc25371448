package omnibus_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/internal/testenv"
	"github.com/omnibus-go/omnibus/transports/kafka"
	"github.com/omnibus-go/omnibus/transports/redis"
)

// TestOpen_BrokerDownAtStart_OutboxWritesAndTheRelayDeliversOnceItIsBack
// plays a broker outage from the start: Open, Migrate and Enqueue work with
// nothing listening on the broker's port, a publish meanwhile is transient
// (the relay spends no attempt on it), a subscriber made meanwhile waits,
// and once the broker is started on that port the relay delivers the event
// to it.
func TestOpen_BrokerDownAtStart_OutboxWritesAndTheRelayDeliversOnceItIsBack(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		configure func(t *testing.T, cfg *bus.Config, addr string)
		start     func(t *testing.T, port int)
	}{
		{
			name: "redis",
			configure: func(t *testing.T, cfg *bus.Config, addr string) {
				cfg.Broker = redis.Name
				redis.SetSection(cfg, redis.Config{Addr: addr})
			},
			start: func(t *testing.T, port int) { testenv.StartRedisServer(t, port) },
		},
		{
			name: "kafka",
			configure: func(t *testing.T, cfg *bus.Config, addr string) {
				cfg.Broker = kafka.Name
				kafka.SetSection(cfg, kafka.Config{ConnectionConfig: kafka.ConnectionConfig{Brokers: []string{addr}}})
			},
			start: func(t *testing.T, port int) { testenv.NewKafkaCluster(t, kfake.Ports(port)) },
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
			defer cancel()
			port := testenv.FreePort(t)
			full := testenv.Name(t)
			name := "down_" + full[len(full)-10:]
			testenv.DropPostgresPrefix(t, name)
			cfg := bus.Config{
				Outbox: bus.OutboxConfig{Table: name + "_out"},
				Inbox:  bus.InboxConfig{Table: name + "_in"},
				Relay:  bus.RelayConfig{PollInterval: 50 * time.Millisecond},
				Retry:  bus.RetryConfig{TransientDelay: 100 * time.Millisecond},
			}
			tc.configure(t, &cfg, fmt.Sprintf("127.0.0.1:%d", port))

			b, err := omnibus.Open(ctx, cfg, omnibus.WithPool(testenv.Postgres(t)))
			require.NoError(t, err, "Open must not need the broker")
			defer func() { require.NoError(t, b.Close()) }()
			require.NoError(t, b.Migrate(ctx))
			topic := full
			msg := message.NewMessage(watermill.NewUUID(), []byte(`{"order":"a"}`))
			bus.SetPartitionKey(msg, "a")
			require.NoError(t, b.Outbox().Enqueue(ctx, b.Pool(), topic, msg), "writing to the outbox must not need the broker")

			probe := message.NewMessage(watermill.NewUUID(), []byte("probe"))
			probe.SetContext(ctx)
			err = b.Publisher().Publish(topic, probe)
			require.Error(t, err, "nothing listens on the broker's port")
			assert.Equal(t, bus.ClassTransient, bus.ClassOf(err), "a publish while the broker is unreachable is transient: %v", err)

			sub, err := b.Subscriber("outage")
			require.NoError(t, err, "a subscriber can be made while the broker is down")
			received, err := sub.Subscribe(ctx, topic)
			require.NoError(t, err, "a subscription waits for the broker rather than failing")

			relay, err := b.NewRelay()
			require.NoError(t, err)
			relayCtx, stopRelay := context.WithCancel(ctx)
			relayDone := make(chan error, 1)
			go func() { relayDone <- relay.Run(relayCtx) }()
			defer func() {
				stopRelay()
				<-relayDone
			}()

			pool := testenv.Postgres(t)
			row := func() (status string, attempts int, lastError *string) {
				require.NoError(t, pool.QueryRow(ctx, `SELECT status, attempts, last_error FROM `+cfg.Outbox.Table+` WHERE event_id = $1`, msg.UUID).
					Scan(&status, &attempts, &lastError))
				return status, attempts, lastError
			}
			// The row as settled after a try: a lease counts its delivery
			// (attempts + 1) until the transient failure is settled, and the
			// relay tries again every TransientDelay, so only a row no relay
			// holds says what the outage cost.
			var (
				status    string
				attempts  int
				lastError *string
			)
			require.Eventually(t, func() bool {
				var leased bool
				require.NoError(t, pool.QueryRow(ctx, `SELECT status, attempts, last_error, locked_by IS NOT NULL FROM `+cfg.Outbox.Table+` WHERE event_id = $1`, msg.UUID).
					Scan(&status, &attempts, &lastError, &leased))
				return lastError != nil && !leased
			}, 60*time.Second, 20*time.Millisecond, "the relay tries the row while the broker is down")
			assert.Equal(t, "pending", status)
			assert.Equal(t, 0, attempts, "a broker outage spends no attempt (last error: %s)", *lastError)

			tc.start(t, port)

			select {
			case got, ok := <-received:
				require.True(t, ok, "the subscription ended before the event arrived")
				assert.Equal(t, msg.UUID, got.UUID)
				assert.Equal(t, string(msg.Payload), string(got.Payload))
				got.Ack()
			case <-ctx.Done():
				t.Fatal("the event was not delivered after the broker came back")
			}
			require.Eventually(t, func() bool { s, _, _ := row(); return s == "completed" }, 60*time.Second, 20*time.Millisecond,
				"the relay completes the row once the broker is back")
			_, attempts, _ = row()
			assert.Equal(t, 0, attempts, "delivered without spending an attempt")
		})
	}
}
