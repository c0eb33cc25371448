package bus

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// Connecting to a broker that is down: the first retry waits
// DefaultConnectBackoff, each next one twice as long, up to
// DefaultConnectBackoffCap.
const (
	DefaultConnectBackoff    = 100 * time.Millisecond
	DefaultConnectBackoffCap = 5 * time.Second
	// DefaultConnectWait bounds how long OpenBroker waits for the first attempt to
	// reach the broker (a dial to a host that drops packets can take much
	// longer) before it returns a Conn that keeps connecting in the background.
	DefaultConnectWait = 5 * time.Second
)

// ErrBrokerUnavailable is wrapped by the errors of a Conn whose broker is not
// connected (yet): a Publish fails with it, marked Transient, so a relay
// spends no attempt while the broker is unreachable.
var ErrBrokerUnavailable = errors.New("broker not connected")

// ConnectBackoff returns the wait before retry n (n ≥ 1) of a connection:
// DefaultConnectBackoff doubled n-1 times, at most DefaultConnectBackoffCap.
func ConnectBackoff(n int) time.Duration {
	d := DefaultConnectBackoff
	for i := 1; i < n && d < DefaultConnectBackoffCap; i++ {
		d *= 2
	}
	return min(d, DefaultConnectBackoffCap)
}

// lazyBroker is the Broker of a Conn: it calls the transport's factory in the
// background until it succeeds, with ConnectBackoff between attempts and a
// log line at Warn for each failed one, and meanwhile serves a Publisher
// whose Publish fails with a transient ErrBrokerUnavailable and Subscribers
// whose subscriptions wait for the broker. This is the one place where
// omnibus copes with a broker that is down at start; once connected, each
// transport's client reconnects by itself.
type lazyBroker struct {
	name    string
	factory BrokerFactory
	cfg     Config
	logger  *slog.Logger

	ctx    context.Context // ends at Close: stops connecting
	cancel context.CancelFunc
	done   chan struct{} // closed when the connector has returned
	ready  chan struct{} // closed once the broker is connected
	first  chan struct{} // closed once the first attempt has ended

	broker atomic.Pointer[connected]

	mu       sync.Mutex
	lastErr  error
	firstErr error // the first attempt's result, while OpenBroker waits for it
	detached bool  // OpenBroker stopped waiting for the first attempt
	closed   bool
}

type connected struct{ b Broker }

// connectBroker starts connecting in the background. parent's values (not
// its cancellation) are passed to the factory.
func connectBroker(parent context.Context, cfg Config, f BrokerFactory, logger *slog.Logger) *lazyBroker {
	ctx, cancel := context.WithCancel(context.WithoutCancel(parent))
	lb := &lazyBroker{
		name: cfg.Broker, factory: f, cfg: cfg, logger: logger,
		ctx: ctx, cancel: cancel,
		done: make(chan struct{}), ready: make(chan struct{}), first: make(chan struct{}),
	}
	go lb.connect()
	return lb
}

