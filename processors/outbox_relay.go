package processors

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	wmw "github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/middleware"
	"github.com/omnibus-go/omnibus/transports/postgres"
)

// DefaultRelayHandlerName names the relay's router handler.
const DefaultRelayHandlerName = "omnibus_outbox_relay"

// OutboxRelayConfig configures an OutboxRelay.
type OutboxRelayConfig struct {
	// Publisher is the target: every outbox row is published to it under the
	// row's topic. Required. The relay never closes it.
	Publisher message.Publisher
	// Subscriber configures the fetch over the outbox table (Table, BatchSize,
	// RunLength, Lease, …). Kind is always KindOutbox.
	Subscriber postgres.SubscriberConfig
	// Retry configures the retry decisions. The attempt budget of each row is
	// the row's own max_attempts.
	Retry middleware.RetryConfig
	// Timeout bounds one publish. Default middleware.DefaultTimeout (30 s).
	Timeout time.Duration
	// Breaker configures the circuit breaker around the publisher.
	Breaker middleware.CircuitBreakerConfig
	// HandlerName names the router handler. Default DefaultRelayHandlerName.
	HandlerName string
	// Metrics, when set, counts the relayed rows by result and times each
	// publish (it runs outside Retry), and tracks the circuit breaker under
	// the handler's name. Wrap Publisher with Metrics.Publisher for publish
	// latency and in-flight counts per transport. Nil: off.
	Metrics *middleware.Metrics
	// Tracing, when set, publishes each row inside a producer span, a child
	// of the span that enqueued the row, and writes the span's trace context
	// into the published message. Nil: off (the row's own trace context, if
	// any, is still passed on).
	Tracing *middleware.Tracing
	// DeadLetter, when set, publishes the rows given up on (a permanent
	// failure, or the attempts spent) to its topic and completes them,
	// instead of leaving them failed in the table. Nil: they stay failed
	// (omnibus outbox failed / requeue).
	DeadLetter *middleware.DeadLetter
}

// OutboxRelay is a Watermill handler that moves outbox rows to a publisher:
// postgres Subscriber over the outbox (head-of-key, ordered per key) →
// publish under the row's topic, behind Retry, Recoverer, Timeout and
// CircuitBreaker. A broker that is down opens the breaker, so its failures
// are transient and spend no attempts.
type OutboxRelay struct {
	cfg     OutboxRelayConfig
	log     *slog.Logger
	sub     *postgres.Subscriber
	retry   *middleware.Retry
	breaker *middleware.CircuitBreaker
}

// NewOutboxRelay validates cfg and builds the relay over pool. A nil logger
// means no logging.
func NewOutboxRelay(pool *pgxpool.Pool, cfg OutboxRelayConfig, logger *slog.Logger) (*OutboxRelay, error) {
	if cfg.Publisher == nil {
		return nil, errors.New("invalid config: Publisher: required")
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = middleware.DefaultTimeout
	}
	if cfg.Timeout < 0 {
		return nil, fmt.Errorf("invalid config: Timeout: must not be negative, got %s", cfg.Timeout)
	}
	if cfg.HandlerName == "" {
		cfg.HandlerName = DefaultRelayHandlerName
	}
	cfg.Subscriber.Kind = postgres.KindOutbox
	log := bus.LoggerOrNop(logger)
	retry, err := middleware.NewRetry(cfg.Retry, log)
	if err != nil {
		return nil, fmt.Errorf("relay retry: %w", err)
	}
	if cfg.Metrics != nil {
		track, own := cfg.Metrics.BreakerStateChange(cfg.HandlerName), cfg.Breaker.OnStateChange
		cfg.Breaker.OnStateChange = func(from, to middleware.BreakerState) {
			track(from, to)
			if own != nil {
				own(from, to)
			}
		}
	}
	breaker, err := middleware.NewCircuitBreaker(cfg.Breaker, log)
	if err != nil {
		return nil, fmt.Errorf("relay breaker: %w", err)
	}
	sub, err := postgres.NewSubscriber(pool, cfg.Subscriber, log)
	if err != nil {
		return nil, fmt.Errorf("relay subscriber: %w", err)
	}
	return &OutboxRelay{cfg: cfg, log: log, sub: sub, retry: retry, breaker: breaker}, nil
}

// Subscriber returns the relay's postgres subscriber.
func (r *OutboxRelay) Subscriber() *postgres.Subscriber { return r.sub }

// Breaker returns the relay's circuit breaker.
func (r *OutboxRelay) Breaker() *middleware.CircuitBreaker { return r.breaker }

// Handle publishes one outbox message to the target under its row's topic.
func (r *OutboxRelay) Handle(msg *message.Message) error {
	d, ok := bus.DeliveryOf(msg)
	if !ok || d.Topic == "" {
		return bus.Permanent(errors.New("relay: message carries no outbox delivery (is the subscriber the outbox?)"))
	}
	out := message.NewMessage(msg.UUID, msg.Payload)
	for k, v := range msg.Metadata {
		out.Metadata.Set(k, v)
	}
	if r.cfg.Tracing != nil {
		// The producer span becomes the consumers' parent. Without Tracing
		// the row's own trace context goes out unchanged (whatever span the
		// relay's context may carry is not the row's).
		bus.InjectTraceContext(msg.Context(), out.Metadata)
	}
	out.SetContext(msg.Context())
	if err := r.cfg.Publisher.Publish(d.Topic, out); err != nil {
		return fmt.Errorf("publish %s to %q: %w", msg.UUID, d.Topic, err)
	}
	return nil
}

// Middleware returns the relay's chain, outermost first: Tracing, Metrics
// and DeadLetter when configured, then Retry, Recoverer, Timeout,
// CircuitBreaker.
func (r *OutboxRelay) Middleware() []message.HandlerMiddleware {
	var chain []message.HandlerMiddleware
	if r.cfg.Tracing != nil {
		chain = append(chain, r.cfg.Tracing.Producer)
	}
	if r.cfg.Metrics != nil {
		chain = append(chain, r.cfg.Metrics.Middleware)
	}
	if r.cfg.DeadLetter != nil {
		chain = append(chain, r.cfg.DeadLetter.Middleware)
	}
	return append(chain,
		r.retry.Middleware,
		wmw.Recoverer,
		middleware.Timeout(r.cfg.Timeout),
		r.breaker.Middleware,
	)
}

// AddTo registers the relay on router. The router runs it; closing the
// router closes the relay's subscriber.
func (r *OutboxRelay) AddTo(router *message.Router) *message.Handler {
	h := router.AddConsumerHandler(r.cfg.HandlerName, postgres.AllTopics, r.sub, r.Handle)
	h.AddMiddleware(r.Middleware()...)
	return h
}

// Run runs the relay on a router of its own until ctx ends, then shuts down
// gracefully: in-flight publishes finish (up to the subscriber's
// CloseTimeout) and unstarted rows are released.
func (r *OutboxRelay) Run(ctx context.Context) error {
	return runStandalone(ctx, "relay", r.sub.Config().CloseTimeout, r.log, r.AddTo, r.sub.Close)
}

// Close closes the relay's subscriber (when it runs on a user's router, the
// router's Close does this too).
func (r *OutboxRelay) Close() error { return r.sub.Close() }
