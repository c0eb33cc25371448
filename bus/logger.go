package bus

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
)

// WatermillLogger adapts l to Watermill's LoggerAdapter. Watermill's Trace
// level maps to slog Debug-4. A nil l means no logging.
//
// A failed delivery is logged once: the router's "Handler returned error"
// line goes to Debug for a message whose failure was settled (Settle) —
// the Retry middleware, which settles, has logged it already with its
// class, attempts and retry time. Failures nobody settled (a handler
// without Retry) keep the router's Error line.
func WatermillLogger(l *slog.Logger) watermill.LoggerAdapter {
	if l == nil {
		return watermill.NopLogger{}
	}
	return onceLogged{LoggerAdapter: watermill.NewSlogLoggerWithLevelMapping(l, map[slog.Level]slog.Level{
		watermill.LevelTrace: levelTrace,
	}), l: l}
}

// levelTrace is the slog level of Watermill's Trace lines.
const levelTrace = slog.LevelDebug - 4

// routerHandlerError is the message of the line Watermill v1.5's router
// logs at Error when a handler returns an error.
const routerHandlerError = "Handler returned error"

// onceLogged demotes the router's line for a failure already logged, and
// drops lines of a level l does not log before Watermill's adapter turns
// their fields into attributes: the router logs a few Trace lines for every
// message, and building them cost six allocations per message (a sixth of
// the relay's, BenchmarkRelayDrain) with Trace off.
type onceLogged struct {
	watermill.LoggerAdapter
	l *slog.Logger
}

func (o onceLogged) enabled(level slog.Level) bool { return o.l.Enabled(context.Background(), level) }

func (o onceLogged) Error(msg string, err error, fields watermill.LogFields) {
	if msg == routerHandlerError {
		if id, ok := fields["message_uuid"].(string); ok && settledFailures.take(id) {
			o.Debug(msg, fields.Add(watermill.LogFields{"error": err}))
			return
		}
	}
	o.LoggerAdapter.Error(msg, err, fields)
}

func (o onceLogged) Info(msg string, fields watermill.LogFields) {
	if o.enabled(slog.LevelInfo) {
		o.LoggerAdapter.Info(msg, fields)
	}
}

func (o onceLogged) Debug(msg string, fields watermill.LogFields) {
	if o.enabled(slog.LevelDebug) {
		o.LoggerAdapter.Debug(msg, fields)
	}
}

func (o onceLogged) Trace(msg string, fields watermill.LogFields) {
	if o.enabled(levelTrace) {
		o.LoggerAdapter.Trace(msg, fields)
	}
}

func (o onceLogged) With(fields watermill.LogFields) watermill.LoggerAdapter {
	return onceLogged{LoggerAdapter: o.LoggerAdapter.With(fields), l: o.l}
}

// settledFailures remembers the messages whose failed delivery was settled
// (and so logged by whoever settled it), until the router logs the failure
// or settledMemory passes. It is bounded: forgetting costs one duplicate
// log line, never a message.
var settledFailures = &failureMemo{m: make(map[string]time.Time)}

const (
	settledMemory  = time.Minute
	settledMemoMax = 10000
)

type failureMemo struct {
	mu sync.Mutex
	m  map[string]time.Time
}

func (f *failureMemo) note(id string) {
	now := time.Now()
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.m) >= settledMemoMax {
		for k, at := range f.m {
			if now.Sub(at) > settledMemory {
				delete(f.m, k)
			}
		}
		if len(f.m) >= settledMemoMax {
			clear(f.m)
		}
	}
	f.m[id] = now
}

func (f *failureMemo) take(id string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	at, ok := f.m[id]
	delete(f.m, id)
	return ok && time.Since(at) <= settledMemory
}

// SlogLogger returns a *slog.Logger that writes to a Watermill LoggerAdapter,
// for code that logs with slog inside an application configured with a
// Watermill logger. A nil adapter means no logging.
func SlogLogger(a watermill.LoggerAdapter) *slog.Logger {
	if a == nil {
		a = watermill.NopLogger{}
	}
	return slog.New(&watermillHandler{a: a})
}

// NopLogger returns a *slog.Logger that discards everything.
func NopLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// LoggerOrNop returns l, or a discarding logger when l is nil.
func LoggerOrNop(l *slog.Logger) *slog.Logger {
	if l == nil {
		return NopLogger()
	}
	return l
}

type watermillHandler struct {
	a      watermill.LoggerAdapter
	fields watermill.LogFields
	group  string
}

func (h *watermillHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h *watermillHandler) Handle(_ context.Context, r slog.Record) error {
	fields := make(watermill.LogFields, len(h.fields)+r.NumAttrs())
	for k, v := range h.fields {
		fields[k] = v
	}
	var err error
	r.Attrs(func(a slog.Attr) bool {
		if e, ok := a.Value.Any().(error); ok && (a.Key == "error" || a.Key == "err") {
			err = e
			return true
		}
		fields[h.key(a.Key)] = a.Value.Any()
		return true
	})
	switch {
	case r.Level >= slog.LevelError:
		h.a.Error(r.Message, err, fields)
	case r.Level >= slog.LevelInfo:
		if err != nil {
			fields["error"] = err
		}
		h.a.Info(r.Message, fields)
	case r.Level >= slog.LevelDebug:
		if err != nil {
			fields["error"] = err
		}
		h.a.Debug(r.Message, fields)
	default:
		if err != nil {
			fields["error"] = err
		}
		h.a.Trace(r.Message, fields)
	}
	return nil
}

func (h *watermillHandler) key(k string) string {
	if h.group == "" {
		return k
	}
	return h.group + "." + k
}

func (h *watermillHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	n := &watermillHandler{a: h.a, group: h.group, fields: make(watermill.LogFields, len(h.fields)+len(attrs))}
	for k, v := range h.fields {
		n.fields[k] = v
	}
	for _, a := range attrs {
		n.fields[h.key(a.Key)] = a.Value.Any()
	}
	return n
}

func (h *watermillHandler) WithGroup(name string) slog.Handler {
	if name == "" {
		return h
	}
	return &watermillHandler{a: h.a, fields: h.fields, group: h.key(name)}
}
