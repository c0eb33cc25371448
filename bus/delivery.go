package bus

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// Delivery describes one delivery of a message. Subscribers put it in the
// message's context; the Retry middleware reads it to decide what a failure
// means.
type Delivery struct {
	// Attempts is the number of counted attempts already spent before this
	// delivery (0 on the first delivery).
	Attempts int
	// MaxAttempts is the attempt budget; 0 means the subscriber does not know
	// one and the Retry middleware's own budget applies.
	MaxAttempts int
	// FirstDeliveredAt is when the message was first handed to a handler, if
	// the transport knows; else the same as DeliveredAt.
	FirstDeliveredAt time.Time
	// DeliveredAt is when this delivery started.
	DeliveredAt time.Time
	// Source is where the message came from: a table, stream or topic.
	Source string
	// Topic is the topic the message was written to or received on. For an
	// outbox row it is the destination the relay publishes to.
	Topic string
	// ID is the transport's id of this delivery: a row id, a stream entry id.
	ID string
	// Partition and Offset locate a Kafka record; zero elsewhere.
	Partition int32
	Offset    int64
	// DeadLetter is where the message goes if it is given up on (a
	// settlement with GiveUp): a dead-letter topic or stream. Empty when the
	// transport keeps it as failed in its own store (the postgres tables) or
	// drops it (dead letters turned off).
	DeadLetter string
}

// Settlement is the decision taken about a failed delivery. The Retry
// middleware records it on the message before the router nacks it; a durable
// subscriber applies it to its store.
type Settlement struct {
	// Class is the failure class of the error.
	Class Class
	// RetryAt is when the message should be tried again; zero means "keep the
	// current schedule".
	RetryAt time.Time
	// GiveUp is true when the message must not be retried: a permanent
	// failure, or a counted one that exhausted the budget. Transports fail the
	// message or move it to their dead-letter destination.
	GiveUp bool
	// Error is the error text, for the record.
	Error string
}

type deliveryKey struct{}

type deliveryState struct {
	d Delivery

	mu         sync.Mutex
	settlement *Settlement
}

// WithDelivery returns a context carrying d and an empty settlement slot.
// Subscribers call it for each message they emit; it makes one allocation.
func WithDelivery(ctx context.Context, d Delivery) context.Context {
	return &deliveryCtx{Context: ctx, st: deliveryState{d: d}}
}

// deliveryCtx is a context carrying a delivery's state: one allocation per
// message, where context.WithValue of a *deliveryState makes two. Everything
// but the delivery's key is its parent's.
type deliveryCtx struct {
	context.Context
	st deliveryState
}

func (c *deliveryCtx) Value(key any) any {
	if _, ok := key.(deliveryKey); ok {
		return &c.st
	}
	return c.Context.Value(key)
}

func (c *deliveryCtx) String() string {
	return fmt.Sprintf("%v.WithDelivery(%s)", c.Context, c.st.d.ID)
}

// DeliveryFromContext returns the Delivery carried by ctx.
func DeliveryFromContext(ctx context.Context) (Delivery, bool) {
	st, ok := ctx.Value(deliveryKey{}).(*deliveryState)
	if !ok {
		return Delivery{}, false
	}
	return st.d, true
}

// DeliveryOf returns the Delivery of msg.
func DeliveryOf(msg *message.Message) (Delivery, bool) {
	return DeliveryFromContext(msg.Context())
}

// Settle records s on msg, replacing any earlier settlement. It reports
// false when msg carries no Delivery (its subscriber does not read
// settlements). Whoever settles a failure logs it (the Retry and DeadLetter
// middleware do), so WatermillLogger's router logs it again only at Debug.
func Settle(msg *message.Message, s Settlement) bool {
	st, ok := msg.Context().Value(deliveryKey{}).(*deliveryState)
	if !ok {
		return false
	}
	st.mu.Lock()
	st.settlement = &s
	st.mu.Unlock()
	settledFailures.note(msg.UUID)
	return true
}

// SettlementOf returns the settlement recorded on msg, if any.
func SettlementOf(msg *message.Message) (Settlement, bool) {
	return SettlementFromContext(msg.Context())
}

// SettlementFromContext returns the settlement recorded in ctx, if any.
func SettlementFromContext(ctx context.Context) (Settlement, bool) {
	st, ok := ctx.Value(deliveryKey{}).(*deliveryState)
	if !ok {
		return Settlement{}, false
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.settlement == nil {
		return Settlement{}, false
	}
	return *st.settlement, true
}

// Redelivery is what a transport does with a nacked delivery, read from the
// settlement its handler left: give it up (dead-letter it), or hand it out
// again at Due, Counted telling whether the failure spent an attempt.
type Redelivery struct {
	Settlement Settlement
	GiveUp     bool
	Due        time.Time
	Counted    bool
}

// RedeliveryFor decides a nacked delivery's fate from its settlement st (ok
// false when the handler recorded none): a nack without a settlement, or
// whose settlement names no retry time, is due after nackDelay; only a
// transient failure spends no attempt.
func RedeliveryFor(st Settlement, ok bool, nackDelay time.Duration) Redelivery {
	r := Redelivery{Settlement: st, GiveUp: ok && st.GiveUp, Due: st.RetryAt, Counted: !ok || st.Class != ClassTransient}
	if !ok || r.Due.IsZero() {
		r.Due = time.Now().Add(nackDelay)
	}
	return r
}

// RedeliveryOf is RedeliveryFor of the settlement in ctx (the context of a
// message a subscriber emitted).
func RedeliveryOf(ctx context.Context, nackDelay time.Duration) Redelivery {
	st, ok := SettlementFromContext(ctx)
	return RedeliveryFor(st, ok, nackDelay)
}
