package processors

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	wmw "github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/middleware"
	"github.com/omnibus-go/omnibus/transports/postgres"
)

// DefaultDispatcherHandlerName names the dispatcher's router handler.
const DefaultDispatcherHandlerName = "omnibus_dispatcher"

// UnknownTypePolicy says what the Dispatcher does with a message whose event
// type has no handler.
type UnknownTypePolicy int

const (
	// UnknownFail (the default) fails the message at once (a permanent
	// failure): its row becomes failed with a reason naming the type, and
	// can be requeued once a handler exists.
	UnknownFail UnknownTypePolicy = iota
	// UnknownSkip completes the message without handling it.
	UnknownSkip
	// UnknownFallback hands it to DispatcherConfig.Fallback.
	UnknownFallback
)

func (p UnknownTypePolicy) String() string {
	switch p {
	case UnknownFail:
		return "fail"
	case UnknownSkip:
		return "skip"
	case UnknownFallback:
		return "fallback"
	}
	return fmt.Sprintf("UnknownTypePolicy(%d)", int(p))
}

// ErrUnknownEventType is wrapped by the (permanent) error of a message whose
// event type has no handler under the UnknownFail policy.
var ErrUnknownEventType = errors.New("no handler for event type")

// UnknownEventTypeError names the event type that has no handler.
type UnknownEventTypeError struct{ EventType string }

func (e *UnknownEventTypeError) Error() string {
	if e.EventType == "" {
		return ErrUnknownEventType.Error() + " (the message has no event_type)"
	}
	return fmt.Sprintf("%s %q", ErrUnknownEventType, e.EventType)
}

func (e *UnknownEventTypeError) Unwrap() error { return ErrUnknownEventType }

// DecodeError is the (permanent) error of a payload that does not decode
// into its handler's type.
type DecodeError struct {
	EventType string
	Type      string // the Go type
	Err       error
}

func (e *DecodeError) Error() string {
	return fmt.Sprintf("decode %q payload into %s: %v", e.EventType, e.Type, e.Err)
}

func (e *DecodeError) Unwrap() error { return e.Err }

// DispatcherConfig configures a Dispatcher.
type DispatcherConfig struct {
	// Subscriber configures the fetch over the inbox table: Table and
	// ConsumerGroup (required), BatchSize, RunLength, Lease, … Kind is always
	// KindInbox.
	Subscriber postgres.SubscriberConfig
	// Topic restricts the dispatcher to the rows of one source topic.
	// Default postgres.AllTopics.
	Topic string
	// UnknownType is the policy for event types without a handler. Default UnknownFail.
	UnknownType UnknownTypePolicy
	// Fallback handles messages of unknown types under UnknownFallback
	// (required then, not allowed otherwise).
	Fallback func(ctx context.Context, msg *message.Message) error
	// Transactional runs each handler inside a transaction that also marks
	// the message's inbox row completed: the handler's writes made with
	// postgres.TxFromContext(ctx) commit together with the completion, or
	// not at all (exactly-once effects). Each handler then holds a pool
	// connection while it runs.
	Transactional bool
	// SQLDB, with Transactional, begins each handler's transaction on this
	// database/sql pool instead of the pgx pool, for handlers whose data layer
	// is database/sql, sqlx, GORM, bun or ent: they get the *sql.Tx with
	// postgres.SQLTxFromContext(ctx), and the message's inbox row is
	// completed in it. It must reach the database of the inbox (pgx's stdlib
	// driver or lib/pq). Setting it without Transactional is an error.
	SQLDB *sql.DB
	// Retry configures the retry decisions. The attempt budget of each row
	// is the row's own max_attempts.
	Retry middleware.RetryConfig
	// Timeout bounds one handler call. Default middleware.DefaultTimeout (30 s).
	Timeout time.Duration
	// Breaker configures the circuit breaker around the handlers: after
	// FailureThreshold failures in a row, messages fail fast as transient
	// (no attempts spent) until a probe succeeds.
	Breaker middleware.CircuitBreakerConfig
	// HandlerName names the router handler. Default DefaultDispatcherHandlerName.
	HandlerName string
	// DeadLetter, when set, publishes the messages given up on (a permanent
	// failure, or the attempts spent) to its topic and completes their
	// rows, instead of leaving them failed in the inbox. Nil: they stay
	// failed (omnibus inbox failed / requeue).
	DeadLetter *middleware.DeadLetter
}

// Dispatcher handles the messages stored in an inbox by one consumer group:
// postgres Subscriber over the inbox table (head-of-key: in order per
// (source topic, partition key), a failing message holding its key back) →
// the handler registered for the message's event type, with the payload
// decoded from JSON → chain of Retry, Recoverer, Timeout and CircuitBreaker.
// Failures are settled durably on the row, with the same backoff and attempt
// budget as the outbox.
//
// Register handlers with Handle before the dispatcher runs.
type Dispatcher struct {
	pool    *pgxpool.Pool
	cfg     DispatcherConfig
	log     *slog.Logger
	sub     *postgres.Subscriber
	retry   *middleware.Retry
	breaker *middleware.CircuitBreaker

	mu     sync.RWMutex
	routes map[string]route
}

