package omnibus_test

import (
	"context"
	"fmt"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/internal/testenv"
	"github.com/omnibus-go/omnibus/middleware"
	"github.com/omnibus-go/omnibus/processors"
	_ "github.com/omnibus-go/omnibus/transports/all"
	"github.com/omnibus-go/omnibus/transports/postgres"
)

type paid struct {
	Order string `json:"order"`
	Seq   int    `json:"seq"`
}

// TestOpen_OutboxToHandlersThroughTheConfiguredBroker runs the whole path
// with the processors Bus builds from the config: outbox → relay → memory
// broker → ingest → inbox → dispatcher → handler, in order per key.
func TestOpen_OutboxToHandlersThroughTheConfiguredBroker(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	full := testenv.Name(t)
	name := "o2h_" + full[len(full)-10:] // the random suffix: room for _out_lanes, never another run's tables
	testenv.DropPostgresPrefix(t, name)
	cfg := bus.Config{
		Outbox: bus.OutboxConfig{Table: name + "_out"},
		Inbox:  bus.InboxConfig{Table: name + "_in", ConsumerGroup: "test"},
		Relay:  bus.RelayConfig{PollInterval: 50 * time.Millisecond},
	}
	b, err := omnibus.Open(ctx, cfg, omnibus.WithPool(testenv.Postgres(t)))
	require.NoError(t, err)
	defer func() { require.NoError(t, b.Close()) }()
	require.NoError(t, b.Migrate(ctx))
	assert.Equal(t, bus.BrokerMemory, b.BrokerName())

	router, err := message.NewRouter(message.RouterConfig{}, nil)
	require.NoError(t, err)
	relay, err := b.NewRelay()
	require.NoError(t, err)
	relay.AddTo(router)
	ingest, err := b.NewIngest("payments")
	require.NoError(t, err)
	defer ingest.Close()
	ingest.AddTo(router)
	disp, err := b.NewDispatcher()
	require.NoError(t, err)
	var mu sync.Mutex
	seen := map[string][]int{}
	processors.Handle(disp, "order.paid", func(_ context.Context, ev paid, _ *message.Message) error {
		mu.Lock()
		defer mu.Unlock()
		seen[ev.Order] = append(seen[ev.Order], ev.Seq)
		return nil
	})
	disp.AddTo(router)
	go func() { _ = router.Run(ctx) }()
	<-router.Running()
	defer router.Close()

	const perKey = 5
	for seq := range perKey {
		for _, order := range []string{"a", "b"} {
			msg := message.NewMessage(watermill.NewUUID(), fmt.Appendf(nil, `{"order":%q,"seq":%d}`, order, seq))
			bus.SetPartitionKey(msg, order)
			bus.SetEventType(msg, "order.paid")
			require.NoError(t, b.Outbox().Enqueue(ctx, b.Pool(), "payments", msg))
		}
	}
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(seen["a"]) == perKey && len(seen["b"]) == perKey
	}, 30*time.Second, 10*time.Millisecond, "every event reaches its handler")
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, []int{0, 1, 2, 3, 4}, seen["a"], "in order per key")
	assert.Equal(t, []int{0, 1, 2, 3, 4}, seen["b"], "in order per key")

	st, err := b.InboxAdmin("test")
	require.NoError(t, err)
	assert.Equal(t, "test", st.ConsumerGroup())
}

func TestOpen_ConfigErrorsAndUnreachableDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, err := omnibus.Open(ctx, bus.Config{Outbox: bus.OutboxConfig{Table: "bad name"}})
	require.ErrorIs(t, err, bus.ErrInvalidConfig)
	assert.Contains(t, err.Error(), "outbox.table")

	_, err = omnibus.Open(ctx, bus.Config{Postgres: bus.PostgresConfig{URL: "postgres://u:hunter2@127.0.0.1:1/db?connect_timeout=2"}})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "postgres://u:REDACTED@127.0.0.1:1/db")
	assert.NotContains(t, err.Error(), "hunter2")
}

