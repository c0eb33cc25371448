package bus

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"
)

// SettledContext is the context of one delivery, for a transport whose
// deliveries end when they are settled rather than when a parent context is
// canceled. It carries the Delivery (DeliveryFromContext, Settle and
// SettlementFromContext work on it as on WithDelivery's), its values are its
// parent's, and it is done (context.Canceled) once the transport calls
// Settle: after the message is acked or nacked, or when the transport stops
// with the message out. It has no deadline and does not follow its parent's
// cancellation; build it on context.WithoutCancel of the subscription's
// context and call Settle on every way out.
//
// It costs one allocation, where context.WithCancel and WithDelivery cost
// three, and makes its done channel only for a caller who asks for it. The
// contexts derived from it (context.WithCancel, WithTimeout, AfterFunc)
// register with it through its AfterFunc method instead of starting a
// goroutine each.
type SettledContext struct {
	parent context.Context
	st     deliveryState

	mu    sync.Mutex
	done  chan struct{}
	err   error
	after []*func() // AfterFunc's functions not yet run or stopped
}

// NewSettledContext returns the context of a delivery d over parent's values.
func NewSettledContext(parent context.Context, d Delivery) *SettledContext {
	return &SettledContext{parent: parent, st: deliveryState{d: d}}
}

// Deadline reports none: a delivery ends when it is settled.
func (c *SettledContext) Deadline() (time.Time, bool) { return time.Time{}, false }

// Done returns a channel closed once the delivery is settled.
func (c *SettledContext) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done == nil {
		c.done = make(chan struct{})
		if c.err != nil {
			close(c.done)
		}
	}
	return c.done
}

// Err is context.Canceled once the delivery is settled, nil before.
func (c *SettledContext) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Value returns the delivery's state for the delivery key and the parent's
// value for any other key.
func (c *SettledContext) Value(key any) any {
	if _, ok := key.(deliveryKey); ok {
		return &c.st
	}
	return c.parent.Value(key)
}

// AfterFunc runs f in a goroutine of its own once the delivery is settled,
// as context.AfterFunc does; stop reports whether it kept f from running.
func (c *SettledContext) AfterFunc(f func()) (stop func() bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		go f()
		return func() bool { return false }
	}
	p := &f
	c.after = append(c.after, p)
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		i := slices.Index(c.after, p)
		if i < 0 {
			return false
		}
		c.after = slices.Delete(c.after, i, i+1)
		return true
	}
}

// Settle ends the context: Done closes, Err is context.Canceled and the
// functions given to AfterFunc start. Calls after the first do nothing.
func (c *SettledContext) Settle() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return
	}
	c.err = context.Canceled
	if c.done != nil {
		close(c.done)
	}
	for _, f := range c.after {
		go (*f)()
	}
	c.after = nil
}

func (c *SettledContext) String() string {
	return fmt.Sprintf("%v.WithSettledDelivery(%s)", c.parent, c.st.d.ID)
}
