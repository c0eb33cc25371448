package redis

import (
	"context"
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
	for {
		sub.handle(e)
		select {
		case e = <-sub.work:
		case <-sub.ctx.Done():
			return
		}
	}
}

// handle hands e out until it is acked, dead-lettered, lost to another
// consumer, or the subscription stops.
func (sub *subscription) handle(e *entry) {
	for {
		sub.mu.Lock()
		lost := e.lost
		sub.mu.Unlock()
		if lost {
			sub.finish(e, true)
			return
		}
		if sub.ctx.Err() != nil {
			sub.finish(e, false)
			return
		}

		now := time.Now()
		if e.first.IsZero() {
			e.first = now
		}
		// A message is acked or nacked once, and a handler may have changed
		// it: every redelivery gets a fresh one, decoded again.
		msg := e.msg
		if e.delivered {
			if fresh, err := sub.cfg.Marshaler.Unmarshal(e.fields); err == nil {
				msg = fresh
			} else {
				msg = e.msg.Copy()
			}
		}
		e.delivered = true
		// Every way out of this iteration calls cancel, the subscription
		// stopping included, so the context need not be tied to sub.ctx's
		// cancellation (which costs a registration per message).
		msgCtx, cancel := context.WithCancel(sub.values)
		msgCtx = bus.WithDelivery(msgCtx, bus.Delivery{
			Attempts:         int(max(e.count-1, 0)),
			FirstDeliveredAt: e.first,
			DeliveredAt:      now,
			Source:           sub.stream,
			Topic:            sub.topic,
			ID:               e.id,
			DeadLetter:       sub.deadLetter,
		})
		msg.SetContext(msgCtx)

		if !sub.fence.valid() {
			// The shard is no longer surely ours: its next owner delivers
			// the entry (DESIGN: a handoff is checked against the lease).
			cancel()
			sub.fenced()
			sub.finish(e, false)
			return
		}
		select {
		case sub.out <- msg:
		case <-sub.ctx.Done():
			cancel()
			sub.finish(e, false)
			return
		}
		sub.s.stats.delivered.Add(1)

		select {
		case <-msg.Acked():
			cancel()
			sub.s.stats.acked.Add(1)
			sub.ack(e.id)
			sub.finish(e, true)
			return
		case <-msg.Nacked():
			cancel()
			sub.s.stats.nacked.Add(1)
			st, ok := bus.SettlementFromContext(msgCtx)
			if !sub.settle(e, st, ok) {
				return
			}
		case <-sub.ctx.Done():
			cancel()
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
