package middleware

import (
	"context"
	"errors"
	"log/slog"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/omnibus-go/omnibus/bus"
)

// Deduplicator runs fn at most once per message: it reports ran = false,
// without running fn, for a message it has seen succeed before. The context
// fn gets may carry what makes that atomic with fn's effects —
// postgres.Deduper puts the transaction that records the message there
// (postgres.TxFromContext).
type Deduplicator interface {
	Do(ctx context.Context, msg *message.Message, fn func(ctx context.Context) error) (ran bool, err error)
}

// Dedup runs the handler through a Deduplicator, so that a message the
// broker delivers again after it was handled is acked without running the
// handler. Put it inside Retry (each attempt is then its own try), and write
// the handler's effects with the transaction the Deduplicator provides:
//
//	deduper, _ := postgres.NewDeduper(pool, inbox, "billing")
//	dedup, _ := middleware.NewDedup(deduper, logger)
//	h.AddMiddleware(retry.Middleware, dedup.Middleware)
//	// in the handler: tx, _ := postgres.TxFromContext(msg.Context())
//
// Messages the handler produces are returned to the router as usual (and
// published after the transaction committed).
type Dedup struct {
	d   Deduplicator
	log *slog.Logger
}

// NewDedup returns the middleware over d. A nil logger means no logging.
func NewDedup(d Deduplicator, logger *slog.Logger) (*Dedup, error) {
	if d == nil {
		return nil, errors.New("invalid config: Deduplicator: required")
	}
	return &Dedup{d: d, log: bus.LoggerOrNop(logger)}, nil
}

// Middleware is the message.HandlerMiddleware.
func (m *Dedup) Middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		var out []*message.Message
		parent := msg.Context()
		ran, err := m.d.Do(parent, msg, func(ctx context.Context) error {
			msg.SetContext(ctx)
			defer msg.SetContext(parent)
			var herr error
			out, herr = h(msg)
			return herr
		})
		if err != nil {
			return nil, err
		}
		if !ran {
			m.log.DebugContext(parent, "omnibus: duplicate message skipped", "event_id", bus.EventID(msg))
			return nil, nil
		}
		return out, nil
	}
}
