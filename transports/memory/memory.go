package memory

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/omnibus-go/omnibus/bus"
)

func init() {
	bus.Register(bus.Transport{
		Name: bus.BrokerMemory,
		Open: func(_ context.Context, _ bus.Config, logger *slog.Logger) (bus.Broker, error) {
			return NewBroker(logger), nil
		},
	})
}

// Defaults of the memory broker.
const (
	// MaxInFlight is how many messages of a topic one consumer group
	// holds at once: handed out, waiting behind their key or waiting for a
	// retry.
	MaxInFlight = 256
	// NackDelay is the pause before a nacked message is handed out
	// again when its settlement names no retry time.
	NackDelay = 100 * time.Millisecond
	// Source is the bus.Delivery Source of the memory broker's messages.
	Source = "memory"
	// Retention is how long a message is kept after it was published,
	// even when every group acked it, so that a group subscribing a little
	// later (a router starts its handlers concurrently) still receives it.
	Retention = time.Minute
)

// ErrClosed is returned by the memory broker after Close.
var ErrClosed = errors.New("memory broker: closed")

// Broker is the in-process broker registered as "memory": for tests,
// demos and single-process services. It is not shared between processes.
//
// Each topic is a log held in memory. Every consumer group receives every
// message; within a group, messages are spread over the group's
// subscriptions. Messages of one partition key are handed out one at a time,
// in publish order (the next after the previous is acked); different keys
// go out concurrently. A nacked message is handed out again after its
// bus.Settlement's retry time (NackDelay without one), still ahead of
// the later messages of its key, and a counted failure spends an attempt
// (bus.Delivery.Attempts); a settlement that gives up drops the message with
// an error log (there is no dead-letter queue). bus.Delivery is at least once:
// a message in flight when its subscription ends is handed out again.
//
// A message is held for Retention after it was published, and longer
// until every consumer group that has subscribed to its topic acked it. A
// group that subscribes for the first time starts at the oldest message
// still held, so the groups of a service that starts together all see the
// same messages.
type Broker struct {
	logger    *slog.Logger
	retention time.Duration
	closing   chan struct{}
	wg        sync.WaitGroup

	mu     sync.Mutex
	closed bool
	topics map[string]*memTopic
	timers map[*time.Timer]struct{}
}

type memTopic struct {
	name      string
	retention time.Duration
	base      int64 // offset of log[0]
	log       []*message.Message
	times     []time.Time // publish time of each message of log
	groups    map[string]*memGroup
}

type memGroup struct {
	topic     *memTopic
	next      int64          // next offset not yet taken from the log
	committed int64          // every offset below it is acked
	acked     map[int64]bool // acked offsets at or above committed
	held      int            // taken from the log and not acked
	busy      map[string]bool
	parked    map[string][]memItem
	ready     []memItem
	changed   chan struct{} // closed and replaced when ready grows
}

type memItem struct {
	off      int64
	attempts int
	first    time.Time
}

// NewBroker returns an empty memory broker. A nil logger means no
// logging.
func NewBroker(logger *slog.Logger) *Broker {
	return &Broker{
		logger:    bus.LoggerOrNop(logger),
		retention: Retention,
		closing:   make(chan struct{}),
		topics:    map[string]*memTopic{},
		timers:    map[*time.Timer]struct{}{},
	}
}

// Publisher returns the broker itself: Publish appends to the topic's log.
func (b *Broker) Publisher() message.Publisher { return memPublisher{b} }

// Subscriber returns a subscriber receiving as group.
func (b *Broker) Subscriber(group string) (message.Subscriber, error) {
	if group == "" {
		return nil, errors.New("memory broker: a subscriber needs a consumer group")
	}
	return &Subscriber{b: b, group: group, stop: make(chan struct{})}, nil
}

// Close ends every subscription, drops every message and waits for the
// broker's goroutines. It is idempotent.
func (b *Broker) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	close(b.closing)
	for t := range b.timers {
		t.Stop()
	}
	b.timers = nil
	b.topics = nil
	b.mu.Unlock()
	b.wg.Wait()
	return nil
}