// route prepares the call of one message: it decodes the payload and returns
// the call to make, or a (permanent) decode error.
type route func(msg *message.Message) (func(ctx context.Context) error, error)

// NewDispatcher validates cfg and builds the dispatcher over pool. A nil
// logger means no logging.
func NewDispatcher(pool *pgxpool.Pool, cfg DispatcherConfig, logger *slog.Logger) (*Dispatcher, error) {
	if pool == nil {
		return nil, errors.New("invalid config: pool: must not be nil")
	}
	if cfg.Topic == "" {
		cfg.Topic = postgres.AllTopics
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = middleware.DefaultTimeout
	}
	if cfg.HandlerName == "" {
		cfg.HandlerName = DefaultDispatcherHandlerName
	}
	switch {
	case cfg.Timeout < 0:
		return nil, fmt.Errorf("invalid config: Timeout: must not be negative, got %s", cfg.Timeout)
	case cfg.UnknownType < UnknownFail || cfg.UnknownType > UnknownFallback:
		return nil, fmt.Errorf("invalid config: UnknownType: unknown policy %d", cfg.UnknownType)
	case cfg.UnknownType == UnknownFallback && cfg.Fallback == nil:
		return nil, errors.New("invalid config: Fallback: required with UnknownFallback")
	case cfg.SQLDB != nil && !cfg.Transactional:
		return nil, errors.New("invalid config: SQLDB: set, but Transactional is false (SQLDB is where the handlers' transactions begin)")
	case cfg.UnknownType != UnknownFallback && cfg.Fallback != nil:
		return nil, fmt.Errorf("invalid config: Fallback: set, but UnknownType is %s (want UnknownFallback)", cfg.UnknownType)
	}
	cfg.Subscriber.Kind = postgres.KindInbox
	log := bus.LoggerOrNop(logger)
	retry, err := middleware.NewRetry(cfg.Retry, log)
	if err != nil {
		return nil, fmt.Errorf("dispatcher retry: %w", err)
	}
	breaker, err := middleware.NewCircuitBreaker(cfg.Breaker, log)
	if err != nil {
		return nil, fmt.Errorf("dispatcher breaker: %w", err)
	}
	sub, err := postgres.NewSubscriber(pool, cfg.Subscriber, log)
	if err != nil {
		return nil, fmt.Errorf("dispatcher subscriber: %w", err)
	}
	cfg.Subscriber = sub.Config()
	return &Dispatcher{
		pool: pool, cfg: cfg, sub: sub, retry: retry, breaker: breaker,
		log:    log.With("table", cfg.Subscriber.Table, "consumer_group", cfg.Subscriber.ConsumerGroup),
		routes: map[string]route{},
	}, nil
}

