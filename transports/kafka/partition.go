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
	size  int  // what it counts against the read-ahead (recordSize)
}

// recordOverhead is what a record held in memory costs beyond its key,
// value and headers (the sarama and omnibus structs around them).
const recordOverhead = 256

// recordSize is what rec counts against SubscriberConfig.MaxReadAheadBytes.
func recordSize(rec *sarama.ConsumerMessage) int {
	n := recordOverhead + len(rec.Key) + len(rec.Value)
	for _, h := range rec.Headers {
		if h != nil {
			n += len(h.Key) + len(h.Value)
		}
	}
	return n
}

// partitionWorker hands out the records of one claimed partition. The run
// goroutine reads the claim; one deliver goroutine per record in flight
// hands it out until it is done and then, instead of exiting, takes the next
// record that is free to go, so a busy partition costs no goroutine start
// per record. The bookkeeping below is guarded by mu.
type partitionWorker struct {
	sub       *subscription
	cfg       *SubscriberConfig
	sess      sarama.ConsumerGroupSession
	claim     sarama.ConsumerGroupClaim
	topic     string
	partition int32
	log       *slog.Logger
	minRead   int    // records always read ahead, whatever their size
	dlTopic   string // where this topic's records are dead-lettered ("" = nowhere)

	ctx    context.Context
	values context.Context // ctx's values without its cancellation: the base of each message's context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	ackedBefore ackedSet // acks an earlier owner recorded in the commit metadata (run goroutine only)

	mu sync.Mutex
	// window holds the records read and not yet committable, in offset
	// order; window[0] is the first one not done.
	window   []*record
	held     int                  // bytes of the records in window (recordSize)
	lanes    map[string][]*record // per key: records waiting behind the one in flight
	ready    []*record            // records free to go, waiting for an in-flight slot
	inflight int
	paused   bool
	stopping bool // released: start no more deliveries

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
		lanes:      make(map[string][]*record),
		minRead:    max(4*cfg.MaxInFlight, 16),
		dlTopic:    DeadLetterTopicFor(cfg.DeadLetterTopic, claim.Topic()),
		markedNext: -1,
	}
	if off := claim.InitialOffset(); off >= 0 {
		w.markedNext = off
	}
	w.ctx, w.cancel = context.WithCancel(sess.Context())
	w.values = context.WithoutCancel(w.ctx)
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
		w.mu.Lock()
		w.stopping = true
		w.mu.Unlock()
		w.cancel()
		w.wg.Wait()
		w.mu.Lock()
		w.mark()
		paused, inflight, uncommitted := w.paused, w.inflight, len(w.window)
		w.mu.Unlock()
		if paused {
			w.sub.group.Resume(map[string][]int32{w.topic: {w.partition}})
		}
		w.log.Debug("kafka partition released", "in_flight", inflight, "uncommitted", uncommitted)
	}()

	for {
		select {
		case rec, ok := <-w.claim.Messages():
			if !ok {
				return // revoked, or the session is over
			}
			w.mu.Lock()
			w.add(rec)
			w.throttle()
			w.mu.Unlock()
		case <-tick.C:
			w.mu.Lock()
			w.mark()
			w.mu.Unlock()
		case <-w.ctx.Done():
			return
		}
	}
}

// throttle pauses fetching while the worker holds MaxReadAheadBytes of
// records (and at least minRead records, so large records do not starve
// the in-flight slots) and resumes it when half of that is done. The
// threshold is in bytes and far above one record so that a fetch response
// (up to Consumer.Fetch.Default bytes per partition) does not pause the
// partition each time: sarama resumes a paused partition only with its next
// fetch, and when every partition is paused it sleeps 100 ms first. The
// claim keeps being read, so a revocation is noticed at once; what the
// fetcher had buffered still arrives. Called with mu held.
func (w *partitionWorker) throttle() {
	switch {
	case !w.paused && w.held >= w.cfg.MaxReadAheadBytes && len(w.window) >= w.minRead:
		w.paused = true
		w.sub.group.Pause(map[string][]int32{w.topic: {w.partition}})
	case w.paused && (w.held <= w.cfg.MaxReadAheadBytes/2 || len(w.window) <= w.minRead/2):
		w.paused = false
		w.sub.group.Resume(map[string][]int32{w.topic: {w.partition}})
	}
}

