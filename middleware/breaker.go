package middleware

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/sony/gobreaker/v2"

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
// success closes the breaker, its failure opens it again. A handler that
// panics failed; the breaker records it and passes the panic on. A result
// that arrives after the breaker changed state (a slow message let through
// before it opened) is ignored: it says nothing about the target now.
//
// The breaker never changes the class of a failure it let through: a message
// that was attempted and failed is counted (DESIGN §3), so a poison message
// reaches its max attempts whether or not the breaker opened, and a single
// poison message failing again and again never opens it.
//
// The state machine is github.com/sony/gobreaker/v2's.
type CircuitBreaker struct {
	// gobreaker counts consecutive failures, lets one probe through while
	// half-open and ignores results from an earlier generation. What it
	// cannot know is added here: which message failed (a message failing
	// again is reported to it as excluded), and the open period, timed on
	// now because gobreaker reads time.Now itself.
	cfg CircuitBreakerConfig
	log *slog.Logger
	now func() time.Time

	// mu serializes every call into gb, so a check of the fields below and
	// the gobreaker step it leads to are one step. gb calls onStateChange
	// synchronously, under mu.
	mu       sync.Mutex
	gb       *gobreaker.TwoStepCircuitBreaker[struct{}]
	state    BreakerState
	gen      uint64              // bumped on every state change, like gb's generation
	failing  map[string]struct{} // messages that failed in this generation
	openedAt time.Time
}

// errFailedAgain is reported to gobreaker, which excludes it, for a message
// that already failed since the last success.
var errFailedAgain = errors.New("the same message failed again")

// NewCircuitBreaker validates cfg and returns a breaker. A nil logger means no logging.
func NewCircuitBreaker(cfg CircuitBreakerConfig, logger *slog.Logger) (*CircuitBreaker, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("invalid config: %w", err)
	}
	b := &CircuitBreaker{cfg: cfg, log: bus.LoggerOrNop(logger), now: time.Now, failing: map[string]struct{}{}}
	threshold := uint32(min(int64(cfg.FailureThreshold), math.MaxUint32))
	b.gb = gobreaker.NewTwoStepCircuitBreaker[struct{}](gobreaker.Settings{
		MaxRequests: 1, // one probe while half-open
		// The open period is timed here on b.now, before gb is asked: gb
		// turns half-open as soon as it is asked after opening (it has no
		// zero timeout; a non-positive one means 60 s).
		Timeout:       time.Nanosecond,
		ReadyToTrip:   func(c gobreaker.Counts) bool { return c.ConsecutiveFailures >= threshold },
		IsSuccessful:  func(err error) bool { return err == nil || bus.ClassOf(err) == bus.ClassPermanent },
		IsExcluded:    func(err error) bool { return errors.Is(err, errFailedAgain) },
		OnStateChange: b.onStateChange,
	})
	return b, nil
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
		a, ok := b.admit()
		if !ok {
			return nil, bus.Transient(ErrCircuitOpen)
		}
		defer func() {
			// A panic failed the attempt (the Recoverer outside turns it
			// into an error): record it, so a panicking probe does not keep
			// the probe slot forever, and pass it on.
			if p := recover(); p != nil {
				b.record(a, msg.UUID, fmt.Errorf("panic: %v", p))
				panic(p)
			}
		}()
		out, err := h(msg)
		b.record(a, msg.UUID, err)
		return out, err
	}
}

// admission is a message the breaker let through.
type admission struct {
	done  func(error) // reports the result to gb
	gen   uint64      // the generation it was admitted in
	probe bool        // it is the half-open probe
}

func (b *CircuitBreaker) admit() (admission, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.state == BreakerOpen && b.now().Sub(b.openedAt) < b.cfg.OpenTimeout {
		return admission{}, false
	}
	// Refused while half-open with the probe under way (or, on a clock too
	// coarse to see gb's 1 ns timeout pass, still open).
	done, err := b.gb.Allow()
	if err != nil {
		return admission{}, false
	}
	return admission{done: done, gen: b.gen, probe: b.state == BreakerHalfOpen}, true
}

func (b *CircuitBreaker) record(a admission, id string, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if a.gen != b.gen {
		// From before the last state change: gb would ignore it, and asking
		// gb while open would turn it half-open (its timeout is 1 ns).
		return
	}
	if err == nil || bus.ClassOf(err) == bus.ClassPermanent {
		clear(b.failing)
		a.done(err)
		return
	}
	if _, again := b.failing[id]; again && !a.probe {
		a.done(errFailedAgain)
		return
	}
	if len(b.failing) < b.cfg.FailureThreshold {
		b.failing[id] = struct{}{}
	}
	from := b.state
	a.done(err)
	if from == BreakerClosed && b.state == BreakerOpen {
		b.log.Warn("omnibus: circuit breaker opened", "failed_messages", b.cfg.FailureThreshold, "error", err)
	}
}

// onStateChange mirrors gb's state; gb calls it under b.mu.
func (b *CircuitBreaker) onStateChange(_ string, _, to gobreaker.State) {
	from := b.state
	switch to {
	case gobreaker.StateOpen:
		b.state = BreakerOpen
		b.openedAt = b.now()
	case gobreaker.StateHalfOpen:
		b.state = BreakerHalfOpen
	default:
		b.state = BreakerClosed
	}
	b.gen++
	clear(b.failing)
	if b.cfg.OnStateChange != nil {
		b.cfg.OnStateChange(from, b.state)
	}
}