// Publish appends copies of msgs to topic's log, in order, and returns. A
// topic bus.ValidateTopic refuses is a permanent error.
func (b *Broker) Publish(topic string, msgs ...*message.Message) error {
	if err := bus.ValidateTopic(topic); err != nil {
		return bus.Permanent(fmt.Errorf("publish to memory topic: %w", err))
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return ErrClosed
	}
	t := b.topicLocked(topic)
	now := time.Now()
	for _, m := range msgs {
		t.log = append(t.log, m.Copy())
		t.times = append(t.times, now)
	}
	for _, g := range t.groups {
		g.pump()
	}
	t.trim(now.Add(-b.retention))
	return nil
}

type memPublisher struct{ b *Broker }

func (p memPublisher) Publish(topic string, msgs ...*message.Message) error {
	return p.b.Publish(topic, msgs...)
}

// Close does nothing: the broker's Close ends it.
func (memPublisher) Close() error { return nil }

func (b *Broker) topicLocked(name string) *memTopic {
	t, ok := b.topics[name]
	if !ok {
		t = &memTopic{name: name, groups: map[string]*memGroup{}, retention: b.retention}
		b.topics[name] = t
	}
	return t
}

func (b *Broker) groupLocked(topic, group string) *memGroup {
	t := b.topicLocked(topic)
	g, ok := t.groups[group]
	if !ok {
		g = &memGroup{
			topic: t, next: t.base, committed: t.base,
			acked: map[int64]bool{}, busy: map[string]bool{}, parked: map[string][]memItem{},
			changed: make(chan struct{}),
		}
		t.groups[group] = g
		g.pump()
	}
	return g
}

func (t *memTopic) at(off int64) *message.Message { return t.log[off-t.base] }

// pump takes messages from the log while the group has room: each becomes
// ready, or waits behind an earlier message of its key.
func (g *memGroup) pump() {
	grew := false
	for g.next < g.topic.base+int64(len(g.topic.log)) && g.held < MaxInFlight {
		it := memItem{off: g.next}
		g.next++
		g.held++
		if key := bus.PartitionKey(g.topic.at(it.off)); key != "" {
			if g.busy[key] {
				g.parked[key] = append(g.parked[key], it)
				continue
			}
			g.busy[key] = true
		}
		g.ready = append(g.ready, it)
		grew = true
	}
	if grew {
		g.signal()
	}
}

func (g *memGroup) signal() {
	close(g.changed)
	g.changed = make(chan struct{})
}

// done settles it as acked (or given up on): the next message of its key
// becomes ready, the committed offset advances, the log is trimmed.
func (g *memGroup) done(it memItem) {
	g.acked[it.off] = true
	for g.acked[g.committed] {
		delete(g.acked, g.committed)
		g.committed++
	}
	g.held--
	if key := bus.PartitionKey(g.topic.at(it.off)); key != "" {
		if q := g.parked[key]; len(q) > 0 {
			g.ready = append(g.ready, q[0])
			if len(q) == 1 {
				delete(g.parked, key)
			} else {
				g.parked[key] = q[1:]
			}
			g.signal()
		} else {
			delete(g.busy, key)
		}
	}
	g.topic.trim(time.Now().Add(-g.topic.retention))
	g.pump()
}

// trim drops the messages every group has acked that were published
// before cutoff.
func (t *memTopic) trim(cutoff time.Time) {
	low := int64(-1)
	for _, g := range t.groups {
		if low < 0 || g.committed < low {
			low = g.committed
		}
	}
	n := int(low - t.base)
	if low < 0 || n <= 0 {
		return
	}
	for i := range n {
		if t.times[i].After(cutoff) {
			n = i
			break
		}
	}
	if n == 0 {
		return
	}
	clear(t.log[:n])
	t.log, t.times = t.log[n:], t.times[n:]
	t.base += int64(n)
}

// Subscriber receives from a Broker as one consumer group.
type Subscriber struct {
	b     *Broker
	group string

	mu     sync.Mutex
	closed bool
	stop   chan struct{}
	wg     sync.WaitGroup
}

// SubscribeInitialize registers the group on topic, so that the messages
// published from now on are held for it even before it subscribes.
func (s *Subscriber) SubscribeInitialize(topic string) error {
	s.b.mu.Lock()
	defer s.b.mu.Unlock()
	if s.b.closed {
		return ErrClosed
	}
	s.b.groupLocked(topic, s.group)
	return nil
}

