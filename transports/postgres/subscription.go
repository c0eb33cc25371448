package postgres

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/internal/handout"
)

// subscription is one Subscribe call: a fetch loop and one goroutine per
// unit (a key's run, or an unkeyed row) it hands out.
type subscription struct {
	s     *Subscriber
	topic string
	out   chan *message.Message

	wake     chan struct{}
	unitDone chan struct{}
	active   atomic.Int64
	units    sync.WaitGroup
}

func newSubscription(s *Subscriber, topic string) *subscription {
	return &subscription{
		s:        s,
		topic:    topic,
		out:      make(chan *message.Message),
		wake:     make(chan struct{}, 1),
		unitDone: make(chan struct{}, 1),
	}
}

func (sub *subscription) run(parent context.Context) {
	s := sub.s
	// ctx ends when the caller's context ends or the Subscriber closes; it
	// stops fetching and emitting. Messages carry parent's values but not its
	// cancellation: whichever way shutdown starts (Close, or a router
	// cancelling the subscription), in-flight handlers get CloseTimeout to
	// finish before their contexts are cancelled and their rows released.
	ctx, cancel := context.WithCancel(parent)
	defer cancel()
	go func() {
		select {
		case <-s.closing:
			cancel()
		case <-ctx.Done():
		}
	}()

	var notified <-chan struct{}
	if !s.cfg.DisableListen {
		ls := listen(s.pool, s.eng.q.channel, s.log)
		defer ls.Close()
		notified = ls.C()
	}
	poll := time.NewTicker(s.cfg.PollInterval)
	defer poll.Stop()

	log := s.log.With("topic", sub.topic)
	failures := 0
	turns := turnState{backoff: map[laneKey]laneBackoff{}}
	for ctx.Err() == nil {
		free := s.cfg.MaxInFlight - int(sub.active.Load())
		if free <= 0 {
			select {
			case <-sub.unitDone:
			case <-ctx.Done():
			}
			continue
		}
		n := min(s.cfg.BatchSize, free)
		start := time.Now()
		res, err := s.eng.fetch(ctx, sub.topic, n, n)
		s.observeFetch(res, time.Since(start), err)
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			failures++
			log.Error("omnibus: fetch failed; retrying", "error", err)
			select {
			case <-ctx.Done():
			case <-time.After(backoffDelay(failures)):
			}
			continue
		}
		failures = 0
		loose := sub.start(parent, ctx, res)
		if res.lanes >= n || loose >= n {
			continue // there is probably more; fetch again at once
		}
		if len(res.units) < free {
			sub.takeTurn(parent, ctx, &turns)
		}
		select {
		case <-ctx.Done():
		case <-sub.wake:
		case <-notified:
		case <-poll.C:
		}
	}
	sub.units.Wait()
	s.flush.written()
	close(sub.out)
}

// start hands out the units of a fetch, releases the rows it cut and gives
// back the lanes that yielded nothing. It returns the unkeyed units started.
func (sub *subscription) start(parent, ctx context.Context, res fetchResult) (loose int) {
	s := sub.s
	for _, u := range res.units {
		if u.lane == nil {
			loose++
		}
		s.tracked.add(u)
		sub.active.Add(1)
		sub.units.Add(1)
		go sub.deliver(context.WithoutCancel(parent), ctx, u)
	}
	for _, r := range res.cut {
		s.flush.settle(r.settle('r'))
	}
	for _, k := range res.idle {
		s.tracked.addLane(k)
		s.flush.lane(k, 0, false)
	}
	return loose
}

// How a relay waits its turn on a lane that writers keep locked (a hot key
// with overlapping writers, or a writer idle in its transaction): a lane
// ready and free for starveAfter without being leased is starved; at most
// every starveAfter the relay takes a turn on one starved lane, waiting up to
// turnWait for the writers that hold it. A lane whose wait ran out is not
// tried again before a backoff that doubles up to maxTurnBackoff, so a
// writer idle in its transaction costs a bounded number of statements.
const (
	starveAfter    = 50 * time.Millisecond
	turnWait       = 100 * time.Millisecond
	maxTurnBackoff = 5 * time.Second
)

type laneBackoff struct {
	until    time.Time
	failures int
}

type turnState struct {
	last    time.Time
	backoff map[laneKey]laneBackoff
}