func (lb *lazyBroker) connect() {
	defer close(lb.done)
	for n := 1; ; n++ {
		b, err := lb.factory(lb.ctx, lb.cfg, lb.logger)
		if err == nil {
			lb.mu.Lock()
			if lb.closed {
				lb.mu.Unlock()
				_ = b.Close()
				return
			}
			lb.broker.Store(&connected{b})
			lb.lastErr = nil
			close(lb.ready)
			lb.mu.Unlock()
			if n == 1 {
				lb.reportFirst(nil)
			} else {
				lb.logger.Info("omnibus: broker connected", "attempts", n)
			}
			return
		}
		if lb.ctx.Err() != nil { // closing
			if n == 1 {
				lb.reportFirst(err)
			}
			return
		}
		lb.mu.Lock()
		lb.lastErr = err
		lb.mu.Unlock()
		if n == 1 && lb.reportFirst(err) && ClassOf(err) != ClassTransient {
			return // OpenBroker fails with err
		}
		wait := ConnectBackoff(n)
		level := slog.LevelWarn
		if ClassOf(err) != ClassTransient {
			level = slog.LevelError // reachable but refusing us: the config needs a look
		}
		lb.logger.Log(lb.ctx, level, "omnibus: broker unreachable; retrying",
			"attempt", n, "retry_in", wait, "error", RedactDSN(err.Error()))
		t := time.NewTimer(wait)
		select {
		case <-lb.ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// reportFirst records the first attempt's result for OpenBroker and reports
// whether OpenBroker is still waiting for it.
func (lb *lazyBroker) reportFirst(err error) (openWaits bool) {
	lb.mu.Lock()
	openWaits = !lb.detached
	if openWaits {
		lb.firstErr = err
	}
	lb.mu.Unlock()
	close(lb.first)
	return openWaits
}

// awaitFirst waits for the first attempt, for at most wait or until ctx
// ends. It returns the attempt's error when that attempt ended while OpenBroker
// waited; otherwise OpenBroker goes on without it and the connector retries
// whatever the first attempt's outcome.
func (lb *lazyBroker) awaitFirst(ctx context.Context, wait time.Duration) (firstErr error, ctxErr error) {
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-lb.first:
	case <-t.C:
	case <-ctx.Done():
		ctxErr = ctx.Err()
	}
	lb.mu.Lock()
	defer lb.mu.Unlock()
	select {
	case <-lb.first:
		if !lb.detached {
			return lb.firstErr, ctxErr
		}
	default:
	}
	lb.detached = true
	return nil, ctxErr
}

// current returns the connected broker, or the transient error a caller
// gets while there is none.
func (lb *lazyBroker) current() (Broker, error) {
	if c := lb.broker.Load(); c != nil {
		return c.b, nil
	}
	lb.mu.Lock()
	defer lb.mu.Unlock()
	switch {
	case lb.closed:
		return nil, ErrBusClosed
	case lb.lastErr != nil:
		return nil, fmt.Errorf("%w: %s broker: %w", ErrBrokerUnavailable, lb.name, lb.lastErr)
	default:
		return nil, fmt.Errorf("%w: %s broker: still connecting", ErrBrokerUnavailable, lb.name)
	}
}

// wait returns once the broker is connected, ctx ends or the broker is
// closed.
func (lb *lazyBroker) wait(ctx context.Context) error {
	select {
	case <-lb.ready:
		return nil
	default:
	}
	select {
	case <-lb.ready:
		return nil
	case <-lb.ctx.Done():
		return ErrBusClosed
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (lb *lazyBroker) Publisher() message.Publisher { return lazyPublisher{lb} }

func (lb *lazyBroker) Subscriber(group string) (message.Subscriber, error) {
	s := &lazySubscriber{
		lb: lb, group: group, closing: make(chan struct{}),
		logger: lb.logger.With("consumer_group", group),
	}
	if lb.broker.Load() != nil {
		// Connected: errors of the transport's constructor (an unknown
		// group, say) are the caller's to see now.
		if _, err := s.underlying(); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// Close stops connecting (waiting for an attempt in progress to return),
// then closes the broker if it was connected. It is idempotent.
func (lb *lazyBroker) Close() error {
	lb.mu.Lock()
	if lb.closed {
		lb.mu.Unlock()
		return nil
	}
	lb.closed = true
	lb.mu.Unlock()
	lb.cancel()
	<-lb.done
	if c := lb.broker.Load(); c != nil {
		return c.b.Close()
	}
	return nil
}

// lazyPublisher publishes through the broker once it is connected.
type lazyPublisher struct{ lb *lazyBroker }

func (p lazyPublisher) Publish(topic string, msgs ...*message.Message) error {
	b, err := p.lb.current()
	if err != nil {
		return Transient(fmt.Errorf("publish to %q: %w", topic, err))
	}
	return b.Publisher().Publish(topic, msgs...)
}

// Close is a no-op: the broker closes its publisher.
func (lazyPublisher) Close() error { return nil }

// lazySubscriber makes the transport's subscriber once the broker is
// connected. A Subscribe that cannot reach the broker returns a channel at
// once and subscribes in the background, retrying with ConnectBackoff; the
// messages are then passed on unchanged (Ack and Nack go to the transport).
type lazySubscriber struct {
	lb      *lazyBroker
	group   string
	logger  *slog.Logger
	closing chan struct{}
	wg      sync.WaitGroup

	mu     sync.Mutex
	sub    message.Subscriber
	closed bool

	closeOnce sync.Once
	closeErr  error
}

// underlying returns the transport's subscriber, making it on first use; the
// broker must be connected.
func (s *lazySubscriber) underlying() (message.Subscriber, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, ErrBusClosed
	}
	if s.sub != nil {
		return s.sub, nil
	}
	b, err := s.lb.current()
	if err != nil {
		return nil, Transient(err)
	}
	sub, err := b.Subscriber(s.group)
	if err != nil {
		return nil, err // Conn.Subscriber says which broker and group
	}
	s.sub = sub
	return sub, nil
}

func (s *lazySubscriber) subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	sub, err := s.underlying()
	if err != nil {
		return nil, err
	}
	return sub.Subscribe(ctx, topic)
}

// Subscribe subscribes to topic now if the broker answers; otherwise (the
// broker is not connected yet, or the subscription failed with a transient
// error) it returns a channel that the subscription feeds once it succeeds.
// Other errors are returned.
func (s *lazySubscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	if s.lb.broker.Load() != nil {
		ch, err := s.subscribe(ctx, topic)
		if err == nil || ClassOf(err) != ClassTransient {
			return ch, err
		}
		s.logger.Warn("omnibus: subscribe failed; retrying in the background", "topic", topic, "error", RedactDSN(err.Error()))
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, ErrBusClosed
	}
	s.wg.Add(1)
	s.mu.Unlock()
	out := make(chan *message.Message)
	go s.subscribeWhenReachable(ctx, topic, out)
	return out, nil
}

func (s *lazySubscriber) subscribeWhenReachable(ctx context.Context, topic string, out chan<- *message.Message) {
	defer s.wg.Done()
	defer close(out)
	var in <-chan *message.Message
	for n := 1; ; n++ {
		select {
		case <-s.lb.ready:
		case <-s.lb.ctx.Done():
			return
		case <-ctx.Done():
			return
		case <-s.closing:
			return
		}
		ch, err := s.subscribe(ctx, topic)
		if err == nil {
			in = ch
			break
		}
		if errors.Is(err, ErrBusClosed) || ctx.Err() != nil {
			return
		}
		wait := ConnectBackoff(n)
		level := slog.LevelWarn
		if ClassOf(err) != ClassTransient {
			level = slog.LevelError
		}
		s.logger.Log(ctx, level, "omnibus: subscribe failed; retrying",
			"topic", topic, "attempt", n, "retry_in", wait, "error", RedactDSN(err.Error()))
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return
		case <-s.closing:
			t.Stop()
			return
		}
	}
	for msg := range in {
		select {
		case out <- msg:
		case <-ctx.Done():
			msg.Nack() // nobody takes it any more: the transport delivers it again
		case <-s.closing:
			msg.Nack()
		}
	}
}

// SubscribeInitialize passes through to the transport's subscriber once the
// broker is connected; before, it fails with a transient
// ErrBrokerUnavailable.
func (s *lazySubscriber) SubscribeInitialize(topic string) error {
	sub, err := s.underlying()
	if err != nil {
		return err
	}
	if si, ok := sub.(message.SubscribeInitializer); ok {
		return si.SubscribeInitialize(topic)
	}
	return nil
}

// Close ends the subscriptions (waiting ones included) and closes the
// transport's subscriber if it was made. It is idempotent.
func (s *lazySubscriber) Close() error {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closed = true
		sub := s.sub
		s.mu.Unlock()
		close(s.closing)
		if sub != nil {
			s.closeErr = sub.Close()
		}
		s.wg.Wait()
	})
	return s.closeErr
}
