package postgres

import (
	"context"
	"time"
)

// flusher gathers settlements and lane releases from every subscription of a
// Subscriber and writes them in batches: one UPDATE for the rows, then one
// reconciliation of the lanes whose runs ended. The order matters: a lane is
// reconciled only after the settlements of its rows are written.
type flusher struct {
	s    *Subscriber
	in   chan flushItem
	stop chan struct{} // closed when no subscription will send again
	done chan struct{}
}

type flushItem struct {
	op   settleOp
	lane *laneKey
	last int64 // for a lane: the highest id its fetch handed out, 0 if none
	// drained: for a lane, its last run was all acked and held every row in
	// line when it was picked, so the lane is most likely empty now.
	drained bool
	done    chan struct{} // a barrier: closed once what came before it is written
}

func newFlusher(s *Subscriber) *flusher {
	return &flusher{
		s:    s,
		in:   make(chan flushItem, 4*s.cfg.SettleBatch),
		stop: make(chan struct{}),
		done: make(chan struct{}),
	}
}

func (f *flusher) settle(op settleOp) { f.in <- flushItem{op: op} }

// lane gives back a lane whose run ended; last is the highest id of rows
// its fetch handed out (0 for none), which lets the lane's floor move, and
// drained says the lane is most likely empty (engine.reconcile).
func (f *flusher) lane(k laneKey, last int64, drained bool) {
	f.in <- flushItem{lane: &k, last: last, drained: drained}
}

// written returns once everything handed to the flusher before the call is
// written (or CloseTimeout has passed trying). A subscription calls it
// before it closes its channel: a Watermill router closes its subscribers
// without waiting for them, so this is how Router.Close comes to return
// only after the settlements of what its handlers acked are written.
func (f *flusher) written() {
	done := make(chan struct{})
	f.in <- flushItem{done: done}
	<-done
}

func (f *flusher) run() {
	defer f.s.wg.Done()
	defer close(f.done)
	var (
		ops      []settleOp
		lanes    []laneKey
		lasts    = map[laneKey]int64{}
		drained  = map[laneKey]bool{}
		timer    = time.NewTimer(time.Hour)
		armed    bool
		failures int
		held     int // consecutive flushes that found lanes a writer holds
	)
	timer.Stop()
	arm := func(d time.Duration) {
		if !armed {
			timer.Reset(d)
			armed = true
		}
	}
	flush := func(ctx context.Context) bool {
		if len(ops) > 0 {
			start := time.Now()
			_, err := f.s.eng.settleIsolating(ctx, ops, f.s.log.Error)
			f.s.observeSettle(len(ops), time.Since(start), err)
			if err != nil {
				f.s.log.Error("omnibus: writing settlements failed; will retry", "error", err, "rows", len(ops))
				return false
			}
			ops = ops[:0]
		}
		if len(lanes) > 0 {
			retry, ready, err := f.s.eng.reconcile(ctx, lanes, lasts, drained)
			if err != nil {
				f.s.log.Error("omnibus: releasing lanes failed; will retry", "error", err, "lanes", len(retry))
			}
			keep := make(map[laneKey]bool, len(retry))
			for _, k := range retry {
				keep[k] = true
			}
			for _, k := range lanes {
				if !keep[k] {
					f.s.tracked.removeLane(k)
					delete(lasts, k)
					delete(drained, k)
				}
			}
			lanes = append(lanes[:0], retry...)
			if ready > 0 {
				f.s.wakeAll()
			}
			if err != nil {
				return false
			}
		}
		return true
	}
	// drain writes what is gathered, retrying until ctx ends. Rows whose
	// settlement cannot be written keep their lease and are delivered again
	// after it expires: at least once, never lost.
	drain := func(ctx context.Context) bool {
		for attempt := 1; ; attempt++ {
			if flush(ctx) && len(lanes) == 0 {
				return true
			}
			select {
			case <-ctx.Done():
				return false
			case <-time.After(backoffDelay(attempt)):
			}
		}
	}
	add := func(it flushItem) {
		if it.done != nil {
			// Everything before the barrier has been added: write it.
			ctx, cancel := context.WithTimeout(context.Background(), f.s.cfg.CloseTimeout)
			if !drain(ctx) {
				f.s.log.Error("omnibus: could not write settlements before the subscription ended; they are tried again",
					"rows", len(ops), "lanes", len(lanes))
			}
			cancel()
			close(it.done)
			return
		}
		if it.lane != nil {
			lanes = append(lanes, *it.lane)
			if it.last > lasts[*it.lane] {
				lasts[*it.lane] = it.last
			}
			if it.drained {
				drained[*it.lane] = true
			}
		} else {
			ops = append(ops, it.op)
		}
	}
	for {
		select {
		case it := <-f.in:
			add(it)
			// A full batch is written at once, unless writing is failing:
			// then the backoff timer (armed) decides when to try again.
			if len(ops) >= f.s.cfg.SettleBatch && failures == 0 {
				if armed && !timer.Stop() {
					<-timer.C
				}
				armed = false
				if !flush(context.Background()) {
					failures++
					arm(backoffDelay(failures))
				} else {
					failures = 0
				}
				continue
			}
			arm(f.s.cfg.SettleInterval)
		case <-timer.C:
			armed = false
			if !flush(context.Background()) {
				failures++
				arm(backoffDelay(failures))
				continue
			}
			failures = 0
			if len(lanes) == 0 {
				held = 0
				continue
			}
			// A writer is holding some lanes (it may sit idle in its
			// transaction): try again, backing off up to a second.
			held++
			arm(min(20*time.Millisecond<<min(held-1, 6), time.Second))
		case <-f.stop:
			for drained := false; !drained; {
				select {
				case it := <-f.in:
					add(it)
				default:
					drained = true
				}
			}
			// Write what is left, retrying until CloseTimeout.
			ctx, cancel := context.WithTimeout(context.Background(), f.s.cfg.CloseTimeout+time.Second)
			defer cancel()
			if !drain(ctx) {
				f.s.log.Error("omnibus: gave up writing settlements at close; their rows will be redelivered after the lease",
					"rows", len(ops), "lanes", len(lanes))
			}
			return
		}
	}
}

func backoffDelay(failures int) time.Duration {
	d := 50 * time.Millisecond << min(failures, 5)
	return min(d, time.Second)
}
