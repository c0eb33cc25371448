package redis

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/omnibus-go/omnibus/bus"
	"github.com/redis/go-redis/v9"
)

const (
	// ackChunk bounds the ids of one XACK and one claimOwnScript call.
	ackChunk = 500
	// shutdownTimeout bounds the Redis calls made while a subscription stops
	// (last acks, handing held entries back).
	shutdownTimeout = 5 * time.Second
	maxErrorBackoff = 5 * time.Second
	// gatherWait is how long a read waits for more free slots when fewer
	// than half a batch are free.
	gatherWait = 2 * time.Millisecond
	// ackLinger is how long acks wait for company before their XACK.
	ackLinger = time.Millisecond
)

// subscription reads one stream for one Subscribe call.
type subscription struct {
	s          *Subscriber
	cfg        *SubscriberConfig
	client     redis.UniversalClient
	logger     *slog.Logger
	topic      string
	stream     string
	deadLetter string

	ctx    context.Context // done when Subscribe's ctx is done or the Subscriber closes
	cancel context.CancelFunc
	out    chan *message.Message

	// slots holds one token per entry the subscription holds; its capacity is
	// MaxInFlight.
	slots chan struct{}

	mu   sync.Mutex
	held map[string]*entry   // entries read or claimed and not yet settled
	keys map[string][]*entry // OrderByKey: keys with an entry out, and the entries queued behind it

	loops sync.WaitGroup // reader, toucher
	msgs  sync.WaitGroup // workers
	work  chan *entry    // entries for idle workers

	ackMu     sync.Mutex
	acks      []string
	ackSignal chan struct{}
	ackStop   chan struct{}
	ackDone   chan struct{}
}

// entry is a stream entry held by a subscription. Its mutable fields are
// guarded by subscription.mu, except count and first, which only the
// goroutine handing the entry out touches.
type entry struct {
	id     string
	fields map[string]any
	msg    *message.Message
	key    string

	count     int64     // delivery count in the pending list, as last known
	first     time.Time // first delivery by this subscription
	delivered bool      // msg has been handed out (later deliveries decode afresh)

	touched time.Time // when its idle time in Redis was last reset
	lost    bool      // reclaimed by another consumer; do not hand it out again
	waiting bool      // nacked, waiting for its retry
	dueAt   time.Time // when waiting: the retry time
	counted bool      // when waiting: the failure spent an attempt
}

func newSubscription(ctx context.Context, s *Subscriber, topic, stream string) *subscription {
	ctx, cancel := context.WithCancel(ctx)
	return &subscription{
		s:          s,
		cfg:        &s.cfg,
		client:     s.client,
		logger:     s.logger.With("topic", topic, "stream", stream),
		topic:      topic,
		stream:     stream,
		deadLetter: s.cfg.deadLetterStream(stream),
		ctx:        ctx,
		cancel:     cancel,
		out:        make(chan *message.Message),
		slots:      make(chan struct{}, s.cfg.MaxInFlight),
		held:       make(map[string]*entry),
		work:       make(chan *entry),
		keys:       make(map[string][]*entry),
		ackSignal:  make(chan struct{}, 1),
		ackStop:    make(chan struct{}),
		ackDone:    make(chan struct{}),
	}
}

func (sub *subscription) run() {
	defer sub.s.subs.Done()
	stop := context.AfterFunc(sub.s.closeCtx, sub.cancel)
	defer stop()
	defer sub.cancel()

	go sub.ackLoop()
	sub.loops.Add(2)
	go sub.readLoop()
	go sub.touchLoop()

	sub.loops.Wait()
	sub.msgs.Wait()
	close(sub.ackStop)
	<-sub.ackDone
	sub.handBack()
	close(sub.out)
	sub.logger.Debug("subscription stopped")
}