// takeTurn looks for a starved lane and, if one is due, waits its turn on it.
func (sub *subscription) takeTurn(parent, ctx context.Context, ts *turnState) {
	s := sub.s
	now := time.Now()
	if now.Sub(ts.last) < starveAfter {
		return
	}
	ts.last = now
	lanes, err := s.eng.starved(ctx, sub.topic, starveAfter, 8)
	if err != nil {
		if ctx.Err() == nil {
			s.log.Warn("omnibus: looking for starved lanes failed", "error", err)
		}
		return
	}
	for k, b := range ts.backoff {
		if now.After(b.until.Add(maxTurnBackoff)) {
			delete(ts.backoff, k) // not seen starving for a while
		}
	}
	for _, k := range lanes {
		b := ts.backoff[k]
		if now.Before(b.until) {
			continue
		}
		res, ok, err := s.eng.turn(ctx, k, turnWait)
		s.observeFetch(res, time.Since(now), err)
		switch {
		case err != nil:
			if ctx.Err() == nil {
				s.log.Warn("omnibus: waiting for a turn on a lane failed", "error", err, "topic", k.topic)
			}
		case !ok:
			b.failures++
			b.until = time.Now().Add(min(turnWait<<min(b.failures, 10), maxTurnBackoff))
			ts.backoff[k] = b
			s.log.Debug("omnibus: a writer holds the lane; waiting", "topic", k.topic, "failures", b.failures)
		default:
			delete(ts.backoff, k)
			sub.start(parent, ctx, res)
		}
		return
	}
}

// outcome of one emitted message.
type outcome int

const (
	acked outcome = iota
	nacked
	abandoned // not settled within CloseTimeout after shutdown began
)

// chainFor bounds how long a Subscriber keeps a lane for run after run
// (engine.next) before giving it back: a lane given back is looked at again
// from its floor, so a delayed row of the key that fell due, or a requeued
// one, waits at most this long behind the runs after it.
const chainFor = 250 * time.Millisecond

// deliver emits the runs of u's key one at a time: the rows of a run one at
// a time, each after the previous one was acked, and, while every row is
// acked and the run was a full RunLength, the key's next run (engine.next,
// taken while the run before is emitted) until the key has nothing
// deliverable, a writer holds it, or chainFor has passed. A nack settles its
// row and releases the rest of the run.
func (sub *subscription) deliver(base, ctx context.Context, u unit) {
	s := sub.s
	drained := false // the key's last run was all acked and held every row in line
	defer func() {
		s.tracked.done(u)
		if u.lane != nil && !u.lease.superseded.Load() {
			s.flush.lane(*u.lane, u.rows[len(u.rows)-1].id, drained)
		}
		sub.active.Add(-1)
		signal(sub.unitDone)
		sub.units.Done()
	}()
	chained := time.Now()
	var written []settleOp // acks of the run before, written by the next run's transaction
	for {
		// The key's next run is taken while this one is emitted, so that
		// its round trip overlaps the handlers, and its transaction writes
		// the acks of the run before. A run shorter than RunLength ended at
		// the last row in line when it was picked: the key most likely has
		// nothing more, and a fetch finds what writers add later.
		var ahead chan nextRun
		if u.lane != nil && len(u.rows) == s.eng.run && time.Since(chained) < chainFor {
			ahead = make(chan nextRun, 1)
			go func(u unit, acks []settleOp) { ahead <- sub.next(ctx, u, acks) }(u, written)
		} else {
			sub.settleAll(written)
		}
		var acks []settleOp
		all := sub.emit(base, ctx, u, &acks)
		if ahead == nil {
			sub.settleAll(acks)
			drained = all && len(u.rows) < s.eng.run
			return
		}
		n := <-ahead
		if !n.settled {
			sub.settleAll(n.acks)
		}
		if n.unit.lane == nil {
			sub.settleAll(acks)
			drained = all && n.settled // the next run found nothing in line
			return
		}
		if u.lease.superseded.Load() {
			// This worker leased the lane anew meanwhile, and the next
			// run was taken under that lease: leave it to the new unit
			// (a release would cut the new lease's run short).
			sub.settleAll(acks)
			return
		}
		if !all || ctx.Err() != nil || !n.unit.lease.held(time.Now()) {
			// This run stopped (a nack, shutdown, a lost lease), or it took
			// longer than the next run's lease: give the next run back
			// unhandled (no attempt spent).
			sub.settleAll(acks)
			sub.release(n.unit.rows)
			return
		}
		if !s.tracked.continued(u, n.unit) {
			sub.settleAll(acks) // superseded since the look above
			return
		}
		u, written = n.unit, acks
	}
}

