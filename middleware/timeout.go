package middleware

import (
	"context"
	"errors"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/omnibus-go/omnibus/bus"
)

// DefaultTimeout is the relay's handler timeout.
const DefaultTimeout = 30 * time.Second

// Timeout bounds each handler call: the message's context gets a deadline of
// d. An error that comes back after the deadline passed, and is not already
// classified, is marked transient: the target was too slow, which is not the
// message's fault, so no attempt is spent.
func Timeout(d time.Duration) message.HandlerMiddleware {
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			parent := msg.Context()
			ctx, cancel := context.WithTimeout(parent, d)
			defer cancel()
			msg.SetContext(ctx)
			defer msg.SetContext(parent)
			out, err := h(msg)
			if err != nil && ctx.Err() != nil && parent.Err() == nil {
				var ce *bus.ClassifiedError
				if !errors.As(err, &ce) {
					err = bus.Transient(err)
				}
			}
			return out, err
		}
	}
}