// acquire takes between 1 and n slots, waiting for the first one. When fewer
// than half of n are free it waits up to gatherWait for more, so that a
// subscription running at its in-flight limit reads in batches rather than
// one entry per round trip. It returns 0 when the subscription stops.
func (sub *subscription) acquire(n int) int {
	n = min(n, sub.cfg.MaxInFlight)
	select {
	case sub.slots <- struct{}{}:
	case <-sub.ctx.Done():
		return 0
	}
	got := 1 + sub.tryAcquire(n-1)
	half := (n + 1) / 2
	if got >= half {
		return got
	}
	t := time.NewTimer(gatherWait)
	defer t.Stop()
	for got < half {
		select {
		case sub.slots <- struct{}{}:
			got++
		case <-t.C:
			return got + sub.tryAcquire(n-got)
		case <-sub.ctx.Done():
			sub.release(got)
			return 0
		}
	}
	return got + sub.tryAcquire(n-got)
}

// tryAcquire takes up to n slots without waiting.
func (sub *subscription) tryAcquire(n int) int {
	got := 0
	for got < n {
		select {
		case sub.slots <- struct{}{}:
			got++
		default:
			return got
		}
	}
	return got
}

func (sub *subscription) release(n int) {
	for range n {
		<-sub.slots
	}
}

// readLoop moves entries into the subscription: idle entries reclaimed with
// XAUTOCLAIM (at start and every ClaimInterval, until a scan of the pending
// list is complete) and new entries read with XREADGROUP, as many as there
// are free slots. One goroutine does both so neither starves the other of
// slots; a due reclaim runs at most BlockTime late.
func (sub *subscription) readLoop() {
	defer sub.loops.Done()
	var claimTick <-chan time.Time
	claiming := sub.cfg.ClaimInterval >= 0
	if claiming {
		t := time.NewTicker(sub.cfg.ClaimInterval)
		defer t.Stop()
		claimTick = t.C
	}
	cursor := "0-0"
	readBackoff, claimBackoff := newBackoff(), newBackoff()
	for sub.ctx.Err() == nil {
		n := sub.acquire(sub.cfg.BatchSize)
		if n == 0 {
			return
		}
		select {
		case <-claimTick:
			claiming = true
		default:
		}
		if claiming {
			used, next, err := sub.claimIdle(cursor, n)
			n -= used
			switch {
			case err != nil:
				sub.readFailed("reclaim", err, claimBackoff)
				claiming, cursor = false, "0-0" // try again at the next tick
			case next == "0-0":
				claimBackoff.reset()
				claiming, cursor = false, "0-0"
			default:
				claimBackoff.reset()
				cursor = next
			}
			if n == 0 {
				continue
			}
		}
		block := sub.cfg.BlockTime
		if claiming {
			block = -1 // more to reclaim: do not wait for new entries
		}
		// The read runs to its end even when the subscription stops, so the
		// entries it moves into our pending list are known and handed back.
		res, err := sub.client.XReadGroup(context.WithoutCancel(sub.ctx), &redis.XReadGroupArgs{
			Group:    sub.cfg.ConsumerGroup,
			Consumer: sub.cfg.Consumer,
			Streams:  []string{sub.stream, ">"},
			Count:    int64(n),
			Block:    block,
		}).Result()
		if errors.Is(err, redis.Nil) {
			sub.release(n)
			readBackoff.reset()
			continue
		}
		if err != nil {
			sub.release(n)
			sub.readFailed("read", err, readBackoff)
			continue
		}
		readBackoff.reset()
		got := 0
		for _, xs := range res {
			for _, xm := range xs.Messages {
				got++
				sub.accept(xm, 1)
			}
		}
		sub.release(n - got)
	}
}

// readFailed logs err, recreates the group if it vanished, and waits before
// the next try.
func (sub *subscription) readFailed(op string, err error, b *backoff) {
	if sub.ctx.Err() != nil {
		return
	}
	if redis.HasErrorPrefix(err, "NOGROUP") {
		sub.logger.Warn("consumer group or stream missing; recreating it", "op", op, "error", err)
		if err := sub.s.ensureGroup(sub.ctx, sub.stream); err == nil {
			return
		}
	} else {
		sub.logger.Warn("redis call failed; will retry", "op", op, "error", err)
	}
	sleep(sub.ctx, b.next())
}