// TestConnect_UnreachableDatabaseIsTransient: a PostgreSQL that cannot be
// reached is a transient error (a serving command waits for it), one that
// answers and refuses is not (waiting would not help); neither error shows
// the password.
func TestConnect_UnreachableDatabaseIsTransient(t *testing.T) {
	t.Parallel()
	testenv.Postgres(t) // fails with instructions when PostgreSQL is down
	u, err := url.Parse(testenv.PostgresURL())
	require.NoError(t, err)
	missingDB := *u
	missingDB.User = url.UserPassword(u.User.Username(), "hunter2")
	missingDB.Path = "/omnibus_no_such_database"
	for _, tc := range []struct {
		name string
		url  string
		want bus.Class
	}{
		{"nothing listens", fmt.Sprintf("postgres://u:hunter2@127.0.0.1:%d/db?connect_timeout=2", testenv.FreePort(t)), bus.ClassTransient},
		{"the server refuses", missingDB.String(), bus.ClassCounted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := omnibus.Connect(context.Background(), bus.Config{Postgres: bus.PostgresConfig{URL: tc.url}})
			require.Error(t, err)
			assert.Equal(t, tc.want, bus.ClassOf(err), "class of %v", err)
			assert.NotContains(t, err.Error(), "hunter2")
		})
	}
}

func TestConfigMapping(t *testing.T) {
	t.Parallel()
	rc := omnibus.RetryConfig(bus.Config{Retry: bus.RetryConfig{Base: -time.Second, Cap: time.Minute}})
	assert.Equal(t, middleware.NoDelay, rc.Base, "a negative base means no delay")
	assert.Equal(t, time.Minute, rc.Cap)
	bc := omnibus.BreakerConfig(bus.Config{})
	assert.Equal(t, bus.DefaultBreakerThreshold, bc.FailureThreshold)
	tables := omnibus.Tables(bus.Config{})
	require.Len(t, tables, 2)
	assert.Equal(t, bus.DefaultOutboxTable, tables[0].Name)
	assert.Equal(t, bus.DefaultInboxTable, tables[1].Name)
}

// The payload limit (1 MiB by default) is configurable: outbox and inbox
// max_payload_bytes (OMNIBUS_OUTBOX_MAX_PAYLOAD_BYTES, …); a larger payload is refused by
// name, before any SQL runs.
func TestOpen_PayloadLimitFromConfig(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	full := testenv.Name(t)
	name := "pl_" + full[len(full)-10:]
	testenv.DropPostgresPrefix(t, name)
	cfg, err := bus.ParseConfigEnv([]byte("outbox:\n  table: "+name+"_out\n  max_payload_bytes: 2048\ninbox:\n  table: "+name+"_in\n  max_payload_bytes: 1024\n"),
		func(string) (string, bool) { return "", false })
	require.NoError(t, err)
	assert.Equal(t, 2048, cfg.Outbox.MaxPayloadBytes)
	assert.Equal(t, 1024, cfg.Inbox.MaxPayloadBytes)
	b, err := omnibus.Open(ctx, cfg, omnibus.WithPool(testenv.Postgres(t)))
	require.NoError(t, err)
	defer func() { require.NoError(t, b.Close()) }()
	require.NoError(t, b.Migrate(ctx))

	pool := testenv.Postgres(t)
	require.NoError(t, b.Outbox().Enqueue(ctx, pool, "t", message.NewMessage(watermill.NewUUID(), make([]byte, 2048))))
	err = b.Outbox().Enqueue(ctx, pool, "t", message.NewMessage(watermill.NewUUID(), make([]byte, 2049)))
	var invalid *postgres.InvalidMessageError
	require.ErrorAs(t, err, &invalid)
	assert.Equal(t, "Payload", invalid.Field)
	assert.Contains(t, err.Error(), "limit of 2048")

	err = b.Inbox().Check(message.NewMessage(watermill.NewUUID(), make([]byte, 1025)), "t")
	require.ErrorAs(t, err, &invalid)
	assert.Contains(t, err.Error(), "limit of 1024")

	for _, bad := range []string{"-1", "1099511627776"} {
		c, err := bus.ParseConfigEnv([]byte("outbox:\n  max_payload_bytes: "+bad+"\n"), func(string) (string, bool) { return "", false })
		require.NoError(t, err)
		err = c.WithDefaults().Validate()
		require.Error(t, err, bad)
		assert.Contains(t, err.Error(), "outbox.max_payload_bytes")
	}
}

// The partition interval of the config reaches Migrate's tables.
func TestTables_CarryThePartitionIntervals(t *testing.T) {
	t.Parallel()
	tables := omnibus.Tables(bus.Config{
		Outbox: bus.OutboxConfig{PartitionInterval: 24 * time.Hour},
		Inbox:  bus.InboxConfig{PartitionInterval: time.Hour},
	})
	require.Len(t, tables, 2)
	assert.Equal(t, 24*time.Hour, tables[0].PartitionInterval)
	assert.Equal(t, time.Hour, tables[1].PartitionInterval)
	assert.Zero(t, omnibus.Tables(bus.Config{})[0].PartitionInterval, "one table unless configured")
}
