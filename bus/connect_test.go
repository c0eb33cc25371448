package bus_test

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

	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/internal/testenv"
	"github.com/omnibus-go/omnibus/transports/memory"
)

// downBroker is a factory for a memory broker that cannot be reached while
// down is set: each attempt fails with a transient "connection refused".
type downBroker struct {
	down     atomic.Bool
	attempts atomic.Int32
}

var errRefused = errors.New("dial tcp 127.0.0.1:1: connect: connection refused")

func (d *downBroker) factory(_ context.Context, _ bus.Config, logger *slog.Logger) (bus.Broker, error) {
	d.attempts.Add(1)
	if d.down.Load() {
		return nil, bus.Transient(errRefused)
	}
	return memory.NewBroker(logger), nil
}

func TestConnectBackoff_DoublesFrom100msUpTo5s(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		n    int
		want time.Duration
	}{
		{1, 100 * time.Millisecond},
		{2, 200 * time.Millisecond},
		{3, 400 * time.Millisecond},
		{6, 3200 * time.Millisecond},
		{7, 5 * time.Second},
		{1000, 5 * time.Second},
	} {
		assert.Equal(t, tc.want, bus.ConnectBackoff(tc.n), "retry %d", tc.n)
	}
}

// TestOpen_UnreachableBrokerConnectsInTheBackground: Open returns while the
// broker is down; Publish is transient meanwhile (wrapping
// bus.ErrBrokerUnavailable, with the reason), each failed attempt is logged at
// Warn with the reason, a subscription made meanwhile waits, and once the
// broker answers both work without anything being reopened.
func TestOpen_UnreachableBrokerConnectsInTheBackground(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var logs testenv.LogBuffer
	logger := slog.New(slog.NewJSONHandler(&logs, nil))
	d := &downBroker{}
	d.down.Store(true)
	b, err := bus.OpenWith(ctx, bus.Config{Broker: "flaky"}, d.factory, logger, time.Minute)
	require.NoError(t, err, "an unreachable broker does not fail Open")
	defer func() { require.NoError(t, b.Close()) }()

	msg := message.NewMessage(watermill.NewUUID(), []byte("hi"))
	err = b.Publisher().Publish("orders", msg)
	require.Error(t, err)
	assert.Equal(t, bus.ClassTransient, bus.ClassOf(err), "no attempt is spent on a broker that is down")
	assert.ErrorIs(t, err, bus.ErrBrokerUnavailable)
	assert.ErrorIs(t, err, errRefused, "the error says why")

	sub, err := b.Subscriber("g")
	require.NoError(t, err)
	ch, err := sub.Subscribe(ctx, "orders")
	require.NoError(t, err, "a subscription waits for the broker")

	require.Eventually(t, func() bool { return d.attempts.Load() >= 3 }, 20*time.Second, 10*time.Millisecond, "the Bus keeps trying")
	var warned []float64
	for _, r := range logs.Records(t) {
		if r["level"] == "WARN" && r["msg"] == "omnibus: broker unreachable; retrying" {
			assert.Equal(t, errRefused.Error(), r["error"], "the reason is logged")
			warned = append(warned, r["attempt"].(float64))
		}
	}
	require.GreaterOrEqual(t, len(warned), 2, "each failed attempt is logged at Warn")
	assert.Equal(t, []float64{1, 2}, warned[:2])

	waitCtx, waitCancel := context.WithTimeout(ctx, 50*time.Millisecond)
	assert.ErrorIs(t, b.WaitBroker(waitCtx), context.DeadlineExceeded, "WaitBroker ends with its context while the broker is down")
	waitCancel()

	d.down.Store(false)
	require.NoError(t, b.WaitBroker(ctx))
	require.NoError(t, b.Publisher().Publish("orders", msg), "publishes go through once connected")
	select {
	case got := <-ch:
		assert.Equal(t, msg.UUID, got.UUID)
		got.Ack()
	case <-ctx.Done():
		t.Fatal("the waiting subscription received nothing after the broker came back")
	}
	attempts := d.attempts.Load()
	require.NoError(t, b.Publisher().Publish("orders", message.NewMessage(watermill.NewUUID(), nil)))
	assert.Equal(t, attempts, d.attempts.Load(), "once connected, the factory is not called again")
}

