package redis

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/omnibus-go/omnibus/internal/handout"
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
	values context.Context // ctx's values without its cancellation: the base of each message's context
	cancel context.CancelFunc
	out    chan *message.Message

	// slots holds one token per entry the subscription holds; its capacity is
	// MaxInFlight.
	slots chan struct{}

	mu   sync.Mutex
	held map[string]*entry   // entries read or claimed and not yet settled
	keys map[string][]*entry // OrderByKey: keys with an entry out, and the entries queued behind it

	loops sync.WaitGroup // reader, toucher
	msgs  sync.WaitGroup // deliverer, settler, and goroutines waiting for a delivery or a retry
	ready chan *entry    // entries to hand out (see deliver.go); capacity MaxInFlight

	delivererDone chan struct{}
	handTimer     handout.Timer // the deliverer's, for handOut
	outMu         sync.Mutex
	outNew        []*delivery // handed out, not yet taken by the settler
	settlerIdle   bool        // the settler has nothing out and waits for settlerWake
	settlerWake   chan struct{}

	// fence is the lease of a shard subscription (Shards > 1), nil
	// otherwise; done is closed when a shard subscription has stopped (its
	// out is its group's, which the group closes).
	fence *fence
	done  chan struct{}

	ackMu sync.Mutex
	acks  []string // acked here, queued for the next XACK
	// sending is the acks of the XACK on its way, and ackedLate those
	// confirmed while a reclaim runs (reclaiming): a reclaim that ran in
	// Redis before an XACK returns the entry as if it were idle, and must
	// not hand it out again (see unconfirmedAcks).
	sending    []string
	ackedLate  []string
	reclaiming bool
	ackSignal  chan struct{}
	ackStop    chan struct{}
	ackDone    chan struct{}
}

// entry is a stream entry held by a subscription. Its mutable fields are
// guarded by subscription.mu, except count and first, which only the
// goroutine handing the entry out touches.
type entry struct {
	id     string
	fields fields
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
		s:             s,
		cfg:           &s.cfg,
		client:        s.client,
		logger:        s.logger.With("topic", topic, "stream", stream),
		topic:         topic,
		stream:        stream,
		deadLetter:    s.cfg.deadLetterStream(stream),
		ctx:           ctx,
		values:        context.WithoutCancel(ctx),
		cancel:        cancel,
		out:           make(chan *message.Message),
		slots:         make(chan struct{}, s.cfg.MaxInFlight),
		held:          make(map[string]*entry),
		ready:         make(chan *entry, s.cfg.MaxInFlight),
		delivererDone: make(chan struct{}),
		settlerWake:   make(chan struct{}, 1),
		keys:          make(map[string][]*entry),
		ackSignal:     make(chan struct{}, 1),
		ackStop:       make(chan struct{}),
		ackDone:       make(chan struct{}),
	}
}

func (sub *subscription) run() {
	if sub.done != nil {
		defer close(sub.done)
	} else {
		defer sub.s.subs.Done()
	}
	stop := context.AfterFunc(sub.s.closeCtx, sub.cancel)
	defer stop()
	defer sub.cancel()

	go sub.ackLoop()
	sub.msgs.Add(2)
	go sub.deliverLoop()
	go sub.settleLoop()
	sub.loops.Add(2)
	go sub.readLoop()
	go sub.touchLoop()
	if sub.fence == nil && sub.cfg.OrderByKey {
		sub.loops.Add(1)
		go sub.crowdLoop()
	}

	sub.loops.Wait()
	sub.msgs.Wait()
	close(sub.ackStop)
	<-sub.ackDone
	if sub.fence.valid() {
		sub.handBack()
	}
	if sub.done == nil {
		close(sub.out)
	}
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
