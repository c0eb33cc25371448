package omnibus_test

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/internal/testenv"
	"github.com/omnibus-go/omnibus/processors"
)

// failOnce is a broker publisher whose first Publish fails as a broker
// outage does.
type failOnce struct {
	message.Publisher
	failed atomic.Bool
}

func (p *failOnce) Publish(topic string, msgs ...*message.Message) error {
	if p.failed.CompareAndSwap(false, true) {
		return bus.Transient(errors.New("dial tcp 127.0.0.1:6379: connect: connection refused"))
	}
	return p.Publisher.Publish(topic, msgs...)
}

// TestRelay_TransientFailureIsLoggedOnce: an operator reading the relay's
// log at Info sees one structured line per failed delivery — the Retry
// middleware's, with class, attempts and retry time — not a second one from
// Watermill's router for the same failure.
func TestRelay_TransientFailureIsLoggedOnce(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	full := testenv.Name(t)
	name := "log1_" + full[len(full)-10:]
	testenv.DropPostgresPrefix(t, name)
	cfg := bus.Config{
		Outbox: bus.OutboxConfig{Table: name + "_out"},
		Inbox:  bus.InboxConfig{Table: name + "_in"},
		Relay:  bus.RelayConfig{PollInterval: 50 * time.Millisecond},
		Retry:  bus.RetryConfig{TransientDelay: 50 * time.Millisecond},
	}
	b, err := omnibus.Open(ctx, cfg, omnibus.WithPool(testenv.Postgres(t)))
	require.NoError(t, err)
	defer func() { require.NoError(t, b.Close()) }()
	require.NoError(t, b.Migrate(ctx))

	var logs testenv.LogBuffer
	logger := slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	rc := b.RelayConfig()
	rc.Publisher = &failOnce{Publisher: rc.Publisher}
	relay, err := processors.NewOutboxRelay(b.Pool(), rc, logger)
	require.NoError(t, err)
	relayCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- relay.Run(relayCtx) }()

	msg := message.NewMessage(watermill.NewUUID(), []byte("{}"))
	require.NoError(t, b.Outbox().Enqueue(ctx, b.Pool(), "orders", msg))
	require.Eventually(t, func() bool {
		var status string
		require.NoError(t, b.Pool().QueryRow(ctx, `SELECT status FROM `+cfg.Outbox.Table+` WHERE event_id = $1`, msg.UUID).Scan(&status))
		return status == "completed"
	}, 30*time.Second, 20*time.Millisecond, "the event is delivered after its transient failure")
	stop()
	require.NoError(t, <-done)

	var lines []map[string]any
	for _, r := range logs.Records(t) {
		if r["event_id"] == msg.UUID || r["message_uuid"] == msg.UUID {
			lines = append(lines, r)
		}
	}
	require.Len(t, lines, 1, "one log line for one failure, got %v", lines)
	assert.Equal(t, "INFO", lines[0]["level"])
	assert.Equal(t, "omnibus: message failed; will retry", lines[0]["msg"])
	assert.Equal(t, "transient", lines[0]["class"])
	assert.Contains(t, lines[0]["error"], "connection refused")
}