// TestOpen_BrokerThatRefusesForGoodFailsOpen: an error that waiting will not
// fix (not transient) fails Open, and nothing keeps retrying it.
func TestOpen_BrokerThatRefusesForGoodFailsOpen(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	bad := &bus.ConfigError{Field: "kafka.tls.ca_file", Reason: "no such file"}
	_, err := bus.OpenWith(context.Background(), bus.Config{Broker: "bad"}, func(context.Context, bus.Config, *slog.Logger) (bus.Broker, error) {
		calls.Add(1)
		return nil, bad
	}, bus.NopLogger(), time.Minute)
	require.ErrorIs(t, err, bus.ErrInvalidConfig)
	assert.Contains(t, err.Error(), "open bad broker: invalid config: kafka.tls.ca_file")
	assert.Equal(t, int32(1), calls.Load(), "the factory is called once")
}

// TestOpen_SlowFirstAttemptDoesNotHoldOpen: a first attempt that outlasts
// the connect wait (a dial to a host that drops packets) leaves Open to
// return; the attempt's result, even an error that is not transient, then
// only means another attempt.
func TestOpen_SlowFirstAttemptDoesNotHoldOpen(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	release := make(chan struct{})
	var calls atomic.Int32
	b, err := bus.OpenWith(ctx, bus.Config{Broker: "slow"}, func(context.Context, bus.Config, *slog.Logger) (bus.Broker, error) {
		if calls.Add(1) == 1 {
			<-release
			return nil, errors.New("refused for good, but too late")
		}
		return memory.NewBroker(nil), nil
	}, bus.NopLogger(), time.Millisecond)
	require.NoError(t, err, "Open does not wait for a slow first attempt")
	defer func() { require.NoError(t, b.Close()) }()
	close(release)
	require.NoError(t, b.WaitBroker(ctx), "the connector retries after the late failure")
	assert.Equal(t, int32(2), calls.Load())
}

// TestBus_CloseWhileTheBrokerIsDown: Close stops connecting and ends the
// subscriptions that wait; nothing is left running and later use fails as
// closed.
func TestBus_CloseWhileTheBrokerIsDown(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	d := &downBroker{}
	d.down.Store(true)
	b, err := bus.OpenWith(ctx, bus.Config{Broker: "down"}, d.factory, bus.NopLogger(), time.Minute)
	require.NoError(t, err)
	sub, err := b.Subscriber("g")
	require.NoError(t, err)
	ch, err := sub.Subscribe(ctx, "orders")
	require.NoError(t, err)

	require.NoError(t, b.Close())
	_, open := <-ch
	assert.False(t, open, "the waiting subscription's channel is closed")
	assert.ErrorIs(t, b.WaitBroker(ctx), bus.ErrBusClosed)
	err = b.Publisher().Publish("orders", message.NewMessage(watermill.NewUUID(), nil))
	assert.ErrorIs(t, err, bus.ErrBusClosed)
	assert.Equal(t, bus.ClassTransient, bus.ClassOf(err))
	_, err = b.Subscriber("g")
	assert.ErrorIs(t, err, bus.ErrBusClosed)
}

// TestSubscriber_WaitingSubscriptionEndsWithItsContext: cancelling the
// context of a subscription that waits for the broker closes its channel.
func TestSubscriber_WaitingSubscriptionEndsWithItsContext(t *testing.T) {
	t.Parallel()
	d := &downBroker{}
	d.down.Store(true)
	b, err := bus.OpenWith(context.Background(), bus.Config{Broker: "down"}, d.factory, bus.NopLogger(), time.Minute)
	require.NoError(t, err)
	defer func() { require.NoError(t, b.Close()) }()
	sub, err := b.Subscriber("g")
	require.NoError(t, err)
	subCtx, cancel := context.WithCancel(context.Background())
	ch, err := sub.Subscribe(subCtx, "orders")
	require.NoError(t, err)
	cancel()
	select {
	case _, open := <-ch:
		assert.False(t, open)
	case <-time.After(10 * time.Second):
		t.Fatal("the channel of a cancelled waiting subscription stays open")
	}
	require.NoError(t, sub.Close())
}