// claimIdle takes over up to n entries idle for ClaimIdle in the group's
// pending list, scanning it from cursor. The caller holds n slots; claimIdle
// keeps one for each entry it takes over and reports how many it used, and
// the cursor to continue from ("0-0" when the scan is complete).
func (sub *subscription) claimIdle(cursor string, n int) (used int, next string, err error) {
	raw, err := autoClaimScript.Run(sub.ctx, sub.client, []string{sub.stream},
		sub.cfg.ConsumerGroup, sub.cfg.Consumer, sub.cfg.ClaimIdle.Milliseconds(), cursor, n).Result()
	if err != nil {
		return 0, "", fmt.Errorf("reclaim idle entries of stream %q: %w", sub.stream, err)
	}
	next, claimed, counts, trimmed, err := parseAutoClaim(raw)
	if err != nil {
		return 0, "", err
	}
	for _, id := range trimmed {
		sub.reportTrimmed(id, "reclaim")
	}
	for i, xm := range claimed {
		sub.s.stats.reclaimed.Add(1)
		sub.logger.Debug("reclaimed idle entry", "entry_id", xm.ID, "deliveries", counts[i])
		sub.accept(xm, counts[i])
	}
	return len(claimed), next, nil
}

func parseAutoClaim(raw any) (next string, msgs []redis.XMessage, counts []int64, trimmed []string, err error) {
	bad := func(what string) error { return fmt.Errorf("unexpected XAUTOCLAIM reply: %s", what) }
	parts, ok := raw.([]any)
	if !ok || len(parts) < 3 {
		return "", nil, nil, nil, bad("not a 3-4 element array")
	}
	if next, ok = parts[0].(string); !ok {
		return "", nil, nil, nil, bad("cursor")
	}
	entries, _ := parts[1].([]any)
	cs, _ := parts[2].([]any)
	if len(cs) != len(entries) {
		return "", nil, nil, nil, bad("counts")
	}
	for i, e := range entries {
		pair, ok := e.([]any)
		if !ok || len(pair) != 2 {
			return "", nil, nil, nil, bad("entry")
		}
		id, _ := pair[0].(string)
		flat, _ := pair[1].([]any)
		values := make(map[string]any, len(flat)/2)
		for j := 0; j+1 < len(flat); j += 2 {
			k, _ := flat[j].(string)
			values[k] = flat[j+1]
		}
		c, _ := cs[i].(int64)
		msgs = append(msgs, redis.XMessage{ID: id, Values: values})
		counts = append(counts, c)
	}
	if len(parts) > 3 {
		ids, _ := parts[3].([]any)
		for _, id := range ids {
			if s, ok := id.(string); ok {
				trimmed = append(trimmed, s)
			}
		}
	}
	return next, msgs, counts, trimmed, nil
}

// accept takes over an entry read or claimed into our pending list; the
// caller has taken a slot for it.
func (sub *subscription) accept(xm redis.XMessage, count int64) {
	if xm.Values == nil {
		sub.reportTrimmed(xm.ID, "read")
		sub.release(1)
		return
	}
	msg, err := sub.cfg.Marshaler.Unmarshal(xm.Values)
	if err != nil {
		sub.s.stats.undecodable.Add(1)
		sub.logger.Error("undecodable entry; moving it to the dead-letter stream",
			"entry_id", xm.ID, "dead_letter_stream", sub.deadLetter, "error", err)
		if err := sub.writeDeadLetter(xm.ID, xm.Values, DeadLetterReasonUndecodable, err.Error(), bus.ClassPermanent, count); err != nil {
			// Left pending: it is reclaimed and tried again after ClaimIdle.
			sub.logger.Error("write dead letter", "entry_id", xm.ID, "error", err)
		} else {
			sub.ack(xm.ID)
		}
		sub.release(1)
		return
	}
	e := &entry{id: xm.ID, fields: xm.Values, msg: msg, key: bus.PartitionKey(msg), count: count}

	sub.mu.Lock()
	if _, dup := sub.held[e.id]; dup {
		// Reclaimed from ourselves: we hold it already.
		sub.mu.Unlock()
		sub.release(1)
		return
	}
	e.touched = time.Now()
	sub.held[e.id] = e
	if sub.cfg.OrderByKey && e.key != "" {
		if q, busy := sub.keys[e.key]; busy {
			sub.keys[e.key] = append(q, e)
			sub.mu.Unlock()
			return
		}
		sub.keys[e.key] = nil
	}
	sub.mu.Unlock()
	sub.start(e)
}

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
		msgCtx, cancel := context.WithCancel(context.WithoutCancel(sub.ctx))
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

