package redis

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/omnibus-go/omnibus/bus"
)

// start hands e to an idle worker, or to a new one. Workers outlive their
// entries so that a busy subscription does not pay for a fresh goroutine
// (and its stack growth) per message; there are at most MaxInFlight.
func (sub *subscription) start(e *entry) {
	select {
	case sub.work <- e:
	default:
		sub.msgs.Add(1)
		go sub.worker(e)
	}
}

func (sub *subscription) worker(e *entry) {
	defer sub.msgs.Done()
	quit := sub.newQuit()
	for {
		sub.handle(e, quit)
		select {
		case e = <-sub.work:
		case <-quit:
			return
		}
	}
}

// newQuit returns a channel of the calling worker's own that is closed when
// the subscription stops. Workers wait on it rather than on sub.ctx.Done():
// a channel that every worker selects on for every message is a lock they
// all contend for.
func (sub *subscription) newQuit() chan struct{} {
	q := make(chan struct{})
	sub.quitMu.Lock()
	defer sub.quitMu.Unlock()
	if sub.quitting {
		close(q)
	} else {
		sub.quits = append(sub.quits, q)
	}
	return q
}

// quit closes the workers' quit channels; it runs once sub.ctx is done.
func (sub *subscription) quit() {
	sub.quitMu.Lock()
	defer sub.quitMu.Unlock()
	sub.quitting = true
	for _, q := range sub.quits {
		close(q)
	}
	sub.quits = nil
}

// handle hands e out until it is acked, dead-lettered, lost to another
// consumer, or the subscription stops.
func (sub *subscription) handle(e *entry, quit <-chan struct{}) {
	for {
		sub.mu.Lock()
		lost := e.lost
		sub.mu.Unlock()
		if lost {
			sub.finish(e, true)
			return
		}
		select {
		case <-quit:
			sub.finish(e, false)
			return
		default:
		}

		now := time.Now()
		if e.first.IsZero() {
			e.first = now
		}
		// A message is acked or nacked once, and a handler may have changed
		// it: every redelivery gets a fresh one, decoded again.
		msg := e.msg
		if e.delivered {
			if fresh, err := sub.decode(e.fields); err == nil {
				msg = fresh
			} else {
				msg = e.msg.Copy()
			}
		}
		e.delivered = true
		// Every way out of this iteration settles the context, the
		// subscription stopping included, so it need not be tied to sub.ctx's
		// cancellation (which costs a registration per message).
		msgCtx := &settledCtx{Context: bus.WithDelivery(sub.values, bus.Delivery{
			Attempts:         int(max(e.count-1, 0)),
			FirstDeliveredAt: e.first,
			DeliveredAt:      now,
			Source:           sub.stream,
			Topic:            sub.topic,
			ID:               e.id,
			DeadLetter:       sub.deadLetter,
		})}
		msg.SetContext(msgCtx)

		if !sub.fence.valid() {
			// The shard is no longer surely ours: its next owner delivers
			// the entry (DESIGN: a handoff is checked against the lease).
			msgCtx.settle()
			sub.fenced()
			sub.finish(e, false)
			return
		}
		select {
		case sub.out <- msg:
		case <-quit:
			msgCtx.settle()
			sub.finish(e, false)
			return
		}
		sub.s.stats.delivered.Add(1)

		select {
		case <-msg.Acked():
			msgCtx.settle()
			sub.s.stats.acked.Add(1)
			sub.ack(e.id)
			sub.finish(e, true)
			return
		case <-msg.Nacked():
			msgCtx.settle()
			sub.s.stats.nacked.Add(1)
			st, ok := bus.SettlementFromContext(msgCtx)
			if !sub.settle(e, st, ok) {
				return
			}
		case <-quit:
			msgCtx.settle()
			sub.finish(e, false)
			return
		}
	}
}

// finish releases e's slot and, when drop is true (acked, dead-lettered or
// lost), forgets it and hands out the next entry of its key. Entries not
// dropped stay held and are handed back to the group when the subscription
// stops.
func (sub *subscription) finish(e *entry, drop bool) {
	var next *entry
	sub.mu.Lock()
	if drop {
		delete(sub.held, e.id)
		if sub.cfg.OrderByKey && e.key != "" {
			if q := sub.keys[e.key]; len(q) > 0 {
				next = q[0]
				sub.keys[e.key] = q[1:]
			} else {
				delete(sub.keys, e.key)
			}
		}
	}
	sub.mu.Unlock()
	sub.release(1)
	if next != nil {
		// Called from a worker, so msgs cannot reach zero here.
		sub.start(next)
	}
}

// settledCtx is a delivery's context: its parent carries the subscription's
// values and the delivery, and it is done (context.Canceled) once the
// delivery is settled, acked, nacked or abandoned as the subscription stops.
// It costs one allocation, where context.WithCancel costs two, and makes its
// done channel only for a caller who asks for it.
type settledCtx struct {
	context.Context

	mu    sync.Mutex
	done  chan struct{}
	err   error
	after []*func() // AfterFunc's functions not yet run or stopped
}

func (c *settledCtx) Done() <-chan struct{} {
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

func (c *settledCtx) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// AfterFunc runs f in a goroutine of its own once the delivery is settled,
// as context.AfterFunc does; stop reports whether it kept f from running.
// The context package uses it for the contexts derived from this one
// (context.WithCancel, WithTimeout, AfterFunc), which would otherwise each
// start a goroutine that waits for Done.
func (c *settledCtx) AfterFunc(f func()) (stop func() bool) {
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

func (c *settledCtx) settle() {
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
