package kafka

import (
	"context"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/IBM/sarama"

	"github.com/omnibus-go/omnibus/bus"
)

// record is one consumed record from the moment it is read until its offset
// may be committed.
type record struct {
	rec   *sarama.ConsumerMessage
	key   string
	keyed bool
	done  bool // acked, dead-lettered, or acked by an earlier owner
}

// partitionWorker hands out the records of one claimed partition. Its state
// is owned by the run goroutine; one deliver goroutine per record in flight
// reports back through results.
type partitionWorker struct {
	sub       *subscription
	cfg       *SubscriberConfig
	sess      sarama.ConsumerGroupSession
	claim     sarama.ConsumerGroupClaim
	topic     string
	partition int32
	log       *slog.Logger

	ctx     context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	results chan *record

	// window holds the records read and not yet committable, in offset
	// order; window[0] is the first one not done.
	window   []*record
	lanes    map[string][]*record // per key: records waiting behind the one in flight
	ready    []*record            // records free to go, waiting for an in-flight slot
	inflight int
	maxRead  int // records held before fetching pauses
	paused   bool
	stopping bool // released: start no more deliveries

	ackedBefore ackedSet // acks an earlier owner recorded in the commit metadata

	lastDone   int64 // offset of the last record that left the window
	hasDone    bool
	dirty      bool  // something completed since the last mark
	markedNext int64 // offset last marked (or the committed one at start)
}

func newPartitionWorker(sub *subscription, sess sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) *partitionWorker {
	cfg := &sub.s.cfg
	w := &partitionWorker{
		sub:        sub,
		cfg:        cfg,
		sess:       sess,
		claim:      claim,
		topic:      claim.Topic(),
		partition:  claim.Partition(),
		log:        sub.log.With("partition", claim.Partition()),
		results:    make(chan *record, cfg.MaxInFlight),
		lanes:      make(map[string][]*record),
		maxRead:    max(4*cfg.MaxInFlight, 16),
		markedNext: -1,
	}
	if off := claim.InitialOffset(); off >= 0 {
		w.markedNext = off
	}
	w.ctx, w.cancel = context.WithCancel(sess.Context())
	return w
}

// run reads the claim until it is revoked or the session ends, then stops
// the deliveries in flight and marks what was acked.
func (w *partitionWorker) run() {
	w.ackedBefore = w.loadAckedBefore()
	w.log.Debug("kafka partition claimed", "offset", w.claim.InitialOffset(), "acked_beyond", w.ackedBefore.len())

	markEvery := max(w.cfg.CommitInterval/4, 10*time.Millisecond)
	tick := time.NewTicker(markEvery)
	defer tick.Stop()

	defer func() {
		w.stopping = true
		w.cancel()
		w.wg.Wait()
		for {
			select {
			case r := <-w.results:
				w.complete(r)
				continue
			default:
			}
			break
		}
		w.mark()
		if w.paused {
			w.sub.group.Resume(map[string][]int32{w.topic: {w.partition}})
		}
		w.log.Debug("kafka partition released", "in_flight", w.inflight, "uncommitted", len(w.window))
	}()

	for {
		select {
		case rec, ok := <-w.claim.Messages():
			if !ok {
				return // revoked, or the session is over
			}
			w.add(rec)
		case r := <-w.results:
			w.complete(r)
		case <-tick.C:
			w.mark()
		case <-w.ctx.Done():
			return
		}
		w.throttle()
	}
}

// throttle pauses fetching while the worker holds maxRead records and
// resumes it when half of them are done. The claim keeps being read, so a
// revocation is noticed at once; what the fetcher had buffered still arrives.
func (w *partitionWorker) throttle() {
	switch {
	case !w.paused && len(w.window) >= w.maxRead:
		w.paused = true
		w.sub.group.Pause(map[string][]int32{w.topic: {w.partition}})
	case w.paused && len(w.window) <= w.maxRead/2:
		w.paused = false
		w.sub.group.Resume(map[string][]int32{w.topic: {w.partition}})
	}
}

func (w *partitionWorker) add(rec *sarama.ConsumerMessage) {
	r := &record{rec: rec, key: string(rec.Key), keyed: len(rec.Key) > 0}
	if w.ackedBefore.has(rec.Offset) {
		// Acked by the previous owner: it only has to leave the window in
		// order. Its key's earlier records were acked before it was.
		r.done = true
		w.window = append(w.window, r)
		w.advance()
		return
	}
	w.window = append(w.window, r)
	if r.keyed {
		if waiting, busy := w.lanes[r.key]; busy {
			w.lanes[r.key] = append(waiting, r)
			return
		}
		w.lanes[r.key] = nil
	}
	w.ready = append(w.ready, r)
	w.dispatch()
}