// settle applies the settlement of a nacked entry. It returns true when the
// entry is due for redelivery, false when it is finished with.
func (sub *subscription) settle(e *entry, st bus.Settlement, ok bool) bool {
	if ok && st.GiveUp {
		return sub.giveUp(e, st)
	}
	due := st.RetryAt
	if !ok || due.IsZero() {
		due = time.Now().Add(sub.cfg.NackDelay)
	}
	counted := !ok || st.Class != bus.ClassTransient
	sub.mu.Lock()
	e.waiting, e.dueAt, e.counted = true, due, counted
	sub.mu.Unlock()
	sub.logger.Debug("nacked; redelivering later", "entry_id", e.id, "retry_at", due, "counted", counted)

	if !sleep(sub.ctx, time.Until(due)) {
		sub.finish(e, false)
		return false
	}
	// Redeliver: a counted failure adds one to the delivery count in the
	// pending list, a transient one leaves it; either way the idle time is
	// reset so nobody reclaims the entry while it is out again.
	var delta int64
	if counted {
		delta = 1
	}
	b := newBackoff()
	for {
		res, err := sub.claimOwn(sub.ctx, []claimArg{{id: e.id, delta: delta}})
		if err == nil {
			switch n := res[0]; {
			case n == claimLost:
				sub.logger.Info("nacked entry was reclaimed by another consumer; leaving it to them", "entry_id", e.id)
				sub.finish(e, true)
				return false
			case n == claimTrimmed:
				sub.reportTrimmed(e.id, "redeliver")
				e.count += delta // still handed out, from memory
			default:
				e.count = n
			}
			break
		}
		if sub.ctx.Err() != nil {
			sub.finish(e, false)
			return false
		}
		sub.logger.Warn("redis call failed; will retry", "op", "redeliver", "entry_id", e.id, "error", err)
		if !sleep(sub.ctx, b.next()) {
			sub.finish(e, false)
			return false
		}
	}
	sub.mu.Lock()
	e.waiting = false
	e.touched = time.Now()
	sub.mu.Unlock()
	return true
}

// giveUp copies e to the dead-letter stream and acks it, retrying the copy
// every NackDelay while Redis refuses it.
func (sub *subscription) giveUp(e *entry, st bus.Settlement) bool {
	sub.mu.Lock()
	e.waiting, e.dueAt, e.counted = true, time.Now(), true
	sub.mu.Unlock()
	for {
		err := sub.writeDeadLetter(e.id, e.fields, DeadLetterReasonGaveUp, st.Error, st.Class, e.count)
		if err == nil {
			sub.logger.Info("gave up on entry; moved it to the dead-letter stream",
				"entry_id", e.id, "event_id", e.msg.UUID, "dead_letter_stream", sub.deadLetter,
				"deliveries", e.count, "reason", st.Error)
			sub.ack(e.id)
			sub.finish(e, true)
			return false
		}
		sub.logger.Error("write dead letter; will retry", "entry_id", e.id, "error", err)
		if !sleep(sub.ctx, sub.cfg.NackDelay) {
			sub.finish(e, false)
			return false
		}
	}
}