// Handle registers fn for the messages of eventType on d. Each payload is
// decoded from JSON into a new T before fn is called; a payload that does
// not decode is a permanent failure (*DecodeError) and fn is not called.
// With the Transactional option, ctx carries the transaction
// (postgres.TxFromContext). fn's error is classified as usual (bus.Permanent,
// bus.Transient, bus.RetryAt; counted by default).
//
// Handle panics if eventType is empty, fn is nil, or eventType already has a
// handler: these are programming errors, like a duplicate http.ServeMux
// pattern.
func Handle[T any](d *Dispatcher, eventType string, fn func(ctx context.Context, ev T, msg *message.Message) error) {
	if eventType == "" {
		panic("processors.Handle: empty event type")
	}
	if fn == nil {
		panic(fmt.Sprintf("processors.Handle: nil handler for %q", eventType))
	}
	typeName := fmt.Sprintf("%T", *new(T))
	r := func(msg *message.Message) (func(ctx context.Context) error, error) {
		var ev T
		if err := json.Unmarshal(msg.Payload, &ev); err != nil {
			return nil, bus.Permanent(&DecodeError{EventType: eventType, Type: typeName, Err: err})
		}
		return func(ctx context.Context) error { return fn(ctx, ev, msg) }, nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, dup := d.routes[eventType]; dup {
		panic(fmt.Sprintf("processors.Handle: event type %q already has a handler", eventType))
	}
	d.routes[eventType] = r
}

// EventTypes returns the event types that have a handler, sorted.
func (d *Dispatcher) EventTypes() []string {
	d.mu.RLock()
	defer d.mu.RUnlock()
	out := make([]string, 0, len(d.routes))
	for t := range d.routes {
		out = append(out, t)
	}
	slices.Sort(out)
	return out
}

// Subscriber returns the dispatcher's postgres subscriber.
func (d *Dispatcher) Subscriber() *postgres.Subscriber { return d.sub }

// Breaker returns the dispatcher's circuit breaker.
func (d *Dispatcher) Breaker() *middleware.CircuitBreaker { return d.breaker }

// prepare finds the handler of msg and decodes its payload. run is nil when
// the message is to be completed without a call (UnknownSkip).
func (d *Dispatcher) prepare(msg *message.Message) (run func(ctx context.Context) error, err error) {
	et := bus.EventType(msg)
	d.mu.RLock()
	r, ok := d.routes[et]
	d.mu.RUnlock()
	if ok {
		return r(msg)
	}
	switch d.cfg.UnknownType {
	case UnknownSkip:
		d.log.Debug("omnibus: no handler for event type; skipped", "event_type", et, "event_id", bus.EventID(msg))
		return nil, nil
	case UnknownFallback:
		return func(ctx context.Context) error { return d.cfg.Fallback(ctx, msg) }, nil
	}
	return nil, bus.Permanent(&UnknownEventTypeError{EventType: et})
}

// Dispatch routes one message to its handler with msg.Context() — decoding,
// the unknown-type policy — without the chain and without a transaction of
// its own. It is what Handle runs, and it serves as the Inline handler of an
// InboxIngest (which supplies the transaction).
func (d *Dispatcher) Dispatch(msg *message.Message) error {
	run, err := d.prepare(msg)
	if err != nil || run == nil {
		return err
	}
	return run(msg.Context())
}

// HandleMessage is the router handler: it dispatches msg and, with the
// Transactional option, runs the handler in a transaction that also
// completes msg's inbox row, committed before the message is acked.
func (d *Dispatcher) HandleMessage(msg *message.Message) error {
	run, err := d.prepare(msg)
	if err != nil || run == nil {
		return err
	}
	if !d.cfg.Transactional {
		return run(msg.Context())
	}
	if d.cfg.SQLDB != nil {
		return d.handleInSQLTx(msg, run)
	}
	ctx := msg.Context()
	tx, err := d.pool.Begin(ctx)
	if err != nil {
		return bus.Transient(fmt.Errorf("dispatch %s: begin: %w", msg.UUID, err))
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = tx.Rollback(rctx) // a no-op after Commit
	}()
	if err := run(postgres.WithTx(ctx, tx)); err != nil {
		return err
	}
	if err := d.sub.CompleteInTx(ctx, tx, msg); err != nil {
		return bus.Transient(fmt.Errorf("dispatch %s: %w", msg.UUID, err))
	}
	if err := tx.Commit(ctx); err != nil {
		// If the commit did happen after all, the row is completed and the
		// settlement of this failure finds no lease of ours to touch.
		return bus.Transient(fmt.Errorf("dispatch %s: commit: %w", msg.UUID, err))
	}
	return nil
}

// handleInSQLTx is HandleMessage's transaction on SQLDB.
func (d *Dispatcher) handleInSQLTx(msg *message.Message, run func(context.Context) error) error {
	ctx := msg.Context()
	tx, err := d.cfg.SQLDB.BeginTx(ctx, nil)
	if err != nil {
		return bus.Transient(fmt.Errorf("dispatch %s: begin: %w", msg.UUID, err))
	}
	defer func() { _ = tx.Rollback() }() // a no-op after Commit
	if err := run(postgres.WithSQLTx(ctx, tx)); err != nil {
		return err
	}
	if err := d.sub.CompleteInSQLTx(ctx, tx, msg); err != nil {
		return bus.Transient(fmt.Errorf("dispatch %s: %w", msg.UUID, err))
	}
	if err := tx.Commit(); err != nil {
		return bus.Transient(fmt.Errorf("dispatch %s: commit: %w", msg.UUID, err))
	}
	return nil
}

// Middleware returns the dispatcher's chain, outermost first: DeadLetter
// when configured, then Retry, Recoverer, Timeout, CircuitBreaker.
func (d *Dispatcher) Middleware() []message.HandlerMiddleware {
	var chain []message.HandlerMiddleware
	if d.cfg.DeadLetter != nil {
		chain = append(chain, d.cfg.DeadLetter.Middleware)
	}
	return append(chain,
		d.retry.Middleware,
		wmw.Recoverer,
		middleware.Timeout(d.cfg.Timeout),
		d.breaker.Middleware,
	)
}

// AddTo registers the dispatcher on router. The router runs it; closing the
// router closes the dispatcher's subscriber.
func (d *Dispatcher) AddTo(router *message.Router) *message.Handler {
	h := router.AddConsumerHandler(d.cfg.HandlerName, d.cfg.Topic, d.sub, d.HandleMessage)
	h.AddMiddleware(d.Middleware()...)
	return h
}

// Run runs the dispatcher on a router of its own until ctx ends, then shuts
// down gracefully: in-flight handlers finish (up to the subscriber's
// CloseTimeout) and unstarted rows are released.
func (d *Dispatcher) Run(ctx context.Context) error {
	return runStandalone(ctx, "dispatcher", d.sub.Config().CloseTimeout, d.log, d.AddTo, d.sub.Close)
}

// Close closes the dispatcher's subscriber (when it runs on a user's router,
// the router's Close does this too).
func (d *Dispatcher) Close() error { return d.sub.Close() }
