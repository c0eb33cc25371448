package bus_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"

	"github.com/omnibus-go/omnibus/bus"
)

// TestWatermillLogger_RouterLineOfASettledFailureGoesToDebug: the router's
// "Handler returned error" line is demoted to Debug only for a message whose
// failure was settled (and so logged by the settler); any other handler
// error keeps its Error line, also through With.
func TestWatermillLogger_RouterLineOfASettledFailureGoesToDebug(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		settled bool
		want    slog.Level
	}{
		{"settled by Retry", true, slog.LevelDebug},
		{"nobody settled it", false, slog.LevelError},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var got []slog.Record
			logger := slog.New(recordHandler{f: func(r slog.Record) { got = append(got, r) }})
			msg := message.NewMessage(watermill.NewUUID(), nil)
			msg.SetContext(bus.WithDelivery(context.Background(), bus.Delivery{}))
			if tc.settled {
				bus.Settle(msg, bus.Settlement{Class: bus.ClassTransient})
			}
			a := bus.WatermillLogger(logger).With(watermill.LogFields{"handler_name": "h"})
			a.Error("Handler returned error", errors.New("boom"), watermill.LogFields{"message_uuid": msg.UUID})
			if assert.Len(t, got, 1) {
				assert.Equal(t, tc.want, got[0].Level)
				assert.Equal(t, "Handler returned error", got[0].Message)
			}
			// The memory is spent by the line it demoted: a later failure of
			// the same message that nobody settled is an Error again.
			got = nil
			a.Error("Handler returned error", errors.New("boom"), watermill.LogFields{"message_uuid": msg.UUID})
			if assert.Len(t, got, 1) {
				assert.Equal(t, slog.LevelError, got[0].Level)
			}
		})
	}
}

// TestWatermillLogger_LevelsTheLoggerDropsCostNothing: lines of a level the
// slog logger does not log are dropped before Watermill's adapter builds
// their attributes (the router logs Trace lines for every message); the
// levels it does log still arrive, Trace as Debug-4.
func TestWatermillLogger_LevelsTheLoggerDropsCostNothing(t *testing.T) {
	// Not parallel: AllocsPerRun counts the whole process's allocations.
	var got []slog.Record
	h := levelHandler{recordHandler: recordHandler{f: func(r slog.Record) { got = append(got, r) }}, min: slog.LevelInfo}
	a := bus.WatermillLogger(slog.New(h)).With(watermill.LogFields{"handler_name": "h"})
	fields := watermill.LogFields{"message_uuid": "m", "topic": "t"}
	allocs := testing.AllocsPerRun(100, func() {
		a.Trace("Received message", fields)
		a.Debug("Message acked", fields)
	})
	assert.Zero(t, allocs, "allocations per dropped Trace and Debug line")
	assert.Empty(t, got)

	a.Info("Starting handler", fields)
	h.min = slog.LevelDebug - 4
	bus.WatermillLogger(slog.New(h)).Trace("Received message", fields)
	if assert.Len(t, got, 2) {
		assert.Equal(t, slog.LevelInfo, got[0].Level)
		assert.Equal(t, slog.LevelDebug-4, got[1].Level)
	}
}

// levelHandler is a recordHandler that logs from min up.
type levelHandler struct {
	recordHandler
	min slog.Level
}

func (h levelHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= h.min }
func (h levelHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return levelHandler{recordHandler: h.recordHandler.WithAttrs(as).(recordHandler), min: h.min}
}

// recordHandler hands each record, with the attributes of With, to f.
type recordHandler struct {
	f     func(slog.Record)
	attrs []slog.Attr
}

func (recordHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h recordHandler) Handle(_ context.Context, r slog.Record) error {
	r = r.Clone()
	r.AddAttrs(h.attrs...)
	h.f(r)
	return nil
}
func (h recordHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return recordHandler{f: h.f, attrs: append(append([]slog.Attr(nil), h.attrs...), as...)}
}
func (h recordHandler) WithGroup(string) slog.Handler { return h }
