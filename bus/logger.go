package bus

import (
	"context"
	"log/slog"

	"github.com/ThreeDotsLabs/watermill"
)

// WatermillLogger adapts l to Watermill's LoggerAdapter. Watermill's Trace
// level maps to slog Debug-4. A nil l means no logging.
func WatermillLogger(l *slog.Logger) watermill.LoggerAdapter {
	if l == nil {
		return watermill.NopLogger{}
	}
	return watermill.NewSlogLoggerWithLevelMapping(l, map[slog.Level]slog.Level{
		watermill.LevelTrace: slog.LevelDebug - 4,
	})
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
