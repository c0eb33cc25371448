package pgbench

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/omnibus-go/omnibus/bus"
)

// Countdown counts events towards a target. It remembers when the first
// event started and when the target was reached. It is safe for concurrent
// use.
type Countdown struct {
	target int64
	n      atomic.Int64
	first  atomic.Pointer[time.Time]
	doneAt atomic.Pointer[time.Time]
	done   chan struct{}
}

// NewCountdown returns a Countdown that is done after target hits.
func NewCountdown(target int) *Countdown {
	return &Countdown{target: int64(target), done: make(chan struct{})}
}

// Start records the time of the first event; later calls change nothing.
func (c *Countdown) Start() {
	if c.first.Load() == nil {
		now := time.Now()
		c.first.CompareAndSwap(nil, &now)
	}
}

// First returns the time Start recorded. Start must have been called.
func (c *Countdown) First() time.Time { return *c.first.Load() }

// Hit counts one event; the hit that reaches the target records the time
// and ends Await and Wait.
func (c *Countdown) Hit() {
	if c.n.Add(1) == c.target {
		now := time.Now()
		c.doneAt.Store(&now)
		close(c.done)
	}
}

// Hits returns how many events were counted so far.
func (c *Countdown) Hits() int64 { return c.n.Load() }

// Target returns the number of hits the Countdown waits for.
func (c *Countdown) Target() int64 { return c.target }

// Await blocks until the target is reached and returns when that was and
// true, or returns false once timeout has passed without it.
func (c *Countdown) Await(timeout time.Duration) (time.Time, bool) {
	select {
	case <-c.done:
		return *c.doneAt.Load(), true
	case <-time.After(timeout):
		return time.Time{}, false
	}
}

// Wait blocks until the target is reached and returns when that was; it
// fails the benchmark if that takes longer than timeout.
func (c *Countdown) Wait(b *testing.B, timeout time.Duration) time.Time {
	b.Helper()
	at, ok := c.Await(timeout)
	if !ok {
		b.Fatalf("reached %d of %d in %s", c.Hits(), c.target, timeout)
	}
	return at
}

// Sink is an in-memory message.Publisher that counts down its Countdown by
// one for every message it is given (except those of SkipKey, which it
// counts apart).
type Sink struct {
	*Countdown
	// SkipKey, when set, is a partition key whose messages are counted apart
	// (see Skipped) and do not count down.
	SkipKey string
	// OnPublish, when set, sees every message, before it is counted (for
	// measuring latency).
	OnPublish func(*message.Message)

	skipped atomic.Int64
}

// NewSink returns a Sink whose Countdown is done after target messages.
func NewSink(target int) *Sink { return &Sink{Countdown: NewCountdown(target)} }

// Publish counts msgs; it never fails.
func (s *Sink) Publish(_ string, msgs ...*message.Message) error {
	for _, m := range msgs {
		if s.OnPublish != nil {
			s.OnPublish(m)
		}
		if s.SkipKey != "" && bus.PartitionKey(m) == s.SkipKey {
			s.skipped.Add(1)
			continue
		}
		s.Hit()
	}
	return nil
}

// Close does nothing.
func (s *Sink) Close() error { return nil }

// Skipped returns how many messages of SkipKey the sink was given so far.
func (s *Sink) Skipped() int64 { return s.skipped.Load() }

// Wait blocks until the sink has counted its target of messages and returns
// when that was; it fails the benchmark if that takes longer than timeout.
func (s *Sink) Wait(b *testing.B, timeout time.Duration) time.Time {
	b.Helper()
	at, ok := s.Await(timeout)
	if !ok {
		b.Fatalf("sink got %d of %d messages in %s", s.Hits(), s.Target(), timeout)
	}
	return at
}