// writeDeadLetter copies the entry id (its fields) to the dead-letter
// stream with the reason fields, replacing any an earlier dead-lettering left.
func (sub *subscription) writeDeadLetter(id string, fields map[string]any, reason, errText string, class bus.Class, deliveries int64) error {
	if errText == "" {
		errText = "given up"
	}
	values := make([]any, 0, 2*len(fields)+18)
	for _, k := range slices.Sorted(maps.Keys(fields)) {
		if strings.HasPrefix(k, FieldMetadataPrefix+bus.DeadLetterPrefix) {
			continue
		}
		values = append(values, k, fields[k])
	}
	values = append(values,
		FieldMetadataPrefix+KeyDeadLetterReason, reason,
		FieldMetadataPrefix+KeyDeadLetterError, errText,
		FieldMetadataPrefix+KeyDeadLetterClass, class.String(),
		FieldMetadataPrefix+KeyDeadLetterAttempts, strconv.FormatInt(deliveries, 10),
		FieldMetadataPrefix+KeyDeadLetterStream, sub.stream,
		FieldMetadataPrefix+KeyDeadLetterID, id,
		FieldMetadataPrefix+KeyDeadLetterGroup, sub.cfg.ConsumerGroup,
		FieldMetadataPrefix+KeyDeadLetterConsumer, sub.cfg.Consumer,
		FieldMetadataPrefix+KeyDeadLetterAt, time.Now().UTC().Format(time.RFC3339Nano),
	)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(sub.ctx), shutdownTimeout)
	defer cancel()
	err := sub.client.XAdd(ctx, &redis.XAddArgs{Stream: sub.deadLetter, Values: values}).Err()
	if err != nil {
		return classify(fmt.Errorf("copy entry %s of stream %q to dead-letter stream %q: %w", id, sub.stream, sub.deadLetter, err))
	}
	sub.s.stats.deadLettered.Add(1)
	return nil
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

func (sub *subscription) reportTrimmed(id, op string) {
	sub.s.stats.trimmed.Add(1)
	sub.logger.Error("pending entry was trimmed from the stream before it was acked; its data is lost to this group",
		"entry_id", id, "op", op)
}

// ack queues id for the next XACK.
func (sub *subscription) ack(id string) {
	sub.ackMu.Lock()
	sub.acks = append(sub.acks, id)
	sub.ackMu.Unlock()
	select {
	case sub.ackSignal <- struct{}{}:
	default:
	}
}

// ackLoop sends the queued acks, all that have piled up since the last XACK
// (and within ackLinger) in one call.
func (sub *subscription) ackLoop() {
	defer close(sub.ackDone)
	b := newBackoff()
	linger := time.NewTimer(0)
	<-linger.C
	for {
		select {
		case <-sub.ackSignal:
		case <-sub.ackStop:
			if err := sub.flushAcks(); err != nil {
				sub.logger.Error("last acks failed; those entries stay pending and will be redelivered", "error", err)
			}
			return
		}
		// Let a small batch grow for a moment: one XACK for many entries
		// costs Redis and us far less than many XACKs.
		sub.ackMu.Lock()
		small := len(sub.acks) < ackChunk
		sub.ackMu.Unlock()
		if small {
			linger.Reset(ackLinger)
			select {
			case <-linger.C:
			case <-sub.ackStop:
				linger.Stop()
			}
		}
		if err := sub.flushAcks(); err != nil {
			sub.logger.Warn("ack failed; will retry", "error", err)
			select {
			case <-time.After(b.next()):
			case <-sub.ackStop:
			}
			select {
			case sub.ackSignal <- struct{}{}:
			default:
			}
			continue
		}
		b.reset()
	}
}

func (sub *subscription) flushAcks() error {
	for {
		sub.ackMu.Lock()
		ids := sub.acks
		sub.acks = nil
		sub.ackMu.Unlock()
		if len(ids) == 0 {
			return nil
		}
		ctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
		var err error
		for chunk := range slices.Chunk(ids, ackChunk) {
			if err = sub.client.XAck(ctx, sub.stream, sub.cfg.ConsumerGroup, chunk...).Err(); err != nil {
				break
			}
		}
		cancel()
		if err != nil {
			sub.ackMu.Lock()
			sub.acks = append(ids, sub.acks...)
			sub.ackMu.Unlock()
			return fmt.Errorf("ack %d entries of stream %q: %w", len(ids), sub.stream, err)
		}
	}
}

