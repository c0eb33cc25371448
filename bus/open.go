package bus

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// ErrBusClosed is returned by a Conn used after Close.
var ErrBusClosed = errors.New("bus: closed")

// OpenOption tunes OpenBroker.
type OpenOption func(*openOptions)

type openOptions struct {
	logger *slog.Logger
}

// WithLogger makes the Conn and its transport log to l. Without it nothing
// is logged.
func WithLogger(l *slog.Logger) OpenOption {
	return func(o *openOptions) { o.logger = l }
}

// Conn is the connection to the broker chosen by configuration, as
// OpenBroker returns it. It publishes with Publisher and receives with
// Subscriber; the same code runs on every broker, so moving a service from
// Redis to Kafka is a change of Config.Broker.
//
// Services call the omnibus package's Open, which opens a Conn and adds the
// PostgreSQL outbox, inbox and processors (bus cannot import PostgreSQL);
// OpenBroker is that first step on its own, for programs that need the
// broker only.
type Conn struct {
	cfg    Config
	broker *lazyBroker
	logger *slog.Logger
	pub    message.Publisher

	mu     sync.Mutex
	subs   []message.Subscriber
	closed bool
}

// OpenBroker validates cfg (defaults applied) and opens the broker it names. It
// fails when the config is invalid (an error wrapping ErrInvalidConfig,
// naming the key), when the broker is not linked into the program (import
// its transport, or transports/all), or when the broker refuses the
// connection for a reason that waiting will not fix (its factory returns an
// error that is not Transient: bad TLS files, say).
//
// A broker that cannot be reached does not fail OpenBroker: writing to the outbox
// must not need the broker. OpenBroker waits for the first attempt to connect (at
// most DefaultConnectWait, or until ctx ends) and then returns a Conn that
// keeps connecting in the background, waiting ConnectBackoff between
// attempts and logging each failed one at Warn with the reason. Until it is
// connected, Publish fails with a Transient error wrapping
// ErrBrokerUnavailable (a relay spends no attempt on it), and subscriptions
// wait for it. WaitBroker waits for the connection. Close the Conn when done.
func OpenBroker(ctx context.Context, cfg Config, opts ...OpenOption) (*Conn, error) {
	var o openOptions
	for _, opt := range opts {
		opt(&o)
	}
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	factory, err := lookupBroker(cfg.Broker)
	if err != nil {
		return nil, err
	}
	if o.logger != nil {
		routeLibraryLogs(o.logger)
	}
	return openWith(ctx, cfg, factory, LoggerOrNop(o.logger).With("broker", cfg.Broker), DefaultConnectWait)
}

// openWith is OpenBroker once the factory is known: it starts connecting and
// waits for the first attempt at most wait.
func openWith(ctx context.Context, cfg Config, factory BrokerFactory, logger *slog.Logger, wait time.Duration) (*Conn, error) {
	lb := connectBroker(ctx, cfg, factory, logger)
	firstErr, ctxErr := lb.awaitFirst(ctx, wait)
	switch {
	case ctxErr != nil:
		_ = lb.Close()
		return nil, fmt.Errorf("open %s broker: %w", cfg.Broker, ctxErr)
	case firstErr != nil && ClassOf(firstErr) != ClassTransient:
		_ = lb.Close()
		return nil, fmt.Errorf("open %s broker: %w", cfg.Broker, firstErr)
	}
	return &Conn{cfg: cfg, broker: lb, logger: logger, pub: sharedPublisher{lb.Publisher()}}, nil
}

// Config returns the configuration the Conn was opened with, defaults applied.
func (b *Conn) Config() Config { return b.cfg }

// BrokerName returns the name of the broker in use ("memory", "kafka", …).
func (b *Conn) BrokerName() string { return b.cfg.Broker }

// Broker returns the Conn's Broker: it connects to the transport in the
// background (see OpenBroker) and hands out the same Publisher and
// Subscribers as the Conn.
func (b *Conn) Broker() Broker { return b.broker }

// WaitBroker returns nil once the broker is connected, ctx's error if ctx
// ends first, or ErrBusClosed when the Conn is closed. OpenBroker does not wait:
// call it where a process should not start without its broker (the relay
// and ingest commands do); meanwhile each failed attempt is logged at Warn.
func (b *Conn) WaitBroker(ctx context.Context) error { return b.broker.wait(ctx) }

// Publisher returns the broker's publisher. It is shared and owned by the
// Conn: its Close is a no-op (so a Watermill router that closes the
// publishers of its handlers does not close it); Conn.Close closes it. While
// the broker is not connected, Publish fails with a Transient error wrapping
// ErrBrokerUnavailable.
func (b *Conn) Publisher() message.Publisher { return b.pub }

// Subscriber returns a new subscriber that receives as consumer group group
// (required): every group receives every message, and within a group each
// message is handled once. The caller may close it (a router does when it
// stops); Conn.Close closes it otherwise. While the broker is not connected,
// a Subscribe returns its channel at once and subscribes when the broker
// answers.
func (b *Conn) Subscriber(group string) (message.Subscriber, error) {
	if group == "" {
		return nil, errors.New("bus: a subscriber needs a consumer group")
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil, ErrBusClosed
	}
	s, err := b.broker.Subscriber(group)
	if err != nil {
		return nil, fmt.Errorf("%s subscriber for group %q: %w", b.cfg.Broker, group, err)
	}
	s = &onceCloser{Subscriber: s}
	b.subs = append(b.subs, s)
	return s, nil
}

// Close closes the subscribers made by Subscriber that are still open,
// then the broker (its publisher, clients and pools). While the broker is
// not connected it stops connecting; an attempt in progress is waited for
// (a dial to a host that drops packets lasts the transport's dial timeout).
// It is idempotent.
func (b *Conn) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	subs := b.subs
	b.subs = nil
	b.mu.Unlock()
	var errs []error
	for _, s := range subs {
		if err := s.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	if err := b.broker.Close(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// sharedPublisher hides Close from those the Conn lends its publisher to.
type sharedPublisher struct{ message.Publisher }

func (sharedPublisher) Close() error { return nil }

// onceCloser makes a subscriber's Close idempotent, whoever calls it first
// (a router, the user, Conn.Close).
type onceCloser struct {
	message.Subscriber
	once sync.Once
	err  error
}

func (s *onceCloser) Close() error {
	s.once.Do(func() { s.err = s.Subscriber.Close() })
	return s.err
}

// SubscribeInitialize passes through to subscribers that have it.
func (s *onceCloser) SubscribeInitialize(topic string) error {
	if si, ok := s.Subscriber.(message.SubscribeInitializer); ok {
		return si.SubscribeInitialize(topic)
	}
	return nil
}
