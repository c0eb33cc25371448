package bus

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestMetadataHelpers(t *testing.T) {
	t.Parallel()
	msg := message.NewMessage(watermill.NewUUID(), nil)
	SetPartitionKey(msg, "order-1")
	SetEventType(msg, "order.paid")
	SetCorrelationID(msg, "corr")
	SetCausationID(msg, "cause")
	assert.Equal(t, "order-1", msg.Metadata.Get(KeyPartitionKey))
	assert.Equal(t, "order-1", PartitionKey(msg))
	assert.Equal(t, "order.paid", EventType(msg))
	assert.Equal(t, "corr", CorrelationID(msg))
	assert.Equal(t, "cause", CausationID(msg))
	assert.Equal(t, msg.UUID, EventID(msg), "without event_id metadata the UUID is the event id")
	msg.Metadata.Set(KeyEventID, "evt-7")
	assert.Equal(t, "evt-7", EventID(msg))

	next := message.NewMessage(watermill.NewUUID(), nil)
	CausedBy(next, msg)
	assert.Equal(t, "corr", CorrelationID(next))
	assert.Equal(t, "evt-7", CausationID(next))
}

func TestClassOf(t *testing.T) {
	t.Parallel()
	base := errors.New("boom")
	at := time.Now().Add(time.Minute)
	for _, tc := range []struct {
		name string
		err  error
		want Class
	}{
		{"plain error counts", base, ClassCounted},
		{"transient", Transient(base), ClassTransient},
		{"permanent", Permanent(base), ClassPermanent},
		{"wrapped transient", fmt.Errorf("publish: %w", Transient(base)), ClassTransient},
		{"outermost mark wins", Permanent(Transient(base)), ClassPermanent},
		{"retry at keeps counted", RetryAt(at, base), ClassCounted},
		{"retry at keeps transient", RetryAt(at, Transient(base)), ClassTransient},
	} {
		assert.Equal(t, tc.want, ClassOf(tc.err), tc.name)
		assert.ErrorIs(t, tc.err, base, "%s: the cause stays reachable", tc.name)
	}
	got, ok := RetryTime(fmt.Errorf("x: %w", RetryAt(at, base)))
	assert.True(t, ok)
	assert.Equal(t, at, got)
	_, ok = RetryTime(Transient(base))
	assert.False(t, ok)
	assert.Nil(t, Transient(nil))
	assert.Nil(t, Permanent(nil))
	assert.Nil(t, RetryAt(at, nil))
}

func TestDeliveryAndSettlementTravelInTheContext(t *testing.T) {
	t.Parallel()
	msg := message.NewMessage(watermill.NewUUID(), nil)
	_, ok := DeliveryOf(msg)
	assert.False(t, ok)
	assert.False(t, Settle(msg, Settlement{}), "no slot without a Delivery")

	msg.SetContext(WithDelivery(context.Background(), Delivery{Attempts: 2, MaxAttempts: 6, Source: "outbox"}))
	d, ok := DeliveryOf(msg)
	require.True(t, ok)
	assert.Equal(t, 2, d.Attempts)
	// Middleware replaces the context with a derived one; the slot survives.
	ctx, cancel := context.WithTimeout(msg.Context(), time.Second)
	defer cancel()
	msg.SetContext(ctx)
	require.True(t, Settle(msg, Settlement{Class: ClassTransient, Error: "down"}))
	st, ok := SettlementOf(msg)
	require.True(t, ok)
	assert.Equal(t, ClassTransient, st.Class)
	assert.Equal(t, "down", st.Error)
}

// The delivery's context is its parent's in everything but the delivery:
// values and cancellation (derived contexts end with it); and it costs one
// allocation. (Not parallel: testing.AllocsPerRun refuses.)
func TestWithDelivery_KeepsTheParentsValuesAndCancellation(t *testing.T) {
	type key struct{}
	parent, cancel := context.WithCancel(context.WithValue(context.Background(), key{}, "v"))
	ctx := WithDelivery(parent, Delivery{ID: "3/7"})
	assert.Equal(t, "v", ctx.Value(key{}), "a value of the parent")
	child, stop := context.WithTimeout(ctx, time.Hour)
	defer stop()
	d, ok := DeliveryFromContext(child)
	require.True(t, ok)
	assert.Equal(t, "3/7", d.ID)
	cancel()
	select {
	case <-child.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("a context derived from the delivery's did not end when the delivery's parent was cancelled")
	}
	assert.ErrorIs(t, ctx.Err(), context.Canceled)
	assert.ErrorIs(t, child.Err(), context.Canceled)
	assert.Contains(t, fmt.Sprint(ctx), "WithDelivery(3/7)")

	base := context.Background()
	var kept context.Context
	allocs := testing.AllocsPerRun(100, func() { kept = WithDelivery(base, Delivery{ID: "1/1"}) })
	_ = kept
	assert.Equal(t, 1.0, allocs, "allocations per WithDelivery")
}

func TestSlogAdapters(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	l := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug - 4}))
	wl := WatermillLogger(l)
	wl.With(watermill.LogFields{"table": "outbox"}).Info("fetched", watermill.LogFields{"rows": 3})
	wl.Error("failed", errors.New("boom"), nil)
	out := buf.String()
	assert.Contains(t, out, "table=outbox")
	assert.Contains(t, out, "rows=3")
	assert.Contains(t, out, "boom")

	var rec recorder
	sl := SlogLogger(&rec).With("table", "inbox")
	sl.Error("it broke", "error", errors.New("bad"), "n", 1)
	sl.Debug("detail")
	require.Len(t, rec.lines, 2)
	assert.Equal(t, "ERROR it broke err=bad n=1 table=inbox", rec.lines[0])
	assert.Equal(t, "DEBUG detail table=inbox", rec.lines[1])

	WatermillLogger(nil).Info("nothing", nil) // a nil logger means no logging
	NopLogger().Info("nothing")
}

type recorder struct{ lines []string }

func (r *recorder) line(level, msg string, err error, f watermill.LogFields) {
	s := level + " " + msg
	if err != nil {
		s += " err=" + err.Error()
	}
	keys := make([]string, 0, len(f))
	for k := range f {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		s += fmt.Sprintf(" %s=%v", k, f[k])
	}
	r.lines = append(r.lines, s)
}

func (r *recorder) Error(msg string, err error, f watermill.LogFields) { r.line("ERROR", msg, err, f) }
func (r *recorder) Info(msg string, f watermill.LogFields)             { r.line("INFO", msg, nil, f) }
func (r *recorder) Debug(msg string, f watermill.LogFields)            { r.line("DEBUG", msg, nil, f) }
func (r *recorder) Trace(msg string, f watermill.LogFields)            { r.line("TRACE", msg, nil, f) }
func (r *recorder) With(watermill.LogFields) watermill.LoggerAdapter   { return r }