// add takes a record read from the claim. Called with mu held.
func (w *partitionWorker) add(rec *sarama.ConsumerMessage) {
	r := &record{rec: rec, key: string(rec.Key), keyed: len(rec.Key) > 0, size: recordSize(rec)}
	w.window = append(w.window, r)
	w.held += r.size
	if w.ackedBefore.has(rec.Offset) {
		// Acked by the previous owner: it only has to leave the window in
		// order. Its key's earlier records were acked before it was.
		r.done = true
		w.advance()
		return
	}
	if r.keyed {
		if waiting, busy := w.lanes[r.key]; busy {
			w.lanes[r.key] = append(waiting, r)
			return
		}
		w.lanes[r.key] = nil
	}
	w.ready = append(w.ready, r)
	for !w.stopping && w.inflight < w.cfg.MaxInFlight && len(w.ready) > 0 {
		w.inflight++
		w.wg.Add(1)
		go w.deliverLoop(w.popReady())
	}
}

func (w *partitionWorker) popReady() *record {
	r := w.ready[0]
	w.ready[0] = nil
	w.ready = w.ready[1:]
	return r
}

// deliverLoop delivers r, then the next record free to go, until there is
// none or the partition is released.
func (w *partitionWorker) deliverLoop(r *record) {
	defer w.wg.Done()
	for r != nil {
		if !w.deliver(r) {
			return
		}
		r = w.finish(r)
	}
}

// finish marks r done, frees its key and returns the next record for this
// goroutine to deliver, or nil when its in-flight slot is to be released.
func (w *partitionWorker) finish(r *record) *record {
	w.mu.Lock()
	defer w.mu.Unlock()
	r.done = true
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
	w.throttle()
	if !w.stopping && len(w.ready) > 0 {
		return w.popReady()
	}
	w.inflight--
	return nil
}

// advance drops the done records at the head of the window. Called with mu
// held.
func (w *partitionWorker) advance() {
	i := 0
	for i < len(w.window) && w.window[i].done {
		w.lastDone, w.hasDone = w.window[i].rec.Offset, true
		w.held -= w.window[i].size
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
// its own schedule and when the partition is released. Called with mu held.
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

// deliveryID is a delivery's ID: "partition/offset".
func (w *partitionWorker) deliveryID(offset int64) string {
	var b [32]byte
	id := strconv.AppendInt(b[:0], int64(w.partition), 10)
	id = append(id, '/')
	return string(strconv.AppendInt(id, offset, 10))
}

// deliver hands one record to the subscriber's channel until it is acked
// or dead-lettered, redelivering it after each Nack, and reports true. It
// reports false, the record not done, when the partition is released first.
func (w *partitionWorker) deliver(r *record) bool {
	var (
		attempts int
		first    time.Time
		delay    time.Duration
	)
	for {
		if !sleepCtx(w.ctx, delay) {
			return false
		}
		msg, err := w.cfg.Marshaler.Unmarshal(r.rec)
		if err != nil {
			return w.deadLetter(r, reasonUndecodable, err.Error(), attempts, bus.ClassPermanent)
		}
		now := time.Now()
		if first.IsZero() {
			first = now
		}
		// The delivery's context ends when it is settled or the partition
		// is released (every way out below settles it), without a
		// registration with w.ctx per message.
		ctx := bus.NewSettledContext(w.values, bus.Delivery{
			Attempts:         attempts,
			MaxAttempts:      w.cfg.MaxAttempts,
			FirstDeliveredAt: first,
			DeliveredAt:      now,
			Source:           w.topic,
			Topic:            w.topic,
			ID:               w.deliveryID(r.rec.Offset),
			Partition:        w.partition,
			Offset:           r.rec.Offset,
			DeadLetter:       w.dlTopic,
		})
		msg.SetContext(ctx)

		select {
		case w.sub.out <- msg:
		case <-w.ctx.Done():
			ctx.Settle()
			return false
		}
		acked := false
		select {
		case <-msg.Acked():
			acked = true
		case <-msg.Nacked():
		case <-w.ctx.Done():
			ctx.Settle()
			// An ack that raced with the release still counts: it is
			// marked before the partition is let go.
			select {
			case <-msg.Acked():
				return true
			default:
				return false
			}
		}
		ctx.Settle() // the message is settled: its context ends
		if acked {
			return true
		}

		s, settled := bus.SettlementFromContext(ctx)
		if settled && s.GiveUp {
			spent := attempts
			if s.Class == bus.ClassCounted {
				spent++
			}
			return w.deadLetter(r, reasonGaveUp, s.Error, spent, s.Class)
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