func (w *partitionWorker) dispatch() {
	for !w.stopping && w.inflight < w.cfg.MaxInFlight && len(w.ready) > 0 {
		r := w.ready[0]
		w.ready[0] = nil
		w.ready = w.ready[1:]
		w.inflight++
		w.wg.Add(1)
		go w.deliver(r)
	}
}

// complete takes a handled record out of flight and frees its key.
func (w *partitionWorker) complete(r *record) {
	r.done = true
	w.inflight--
	if r.keyed {
		if waiting := w.lanes[r.key]; len(waiting) > 0 {
			next := waiting[0]
			waiting[0] = nil
			w.lanes[r.key] = waiting[1:]
			w.ready = append(w.ready, next)
		} else {
			delete(w.lanes, r.key)
		}
	}
	w.dirty = true
	w.advance()
	w.dispatch()
}

// advance drops the done records at the head of the window.
func (w *partitionWorker) advance() {
	i := 0
	for i < len(w.window) && w.window[i].done {
		w.lastDone, w.hasDone = w.window[i].rec.Offset, true
		w.window[i] = nil
		i++
	}
	if i > 0 {
		w.window = w.window[i:]
		w.dirty = true
	}
}

// mark records the next offset to commit (the first record not done) and,
// in the metadata, the records done beyond it. The session commits it on
// its own schedule and when the partition is released.
func (w *partitionWorker) mark() {
	if !w.dirty {
		return
	}
	w.dirty = false
	var next int64
	switch {
	case len(w.window) > 0:
		next = w.window[0].rec.Offset
	case w.hasDone:
		next = w.lastDone + 1
	default:
		return
	}
	meta := encodeAcked(next, w.window)
	if next > w.markedNext {
		w.sess.MarkOffset(w.topic, w.partition, next, meta)
	} else {
		// Same offset, new metadata: MarkOffset ignores an offset that does
		// not move forward, ResetOffset takes it.
		w.sess.ResetOffset(w.topic, w.partition, next, meta)
	}
	w.markedNext = next
}

// deliver hands one record to the subscriber's channel until it is acked
// or dead-lettered, redelivering it after each Nack. It returns early, with
// the record not done, when the partition is released.
func (w *partitionWorker) deliver(r *record) {
	defer w.wg.Done()
	var (
		attempts int
		first    time.Time
		delay    time.Duration
	)
	for {
		if !sleepCtx(w.ctx, delay) {
			return
		}
		msg, err := w.cfg.Marshaler.Unmarshal(r.rec)
		if err != nil {
			if w.deadLetter(r, reasonUndecodable, err.Error(), attempts, bus.ClassPermanent) {
				w.results <- r
			}
			return
		}
		now := time.Now()
		if first.IsZero() {
			first = now
		}
		ctx, cancel := context.WithCancel(w.ctx)
		ctx = bus.WithDelivery(ctx, bus.Delivery{
			Attempts:         attempts,
			MaxAttempts:      w.cfg.MaxAttempts,
			FirstDeliveredAt: first,
			DeliveredAt:      now,
			Source:           w.topic,
			ID:               strconv.Itoa(int(w.partition)) + "/" + strconv.FormatInt(r.rec.Offset, 10),
			Partition:        w.partition,
			Offset:           r.rec.Offset,
		})
		msg.SetContext(ctx)

		select {
		case w.sub.out <- msg:
		case <-ctx.Done():
			cancel()
			return
		}
		acked := false
		select {
		case <-msg.Acked():
			acked = true
		case <-msg.Nacked():
		case <-ctx.Done():
			cancel()
			// An ack that raced with the release still counts: it is
			// marked before the partition is let go.
			select {
			case <-msg.Acked():
				w.results <- r
			default:
			}
			return
		}
		cancel() // the message is settled: its context ends
		if acked {
			w.results <- r
			return
		}

		s, settled := bus.SettlementFromContext(ctx)
		if settled && s.GiveUp {
			spent := attempts
			if s.Class == bus.ClassCounted {
				spent++
			}
			if w.deadLetter(r, reasonGaveUp, s.Error, spent, s.Class) {
				w.results <- r
			}
			return
		}
		if !settled || s.Class != bus.ClassTransient {
			attempts++
		}
		delay = w.cfg.NackDelay
		if settled && !s.RetryAt.IsZero() {
			delay = max(time.Until(s.RetryAt), 0)
		}
		w.log.Debug("kafka record nacked; delivering again",
			"offset", r.rec.Offset, "attempts", attempts, "delay", delay, "settled", settled)
	}
}
