package middleware

import (
	"context"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// DefaultTimeout is the relay's handler timeout.
const DefaultTimeout = 30 * time.Second

// Timeout bounds each handler call: the message's context gets a deadline of
// d. A call that runs out of time failed an attempt and keeps its class:
// unless the handler classified it otherwise, it is counted (DESIGN §3), so
// a message that always times out reaches its max attempts instead of being
// retried forever. A target that is down for everyone is the circuit
// breaker's business: after a few different messages fail it stops trying
// the others, and those spend nothing.
func Timeout(d time.Duration) message.HandlerMiddleware {
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			parent := msg.Context()
			ctx, cancel := context.WithTimeout(parent, d)
			defer cancel()
			msg.SetContext(ctx)
			defer msg.SetContext(parent)
			return h(msg)
		}
	}
}
