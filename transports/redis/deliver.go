package redis

import (
	"runtime"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/internal/handout"
)

// Entries are handed out without a goroutine per message:
//   - start queues an entry on sub.ready;
//   - the deliverer, one goroutine, hands queued entries out on sub.out in
//     the order they were started and passes each delivery to the settler;
//   - the settler, one goroutine, notices acks and nacks. It waits on the
//     oldest delivery out and, once woken, looks at all of them without
//     waiting. A delivery out for longer than detachAfter gets a goroutine
//     of its own that waits for it, so a slow handler delays the noticing
//     of other deliveries' acks by at most that long.
//
// A nacked delivery waits for its retry in a goroutine of its own, which
// queues the entry again when the retry is due.

// detachAfter is how long the settler waits on the oldest delivery before
// leaving it to a goroutine of its own.
const detachAfter = time.Millisecond

// delivery is an entry handed out: the message, its context and when the
// consumer took it.
type delivery struct {
	e   *entry
	msg *message.Message
	ctx *bus.SettledContext
	at  time.Time
}

// start queues e to be handed out. It never blocks: every entry started and
// not finished holds one of the MaxInFlight slots, and sub.ready has room
// for as many.
func (sub *subscription) start(e *entry) {
	sub.ready <- e
}

// deliverLoop hands queued entries out until the subscription stops.
func (sub *subscription) deliverLoop() {
	defer sub.msgs.Done()
	defer close(sub.delivererDone)
	done := sub.ctx.Done()
	for {
		select {
		case e := <-sub.ready:
			if d := sub.deliver(e); d != nil {
				sub.handedOut(d)
			}
		case <-done:
			for {
				select {
				case e := <-sub.ready:
					sub.finish(e, false)
				default:
					return
				}
			}
		}
	}
}

// deliver hands e out and returns its delivery, or nil when e is not handed
// out: lost to another consumer, or the subscription stopping.
func (sub *subscription) deliver(e *entry) *delivery {
	sub.mu.Lock()
	lost := e.lost
	sub.mu.Unlock()
	if lost {
		sub.finish(e, true)
		return nil
	}
	if sub.ctx.Err() != nil {
		sub.finish(e, false)
		return nil
	}

	now := time.Now()
	if e.first.IsZero() {
		e.first = now
	}
	// A message is acked or nacked once, and a handler may have changed it:
	// every redelivery gets a fresh one, decoded again.
	msg := e.msg
	if e.delivered {
		if fresh, err := sub.decode(e.fields); err == nil {
			msg = fresh
		} else {
			msg = e.msg.Copy()
		}
	}
	e.delivered = true
	// Every way out settles the context, the subscription stopping included,
	// so it need not be tied to sub.ctx's cancellation (which costs a
	// registration per message).
	msgCtx := bus.NewSettledContext(sub.values, bus.Delivery{
		Attempts:         int(max(e.count-1, 0)),
		FirstDeliveredAt: e.first,
		DeliveredAt:      now,
		Source:           sub.stream,
		Topic:            sub.topic,
		ID:               e.id,
		DeadLetter:       sub.deadLetter,
	})
	msg.SetContext(msgCtx)

	if !sub.handOut(msg) {
		msgCtx.Settle()
		if !sub.fence.valid() {
			// The shard is no longer surely ours: its next owner delivers
			// the entry (DESIGN: a handoff is checked against the lease).
			sub.fenced()
		}
		sub.finish(e, false)
		return nil
	}
	sub.s.stats.delivered.Add(1)
	// Out from now: waiting for the consumer to take it does not count.
	return &delivery{e: e, msg: msg, ctx: msgCtx, at: time.Now()}
}

// handOut sends msg on sub.out and reports whether it did. It does not once
// the subscription stops, nor, on a sharded stream, once the shard's lease
// is no longer surely ours, before or while it waits for the consumer to
// take the message: a consumer paused past its lease hands nothing out when
// it wakes. (A lease found lost stops the subscription.)
func (sub *subscription) handOut(msg *message.Message) bool {
	if sub.fence == nil {
		select {
		case sub.out <- msg:
			return true
		case <-sub.ctx.Done():
			return false
		}
	}
	return handout.Send(sub.out, msg, sub.fence.left, sub.ctx.Done(), nil, &sub.handTimer)
}