// touchLoop resets the idle time of the entries the subscription holds, so
// other consumers do not reclaim them while a handler runs or a retry waits.
func (sub *subscription) touchLoop() {
	defer sub.loops.Done()
	every := max(sub.cfg.ClaimIdle/3, time.Millisecond)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-sub.ctx.Done():
			return
		}
		var args []claimArg
		var entries []*entry
		now := time.Now()
		sub.mu.Lock()
		for _, e := range sub.held {
			if !e.lost && now.Sub(e.touched) >= every {
				args = append(args, claimArg{id: e.id})
				entries = append(entries, e)
			}
		}
		sub.mu.Unlock()
		if len(args) == 0 {
			continue
		}
		res, err := sub.claimOwn(sub.ctx, args)
		if err != nil {
			if sub.ctx.Err() == nil {
				sub.logger.Warn("redis call failed; will retry", "op", "touch", "error", err)
			}
			continue
		}
		sub.mu.Lock()
		for i, e := range entries {
			switch res[i] {
			case claimLost:
				e.lost = true
				sub.logger.Warn("held entry was reclaimed by another consumer (this one stalled longer than ClaimIdle)", "entry_id", e.id)
			case claimTrimmed:
				e.touched = now
				sub.mu.Unlock()
				sub.reportTrimmed(e.id, "touch")
				sub.mu.Lock()
			default:
				e.touched = now
			}
		}
		sub.mu.Unlock()
	}
}

// handBack makes the entries the subscription still holds claimable by the
// group's consumers (this one's next subscription included): at once, or,
// for an entry waiting for its retry, when the retry is due (a retry further
// away than ClaimIdle comes after ClaimIdle). The delivery count is set so
// that the reclaim, which adds one, leaves it right: an interrupted or never
// started delivery is not an attempt.
func (sub *subscription) handBack() {
	sub.mu.Lock()
	args := make([]claimArg, 0, len(sub.held))
	now := time.Now()
	for _, e := range sub.held {
		if e.lost {
			continue
		}
		a := claimArg{id: e.id, idle: sub.cfg.ClaimIdle, delta: -1}
		if e.waiting {
			a.idle = max(sub.cfg.ClaimIdle-max(e.dueAt.Sub(now), 0), 0)
			if e.counted {
				a.delta = 0
			}
		}
		args = append(args, a)
	}
	sub.held = nil
	sub.mu.Unlock()
	if len(args) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	if _, err := sub.claimOwn(ctx, args); err != nil {
		sub.logger.Warn("could not hand held entries back; they are reclaimed after ClaimIdle",
			"entries", len(args), "error", err)
		return
	}
	sub.logger.Debug("handed held entries back to the group", "entries", len(args))
}

const (
	claimLost    = -1
	claimTrimmed = -2
)

type claimArg struct {
	id    string
	idle  time.Duration
	delta int64
}

// claimOwn runs claimOwnScript over args, in chunks.
func (sub *subscription) claimOwn(ctx context.Context, args []claimArg) ([]int64, error) {
	out := make([]int64, 0, len(args))
	for chunk := range slices.Chunk(args, ackChunk) {
		argv := make([]any, 0, 2+3*len(chunk))
		argv = append(argv, sub.cfg.ConsumerGroup, sub.cfg.Consumer)
		for _, a := range chunk {
			argv = append(argv, a.id, a.idle.Milliseconds(), a.delta)
		}
		res, err := claimOwnScript.Run(ctx, sub.client, []string{sub.stream}, argv...).Int64Slice()
		if err != nil {
			return nil, fmt.Errorf("claim own entries of stream %q: %w", sub.stream, err)
		}
		if len(res) != len(chunk) {
			return nil, fmt.Errorf("claim own entries of stream %q: %d results for %d entries", sub.stream, len(res), len(chunk))
		}
		out = append(out, res...)
	}
	return out, nil
}

// sleep waits for d or until ctx is done; it reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

type backoff struct{ d time.Duration }

func newBackoff() *backoff { return &backoff{} }

func (b *backoff) reset() { b.d = 0 }

func (b *backoff) next() time.Duration {
	if b.d == 0 {
		b.d = 100 * time.Millisecond
	} else {
		b.d = min(2*b.d, maxErrorBackoff)
	}
	return b.d
}