// Subscribe starts a subscription of the group to topic. The channel is
// closed when ctx ends, the subscriber or the broker is closed.
func (s *Subscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, ErrClosed
	}
	s.b.mu.Lock()
	if s.b.closed {
		s.b.mu.Unlock()
		return nil, ErrClosed
	}
	g := s.b.groupLocked(topic, s.group)
	s.b.wg.Add(2)
	s.b.mu.Unlock()

	ctx, cancel := context.WithCancel(ctx)
	out := make(chan *message.Message)
	s.wg.Add(1)
	go func() {
		defer s.b.wg.Done()
		defer s.wg.Done()
		defer cancel()
		select {
		case <-ctx.Done():
		case <-s.stop:
		case <-s.b.closing:
		}
	}()
	s.wg.Add(1)
	go func() {
		defer s.b.wg.Done()
		defer s.wg.Done()
		defer close(out)
		s.run(ctx, g, out)
	}()
	return out, nil
}

func (s *Subscriber) run(ctx context.Context, g *memGroup, out chan<- *message.Message) {
	var waiters sync.WaitGroup
	defer waiters.Wait()
	for {
		s.b.mu.Lock()
		if s.b.closed {
			s.b.mu.Unlock()
			return
		}
		if len(g.ready) == 0 {
			ch := g.changed
			s.b.mu.Unlock()
			select {
			case <-ch:
				continue
			case <-ctx.Done():
				return
			}
		}
		it := g.ready[0]
		g.ready = g.ready[1:]
		msg := g.topic.at(it.off).Copy()
		s.b.mu.Unlock()

		now := time.Now()
		if it.first.IsZero() {
			it.first = now
		}
		mctx, mcancel := context.WithCancel(ctx)
		msg.SetContext(bus.WithDelivery(mctx, bus.Delivery{
			Attempts: it.attempts, FirstDeliveredAt: it.first, DeliveredAt: now,
			Source: Source, Topic: g.topic.name, ID: strconv.FormatInt(it.off, 10), Offset: it.off,
		}))
		select {
		case out <- msg:
		case <-ctx.Done():
			mcancel()
			s.giveBack(g, it)
			return
		}
		waiters.Add(1)
		go func() {
			defer waiters.Done()
			defer mcancel()
			select {
			case <-msg.Acked():
				s.settle(g, it, nil)
			case <-msg.Nacked():
				s.settle(g, it, msg)
			case <-ctx.Done():
				s.giveBack(g, it)
			}
		}()
	}
}

// giveBack makes a message that was handed out but not settled ready again,
// without spending an attempt.
func (s *Subscriber) giveBack(g *memGroup, it memItem) {
	s.b.mu.Lock()
	defer s.b.mu.Unlock()
	if s.b.closed {
		return
	}
	g.ready = append([]memItem{it}, g.ready...)
	g.signal()
}

// settle applies an ack (nacked nil) or a nack with its settlement.
func (s *Subscriber) settle(g *memGroup, it memItem, nacked *message.Message) {
	s.b.mu.Lock()
	defer s.b.mu.Unlock()
	if s.b.closed {
		return
	}
	if nacked == nil {
		g.done(it)
		return
	}
	st, ok := bus.SettlementOf(nacked)
	if ok && st.GiveUp {
		s.b.logger.Error("memory broker: giving up on message",
			"topic", g.topic.name, "event_id", bus.EventID(nacked), "attempts", it.attempts, "error", st.Error)
		g.done(it)
		return
	}
	if !ok || st.Class != bus.ClassTransient {
		it.attempts++
	}
	delay := NackDelay
	if ok && !st.RetryAt.IsZero() {
		delay = max(time.Until(st.RetryAt), 0)
	}
	var t *time.Timer
	t = time.AfterFunc(delay, func() {
		s.b.mu.Lock()
		defer s.b.mu.Unlock()
		if s.b.closed {
			return
		}
		delete(s.b.timers, t)
		g.ready = append(g.ready, it)
		g.signal()
	})
	s.b.timers[t] = struct{}{}
}

// Close ends the subscriber's subscriptions and waits for them. Messages
// they held are handed out again to the group. It is idempotent.
func (s *Subscriber) Close() error {
	s.mu.Lock()
	if !s.closed {
		s.closed = true
		close(s.stop)
	}
	s.mu.Unlock()
	s.wg.Wait()
	return nil
}