// handedOut passes d to the settler, waking it when it has nothing out.
func (sub *subscription) handedOut(d *delivery) {
	sub.outMu.Lock()
	sub.outNew = append(sub.outNew, d)
	wake := sub.settlerIdle
	sub.settlerIdle = false
	sub.outMu.Unlock()
	if wake {
		select {
		case sub.settlerWake <- struct{}{}:
		default:
		}
	}
}

// settleLoop notices the deliveries' acks and nacks until the subscription
// stops; then it ends the deliveries still out, which stay held and are
// handed back.
func (sub *subscription) settleLoop() {
	defer sub.msgs.Done()
	var out []*delivery // oldest first
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	var timed *delivery // the delivery the timer is set for
	done := sub.ctx.Done()
	for {
		out = sub.sweep(sub.takeHandedOut(out))
		if len(out) == 0 {
			if !sub.settlerWaits() {
				continue
			}
			select {
			case <-sub.settlerWake:
				continue
			case <-done:
				sub.abandon(out)
				return
			}
		}
		// Yield once before waiting: the consumer and the handlers run
		// meanwhile, and the second sweep finds their acks together.
		// Without it a fast consumer woke the settler for nearly every
		// message (docs/benchmarks.md, "One goroutine hands out").
		runtime.Gosched()
		if out = sub.sweep(out); len(out) == 0 {
			continue
		}
		oldest := out[0]
		if timed != oldest {
			timer.Reset(max(detachAfter-time.Since(oldest.at), 0))
			timed = oldest
		}
		select {
		case <-oldest.msg.Acked():
		case <-oldest.msg.Nacked():
		case <-sub.settlerWake:
		case <-timer.C:
			timed = nil
			for len(out) > 0 && time.Since(out[0].at) >= detachAfter {
				sub.msgs.Add(1)
				go sub.await(out[0])
				out[0] = nil
				out = out[1:]
			}
		case <-done:
			sub.abandon(out)
			return
		}
	}
}

// takeHandedOut appends the deliveries handed out since the last call to out.
func (sub *subscription) takeHandedOut(out []*delivery) []*delivery {
	sub.outMu.Lock()
	defer sub.outMu.Unlock()
	out = append(out, sub.outNew...)
	clear(sub.outNew)
	sub.outNew = sub.outNew[:0]
	return out
}

// settlerWaits reports whether nothing was handed out since the last
// takeHandedOut, and if so marks the settler as waiting for settlerWake.
func (sub *subscription) settlerWaits() bool {
	sub.outMu.Lock()
	defer sub.outMu.Unlock()
	sub.settlerIdle = len(sub.outNew) == 0
	return sub.settlerIdle
}

// sweep settles the deliveries of out that are acked or nacked, without
// waiting, and returns the others, oldest first.
func (sub *subscription) sweep(out []*delivery) []*delivery {
	kept := out[:0]
	for _, d := range out {
		select {
		case <-d.msg.Acked():
			sub.acked(d)
		case <-d.msg.Nacked():
			sub.msgs.Add(1)
			go func() {
				defer sub.msgs.Done()
				sub.nacked(d)
			}()
		default:
			kept = append(kept, d)
		}
	}
	clear(out[len(kept):])
	return kept
}

// abandon ends the deliveries out when the subscription stops, after the
// deliverer has stopped handing out more.
func (sub *subscription) abandon(out []*delivery) {
	<-sub.delivererDone
	for _, d := range sub.takeHandedOut(out) {
		sub.abandoned(d)
	}
}

// await waits for one delivery's settlement in a goroutine of its own.
func (sub *subscription) await(d *delivery) {
	defer sub.msgs.Done()
	select {
	case <-d.msg.Acked():
		sub.acked(d)
	case <-d.msg.Nacked():
		sub.nacked(d)
	case <-sub.ctx.Done():
		sub.abandoned(d)
	}
}

// abandoned ends a delivery out when the subscription stops: the entry
// stays held and is handed back.
func (sub *subscription) abandoned(d *delivery) {
	d.ctx.Settle()
	sub.finish(d.e, false)
}

func (sub *subscription) acked(d *delivery) {
	d.ctx.Settle()
	sub.s.stats.acked.Add(1)
	sub.ack(d.e.id)
	sub.finish(d.e, true)
}

// nacked applies a nack's settlement: the entry is queued again when its
// retry is due, or given up on.
func (sub *subscription) nacked(d *delivery) {
	d.ctx.Settle()
	sub.s.stats.nacked.Add(1)
	st, ok := bus.SettlementFromContext(d.ctx)
	if sub.settle(d.e, st, ok) {
		sub.start(d.e)
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
		sub.start(next)
	}
}