// nextRun is what subscription.next found: the key's next run (lane nil for
// none), and whether the acks given to it were written.
type nextRun struct {
	unit    unit
	acks    []settleOp
	settled bool
}

// settleAll hands ops to the flusher.
func (sub *subscription) settleAll(ops []settleOp) {
	for _, o := range ops {
		sub.s.flush.settle(o)
	}
}

// next takes the next run of u's key, which this worker still holds, and
// writes acks, the acks of the run before u, in the same transaction.
func (sub *subscription) next(ctx context.Context, u unit, acks []settleOp) nextRun {
	s := sub.s
	n := nextRun{acks: acks}
	start := time.Now()
	res, err := s.eng.next(ctx, *u.lane, u.rows[len(u.rows)-1].id, acks)
	if err != nil && isLockTimeout(err) {
		return n // a writer of the key is in flight: give it back, it gets its turn
	}
	s.observeFetch(res, time.Since(start), err)
	if err != nil {
		if ctx.Err() == nil {
			s.log.Warn("omnibus: taking the next run of a key failed; giving the key back", "error", err, "topic", u.lane.topic)
		}
		return n
	}
	n.settled = true
	for _, r := range res.cut {
		s.flush.settle(r.settle('r'))
	}
	if len(res.units) > 0 {
		n.unit = res.units[0]
	}
	return n
}

// collectFor bounds how long emit keeps acks for the caller to write with
// the key's next run: a run whose handlers are slow hands its acks to the
// flusher as they come, so that a relay that dies redelivers few acked rows.
const collectFor = 20 * time.Millisecond

// emit emits the rows of u one at a time, each after the previous one was
// acked, and reports whether all were acked. For collectFor it appends the
// acks to acks (the caller writes them), then it hands them and the later
// ones to the flusher; a nack settles its row and releases the rest of the
// run.
func (sub *subscription) emit(base, ctx context.Context, u unit, acks *[]settleOp) bool {
	s := sub.s
	collectUntil := time.Now().Add(collectFor)
	for i, r := range u.rows {
		if ctx.Err() != nil {
			sub.release(u.rows[i:])
			return false
		}
		mctx, cancel := context.WithCancel(base)
		msg := s.newMessage(mctx, r)
		if !sub.handOut(ctx, u.lease, msg) {
			cancel()
			if ctx.Err() == nil {
				// Another worker may hold the key now: deliver nothing
				// more of it. The releases are dropped by the lease guard
				// if so.
				s.leaseLost(u, len(u.rows)-i)
			}
			sub.release(u.rows[i:])
			return false
		}
		out := sub.await(ctx, msg)
		cancel()
		switch out {
		case acked:
			if time.Now().Before(collectUntil) {
				*acks = append(*acks, r.settle('a'))
				break
			}
			sub.settleAll(*acks)
			*acks = nil
			s.flush.settle(r.settle('a'))
		case nacked:
			s.flush.settle(s.nackOp(msg, r))
			sub.release(u.rows[i+1:])
			return false
		case abandoned:
			sub.release(u.rows[i:])
			return false
		}
	}
	return true
}

// handOut sends msg to the consumer and reports whether it did. It does not
// once ctx ends, nor, for a keyed message (l not nil), once the lease of
// its key is lost or has run out, before or while it waits for the
// consumer to take it: another worker may hold the key by then.
func (sub *subscription) handOut(ctx context.Context, l *unitLease, msg *message.Message) bool {
	if l == nil {
		select {
		case sub.out <- msg:
			return true
		case <-ctx.Done():
			return false
		}
	}
	t := leaseTimers.Get().(*handout.Timer)
	defer leaseTimers.Put(t)
	return handout.Send(sub.out, msg, func() time.Duration { return l.until(time.Now()) }, ctx.Done(), l.gone, t)
}

// leaseTimers are handOut's timers.
var leaseTimers = sync.Pool{New: func() any { return new(handout.Timer) }}

func (sub *subscription) await(ctx context.Context, msg *message.Message) outcome {
	select {
	case <-msg.Acked():
		return acked
	case <-msg.Nacked():
		return nacked
	case <-ctx.Done():
	}
	// Closing: give the handler up to CloseTimeout to finish.
	t := time.NewTimer(sub.s.cfg.CloseTimeout)
	defer t.Stop()
	select {
	case <-msg.Acked():
		return acked
	case <-msg.Nacked():
		return nacked
	case <-t.C:
		return abandoned
	}
}

