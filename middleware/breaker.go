package middleware

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/omnibus-go/omnibus/bus"
)

// Defaults of CircuitBreakerConfig.
const (
	DefaultFailureThreshold = 5
	DefaultOpenTimeout      = 5 * time.Second
)

// ErrCircuitOpen is returned (marked transient) for messages not handled
// because the breaker is open.
var ErrCircuitOpen = errors.New("circuit breaker open")

// BreakerState is the state of a CircuitBreaker.
type BreakerState int

const (
	BreakerClosed   BreakerState = iota // handling normally
	BreakerOpen                         // failing fast
	BreakerHalfOpen                     // letting one probe through
)

func (s BreakerState) String() string {
	switch s {
	case BreakerOpen:
		return "open"
	case BreakerHalfOpen:
		return "half-open"
	default:
		return "closed"
	}
}

// CircuitBreakerConfig configures a CircuitBreaker.
type CircuitBreakerConfig struct {
	// FailureThreshold is how many different messages failing in a row (no
	// success in between) open the breaker. Default DefaultFailureThreshold.
	FailureThreshold int
	// OpenTimeout is how long the breaker stays open before it lets one probe
	// through. Default DefaultOpenTimeout.
	OpenTimeout time.Duration
	// OnStateChange, if set, is called on every transition (for metrics).
	OnStateChange func(from, to BreakerState)
}

func (c *CircuitBreakerConfig) setDefaults() {
	if c.FailureThreshold == 0 {
		c.FailureThreshold = DefaultFailureThreshold
	}
	if c.OpenTimeout == 0 {
		c.OpenTimeout = DefaultOpenTimeout
	}
}

// Validate reports the first invalid field.
func (c CircuitBreakerConfig) Validate() error {
	switch {
	case c.FailureThreshold < 1:
		return fmt.Errorf("FailureThreshold: must be at least 1, got %d", c.FailureThreshold)
	case c.OpenTimeout < 0:
		return fmt.Errorf("OpenTimeout: must not be negative, got %s", c.OpenTimeout)
	}
	return nil
}

// CircuitBreaker protects a failing target. When FailureThreshold different
// messages have failed in a row (no success in between; permanent failures,
// which are the message's fault, do not count, and one message failing again
// counts once) it opens: messages are not handled and fail with a transient
// ErrCircuitOpen, so no attempts are spent on messages that were never tried
// while the target is down. After OpenTimeout one probe goes through; its
// success closes the breaker, its failure opens it again.
//
// The breaker never changes the class of a failure it let through: a message
// that was attempted and failed is counted (DESIGN §3), so a poison message
// reaches its max attempts whether or not the breaker opened, and a single
// poison message failing again and again never opens it.
type CircuitBreaker struct {
	cfg CircuitBreakerConfig
	log *slog.Logger
	now func() time.Time

	mu       sync.Mutex
	state    BreakerState
	failing  map[string]struct{} // messages that failed since the last success
	openedAt time.Time
	probing  bool
}

// NewCircuitBreaker validates cfg and returns a breaker. A nil logger means no logging.
func NewCircuitBreaker(cfg CircuitBreakerConfig, logger *slog.Logger) (*CircuitBreaker, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("invalid config: %w", err)
	}
	return &CircuitBreaker{cfg: cfg, log: bus.LoggerOrNop(logger), now: time.Now, failing: map[string]struct{}{}}, nil
}

// State returns the current state.
func (b *CircuitBreaker) State() BreakerState {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.state
}

// Middleware is the message.HandlerMiddleware.
func (b *CircuitBreaker) Middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		probe, ok := b.admit()
		if !ok {
			return nil, bus.Transient(ErrCircuitOpen)
		}
		defer func() {
			// A panic failed the attempt (the Recoverer outside turns it
			// into an error): record it, so a panicking probe does not keep
			// the probe slot forever, and pass it on.
			if p := recover(); p != nil {
				b.record(probe, msg.UUID, fmt.Errorf("panic: %v", p))
				panic(p)
			}
		}()
		out, err := h(msg)
		b.record(probe, msg.UUID, err)
		return out, err
	}
}

func (b *CircuitBreaker) admit() (probe, ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.state {
	case BreakerClosed:
		return false, true
	case BreakerOpen:
		if b.now().Sub(b.openedAt) < b.cfg.OpenTimeout {
			return false, false
		}
		b.setState(BreakerHalfOpen)
		fallthrough
	default: // half-open
		if b.probing {
			return false, false
		}
		b.probing = true
		return true, true
	}
}

func (b *CircuitBreaker) record(probe bool, id string, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if probe {
		b.probing = false
	}
	if err == nil || bus.ClassOf(err) == bus.ClassPermanent {
		clear(b.failing)
		if b.state != BreakerClosed && (probe || err == nil) {
			b.setState(BreakerClosed)
		}
		return
	}
	if len(b.failing) < b.cfg.FailureThreshold {
		b.failing[id] = struct{}{}
	}
	switch {
	case b.state == BreakerHalfOpen && probe:
		b.openedAt = b.now()
		b.setState(BreakerOpen)
	case b.state == BreakerClosed && len(b.failing) >= b.cfg.FailureThreshold:
		b.openedAt = b.now()
		b.setState(BreakerOpen)
		b.log.Warn("omnibus: circuit breaker opened", "failed_messages", len(b.failing), "error", err)
	}
}

func (b *CircuitBreaker) setState(s BreakerState) {
	if s == b.state {
		return
	}
	from := b.state
	b.state = s
	if b.cfg.OnStateChange != nil {
		b.cfg.OnStateChange(from, s)
	}
}
