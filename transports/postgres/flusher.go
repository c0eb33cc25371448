package postgres

import (
	"context"
	"time"
)

// flusher gathers settlements and lane releases from every subscription of a
// Subscriber and writes them in batches, in two stages that run side by
// side: run writes the rows' settlements (one UPDATE per batch) and hands
// the lanes whose runs ended before that batch to giveBack, which gives them
// back (reconciles them) while run writes the next batch. The order that
// matters is kept: a lane is given back only after the settlements of its
// rows are written. (One goroutine doing both was the relay's bottleneck in
// BenchmarkRelayDrain: busy for nearly all of the drain, the settlements
// waited for every give-back.)
type flusher struct {
	s    *Subscriber
	in   chan flushItem
	give chan laneBatch // run → giveBack: lanes whose rows are settled
	stop chan struct{}  // closed when no subscription will send again
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

// laneBatch is what run hands giveBack: lanes to give back, or a barrier
// (done not nil) that giveBack closes once every lane handed before it is
// given back, or ctx has ended trying.
type laneBatch struct {
	lanes   laneSet
	done    chan struct{}
	ctx     context.Context
	closing bool // the last batch: give back what is left, then return
}

// laneSet is the lanes to give back, each with the highest id its fetches
// handed out and whether it is drained (flusher.lane). A lane appears in
// lanes once for each give-back (the tracker counts them).
type laneSet struct {
	lanes   []laneKey
	lasts   map[laneKey]int64
	drained map[laneKey]bool
}

func newLaneSet() laneSet {
	return laneSet{lasts: map[laneKey]int64{}, drained: map[laneKey]bool{}}
}

func (l *laneSet) add(k laneKey, last int64, drained bool) {
	l.lanes = append(l.lanes, k)
	if last > l.lasts[k] {
		l.lasts[k] = last
	}
	if drained {
		l.drained[k] = true
	}
}

// merge moves o's lanes into l.
func (l *laneSet) merge(o laneSet) {
	for _, k := range o.lanes {
		l.add(k, o.lasts[k], o.drained[k])
	}
}

func newFlusher(s *Subscriber) *flusher {
	return &flusher{
		s:    s,
		in:   make(chan flushItem, 4*s.cfg.SettleBatch),
		give: make(chan laneBatch, 16),
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

// run is the first stage: it writes the settlements, and hands giveBack
// the lanes gathered before each batch it wrote.
func (f *flusher) run() {
	defer f.s.wg.Done()
	defer close(f.done)
	gaveBack := make(chan struct{})
	go func() {
		defer close(gaveBack)
		f.giveBack()
	}()
	var (
		ops      []settleOp
		lanes    = newLaneSet()
		timer    = newLazyTimer()
		failures int
	)
	// flush writes the gathered settlements, then hands the lanes gathered
	// so far to giveBack: their rows' settlements came before them.
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
		if len(lanes.lanes) > 0 {
			f.give <- laneBatch{lanes: lanes}
			lanes = newLaneSet()
		}
		return true
	}
	// drain writes what is gathered, retrying until ctx ends. Rows whose
	// settlement cannot be written keep their lease and are delivered again
	// after it expires: at least once, never lost.
	drain := func(ctx context.Context) bool { return retryUntil(ctx, flush) }
	add := func(it flushItem) {
		if it.done != nil {
			// Everything before the barrier has been added: write it, and
			// wait for giveBack to give back its lanes.
			ctx, cancel := context.WithTimeout(context.Background(), f.s.cfg.CloseTimeout)
			if !drain(ctx) {
				f.s.log.Error("omnibus: could not write settlements before the subscription ended; they are tried again",
					"rows", len(ops), "lanes", len(lanes.lanes))
			}
			given := make(chan struct{})
			f.give <- laneBatch{done: given, ctx: ctx}
			<-given
			cancel()
			close(it.done)
			return
		}
		if it.lane != nil {
			lanes.add(*it.lane, it.last, it.drained)
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
				timer.stop()
				if !flush(context.Background()) {
					failures++
					timer.arm(backoffDelay(failures))
				} else {
					failures = 0
				}
				continue
			}
			timer.arm(f.s.cfg.SettleInterval)
		case <-timer.C():
			timer.fired()
			if !flush(context.Background()) {
				failures++
				timer.arm(backoffDelay(failures))
				continue
			}
			failures = 0
		case <-f.stop:
			for drained := false; !drained; {
				select {
				case it := <-f.in:
					add(it)
				default:
					drained = true
				}
			}
			// Write what is left, retrying until CloseTimeout, and give
			// back the lanes in what is left of it.
			ctx, cancel := context.WithTimeout(context.Background(), f.s.cfg.CloseTimeout+time.Second)
			defer cancel()
			if !drain(ctx) {
				f.s.log.Error("omnibus: gave up writing settlements at close; their rows will be redelivered after the lease",
					"rows", len(ops), "lanes", len(lanes.lanes))
			}
			f.give <- laneBatch{ctx: ctx, closing: true}
			<-gaveBack
			return
		}
	}
}

// giveBack is the second stage: it gives back the lanes run hands it, in
// batches of what has queued up meanwhile, and retries the lanes a writer
// holds (or that failed) with a backoff.
func (f *flusher) giveBack() {
	var (
		lanes    = newLaneSet()
		timer    = newLazyTimer()
		failures int
		held     int // consecutive give-backs that found lanes a writer holds
	)
	// reconcile gives back the gathered lanes once; those not given back
	// stay gathered.
	reconcile := func(ctx context.Context) bool {
		if len(lanes.lanes) == 0 {
			return true
		}
		retry, ready, err := f.s.eng.reconcile(ctx, lanes.lanes, lanes.lasts, lanes.drained)
		if err != nil {
			f.s.log.Error("omnibus: releasing lanes failed; will retry", "error", err, "lanes", len(retry))
		}
		keep := make(map[laneKey]bool, len(retry))
		for _, k := range retry {
			keep[k] = true
		}
		for _, k := range lanes.lanes {
			if !keep[k] {
				f.s.tracked.removeLane(k)
				delete(lanes.lasts, k)
				delete(lanes.drained, k)
			}
		}
		lanes.lanes = append(lanes.lanes[:0], retry...)
		if ready > 0 {
			f.s.wakeAll()
		}
		return err == nil
	}
	// drain gives back the gathered lanes, retrying until ctx ends.
	drain := func(ctx context.Context) bool {
		return retryUntil(ctx, func(ctx context.Context) bool { return reconcile(ctx) && len(lanes.lanes) == 0 })
	}
	// next settles the timer after a give-back: a failure backs off, and
	// lanes a writer holds (it may sit idle in its transaction) are tried
	// again, backing off up to a second.
	next := func(ok bool) {
		timer.stop()
		switch {
		case !ok:
			failures++
			timer.arm(backoffDelay(failures))
		case len(lanes.lanes) > 0:
			failures = 0
			held++
			timer.arm(min(20*time.Millisecond<<min(held-1, 6), time.Second))
		default:
			failures, held = 0, 0
		}
	}
	for {
		select {
		case b := <-f.give:
			if b.done == nil && !b.closing {
				lanes.merge(b.lanes)
				// Give back together what queued up meanwhile, up to a
				// barrier, which waits for the lanes before it.
				var barrier *laneBatch
			more:
				for {
					select {
					case b := <-f.give:
						if b.done != nil || b.closing {
							barrier = &b
							break more
						}
						lanes.merge(b.lanes)
					default:
						break more
					}
				}
				if barrier == nil {
					if failures == 0 {
						next(reconcile(context.Background()))
					}
					continue
				}
				b = *barrier // drain gives back what came before it
			}
			if !drain(b.ctx) {
				f.s.log.Error("omnibus: could not give back lanes before the subscription ended; their leases expire",
					"lanes", len(lanes.lanes))
			}
			if b.closing {
				return
			}
			close(b.done)
			next(true)
		case <-timer.C():
			timer.fired()
			next(reconcile(context.Background()))
		}
	}
}

// lazyTimer is a timer that, once armed, keeps its time until it fires or
// is stopped: arming it again meanwhile changes nothing.
type lazyTimer struct {
	t     *time.Timer
	armed bool
}

func newLazyTimer() *lazyTimer {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return &lazyTimer{t: t}
}

func (l *lazyTimer) C() <-chan time.Time { return l.t.C }

// arm sets the timer to fire in d unless it is armed already.
func (l *lazyTimer) arm(d time.Duration) {
	if !l.armed {
		l.t.Reset(d)
		l.armed = true
	}
}

// fired records that the caller received from C.
func (l *lazyTimer) fired() { l.armed = false }

// stop disarms the timer. Since Go 1.23 (the module's go line is newer) a
// receive from C after Stop blocks rather than get a stale value, so there
// is nothing to drain.
func (l *lazyTimer) stop() {
	l.t.Stop()
	l.armed = false
}

// retryUntil calls try until it reports done, backing off between tries,
// or until ctx ends; it reports whether try got done.
func retryUntil(ctx context.Context, try func(context.Context) bool) bool {
	for attempt := 1; ; attempt++ {
		if try(ctx) {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(backoffDelay(attempt)):
		}
	}
}

func backoffDelay(failures int) time.Duration {
	d := 50 * time.Millisecond << min(failures, 5)
	return min(d, time.Second)
}