func (sub *subscription) release(rs []row) {
	for _, r := range rs {
		sub.s.flush.settle(r.settle('r'))
	}
}

func (s *Subscriber) leaseLost(u unit, rows int) {
	s.log.Warn("omnibus: lost the lease of a key while delivering it; stopping its run",
		"topic", u.lane.topic, "rows_not_delivered", rows)
	if o, ok := s.cfg.Observer.(LeaseObserver); ok {
		o.ObserveLeaseLost(LeaseLostInfo{Table: s.cfg.Table, ConsumerGroup: s.cfg.ConsumerGroup, Topic: u.lane.topic, Rows: rows})
	}
}

// newMessage turns a row into a message carrying its Delivery.
func (s *Subscriber) newMessage(ctx context.Context, r row) *message.Message {
	msg := message.NewMessage(r.eventID, r.payload)
	if r.metadata != nil {
		msg.Metadata = r.metadata
	}
	if msg.UUID == "" {
		// An inbox row whose message id is not a UUID has no event_id
		// column; Inbox.Store keeps the id in the metadata instead.
		msg.UUID = msg.Metadata.Get(bus.KeyEventID)
	}
	if r.partitionKey != nil && msg.Metadata.Get(bus.KeyPartitionKey) == "" {
		msg.Metadata.Set(bus.KeyPartitionKey, *r.partitionKey)
	}
	if r.eventType != nil && msg.Metadata.Get(bus.KeyEventType) == "" {
		msg.Metadata.Set(bus.KeyEventType, *r.eventType)
	}
	now := time.Now()
	msg.SetContext(bus.WithDelivery(ctx, bus.Delivery{
		Attempts:         r.attempts,
		MaxAttempts:      r.maxAttempts,
		FirstDeliveredAt: now,
		DeliveredAt:      now,
		Source:           s.cfg.Table,
		Topic:            r.topic,
		ID:               strconv.FormatInt(r.id, 10),
	}))
	return msg
}

// nackOp turns the settlement recorded on msg into the row's update.
func (s *Subscriber) nackOp(msg *message.Message, r row) settleOp {
	st, ok := bus.SettlementOf(msg)
	if !ok {
		// Deliver again, but not at once: a handler that always Nacks must
		// not make the row go round in a hot loop.
		t := time.Now().Add(s.cfg.TransientDelay)
		op := r.settle('p')
		op.inc, op.err, op.retryAt = 1, "nacked without a settlement", &t
		return op
	}
	op := r.settle('n')
	op.err = storableText(st.Error, s.cfg.MaxErrorLength)
	if op.err == "" {
		op.err = st.Class.String() + " failure"
	}
	if !st.RetryAt.IsZero() {
		t := storableTime(st.RetryAt)
		op.retryAt = &t
	}
	switch st.Class {
	case bus.ClassTransient:
		if op.retryAt == nil {
			t := time.Now().Add(s.cfg.TransientDelay)
			op.retryAt = &t
		}
	case bus.ClassPermanent:
		op.inc, op.giveUp = 1, true
	default:
		op.inc, op.giveUp = 1, st.GiveUp
	}
	return op
}

// storableText makes an error text something a text column holds: valid
// UTF-8 (invalid bytes become U+FFFD), without NUL (PostgreSQL refuses
// both with 22021), at most n bytes, cut on a rune boundary.
func storableText(s string, n int) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	s = strings.ReplaceAll(s, "\x00", "\uFFFD")
	if len(s) <= n {
		return s
	}
	s = s[:n]
	for !utf8.ValidString(s) && len(s) > 0 {
		s = s[:len(s)-1]
	}
	return s
}

// Retry times are clamped to what both timestamptz and any client reading
// it hold: a time past latestRetry (a RetryAt of year 300000, 22008 in
// PostgreSQL) is stored as latestRetry, which is as good as never; a time
// before the epoch is stored as the epoch, which is as good as now.
var (
	latestRetry   = time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC)
	earliestRetry = time.Unix(0, 0).UTC()
)

func storableTime(t time.Time) time.Time {
	switch {
	case t.After(latestRetry):
		return latestRetry
	case t.Before(earliestRetry):
		return earliestRetry
	}
	return t
}
