package middleware

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/omnibus-go/omnibus/bus"
)

// Defaults of RetryConfig.
const (
	DefaultMaxAttempts    = 6
	DefaultBase           = 10 * time.Second
	DefaultCap            = time.Hour
	DefaultTransientDelay = time.Second
)

// NoDelay as RetryConfig.Base means "retry on the next cycle" (a zero base;
// zero itself means the default).
const NoDelay time.Duration = -1

// RetryConfig configures Retry. Zero values mean the defaults.
type RetryConfig struct {
	// MaxAttempts is the attempt budget when the subscriber does not carry
	// one in the message's Delivery. Default DefaultMaxAttempts (6).
	MaxAttempts int
	// Base is the first backoff step. Default DefaultBase (10 s); NoDelay
	// for none.
	Base time.Duration
	// Cap bounds one backoff step. Default DefaultCap (1 h).
	Cap time.Duration
	// TransientDelay is when a transient failure is probed again. Default
	// DefaultTransientDelay (1 s).
	TransientDelay time.Duration
	// MaxTransientInProcess bounds transient retries of a message that has
	// no durable subscriber behind it (in-process retries only). Default 100.
	MaxTransientInProcess int
}

func (c *RetryConfig) setDefaults() {
	if c.MaxAttempts == 0 {
		c.MaxAttempts = DefaultMaxAttempts
	}
	switch c.Base {
	case 0:
		c.Base = DefaultBase
	case NoDelay:
		c.Base = 0
	}
	if c.Cap == 0 {
		c.Cap = DefaultCap
	}
	if c.TransientDelay == 0 {
		c.TransientDelay = DefaultTransientDelay
	}
	if c.MaxTransientInProcess == 0 {
		c.MaxTransientInProcess = 100
	}
}

// Validate reports the first invalid field (after defaults are applied).
func (c RetryConfig) Validate() error {
	switch {
	case c.MaxAttempts < 1:
		return fmt.Errorf("MaxAttempts: must be at least 1, got %d", c.MaxAttempts)
	case c.Base < 0:
		return fmt.Errorf("Base: must not be negative (use NoDelay for none), got %s", c.Base)
	case c.Cap < 0:
		return fmt.Errorf("Cap: must not be negative, got %s", c.Cap)
	case c.Cap < c.Base:
		return fmt.Errorf("Cap: %s is below Base %s", c.Cap, c.Base)
	case c.TransientDelay < 0:
		return fmt.Errorf("TransientDelay: must not be negative, got %s", c.TransientDelay)
	case c.MaxTransientInProcess < 0:
		return fmt.Errorf("MaxTransientInProcess: must not be negative, got %d", c.MaxTransientInProcess)
	}
	return nil
}

// Retry decides what a handler failure means for its message.
//
// With a durable subscriber (one that puts a bus.Delivery in the message's
// context: the postgres, Kafka and Redis transports) it does not retry in
// process: it records a bus.Settlement on the message — failure class, retry
// time, whether to give up — and returns the error, so the router nacks and
// the subscriber stores the decision. For messages without a Delivery it
// retries in process, waiting the same delays.
type Retry struct {
	cfg RetryConfig
	log *slog.Logger
	now func() time.Time
}

// NewRetry validates cfg and returns the middleware. A nil logger means no logging.
func NewRetry(cfg RetryConfig, logger *slog.Logger) (*Retry, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("invalid config: %w", err)
	}
	return &Retry{cfg: cfg, log: bus.LoggerOrNop(logger), now: time.Now}, nil
}

// Config returns the configuration in effect, defaults applied.
func (r *Retry) Config() RetryConfig { return r.cfg }

// Decide returns the settlement of a delivery d that failed with err at now.
//   - permanent: give up at once.
//   - transient: no attempt spent; retry at the explicit time or after TransientDelay.
//   - counted: one attempt spent; give up when the budget is spent, else retry
//     at the explicit time or after Backoff(d.Attempts).
func (r *Retry) Decide(d bus.Delivery, err error, now time.Time) bus.Settlement {
	st := bus.Settlement{Class: bus.ClassOf(err)}
	if err != nil {
		st.Error = err.Error()
	}
	at, explicit := bus.RetryTime(err)
	switch st.Class {
	case bus.ClassPermanent:
		st.GiveUp = true
	case bus.ClassTransient:
		st.RetryAt = now.Add(r.cfg.TransientDelay)
		if explicit {
			st.RetryAt = at
		}
	default:
		budget := d.MaxAttempts
		if budget <= 0 {
			budget = r.cfg.MaxAttempts
		}
		if d.Attempts+1 >= budget {
			st.GiveUp = true
			return st
		}
		if explicit {
			st.RetryAt = at
			return st
		}
		delay, _ := Backoff(d.Attempts, r.cfg.Base, r.cfg.Cap)
		st.RetryAt = now.Add(delay)
	}
	return st
}

// Middleware is the message.HandlerMiddleware.
func (r *Retry) Middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		d, durable := bus.DeliveryOf(msg)
		if !durable {
			return r.inProcess(h, msg)
		}
		out, err := h(msg)
		if err == nil {
			return out, nil
		}
		st := r.Decide(d, err, r.now())
		bus.Settle(msg, st)
		r.logFailure(msg, d, st, err)
		return nil, err
	}
}

// logFailure writes the one line of a failed delivery: its class, the
// attempts spent, and the retry time or the decision to give up. The
// partition key is logged only when Debug is enabled.
func (r *Retry) logFailure(msg *message.Message, d bus.Delivery, st bus.Settlement, err error) {
	ctx := msg.Context()
	attrs := make([]any, 0, 24)
	attrs = append(attrs, "event_id", bus.EventID(msg), "topic", topicOf(msg), "source", d.Source)
	if h := message.HandlerNameFromCtx(ctx); h != "" {
		attrs = append(attrs, "handler", h)
	}
	if k := bus.PartitionKey(msg); k != "" && r.log.Enabled(ctx, slog.LevelDebug) {
		attrs = append(attrs, "partition_key", k)
	}
	budget := d.MaxAttempts
	if budget <= 0 {
		budget = r.cfg.MaxAttempts
	}
	attrs = append(attrs, "class", st.Class.String(),
		"attempts", d.Attempts+boolInt(st.Class != bus.ClassTransient), "max_attempts", budget, "error", err)
	if !st.GiveUp {
		r.log.InfoContext(ctx, "omnibus: message failed; will retry", append(attrs, "retry_at", st.RetryAt)...)
		return
	}
	if d.DeadLetter != "" {
		attrs = append(attrs, "dead_letter", d.DeadLetter)
	}
	r.log.WarnContext(ctx, "omnibus: message failed for good", attrs...)
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// ErrBudgetSpent wraps the last error of a message retried in process until
// its budget ran out.
var ErrBudgetSpent = errors.New("retry budget spent")

func (r *Retry) inProcess(h message.HandlerFunc, msg *message.Message) ([]*message.Message, error) {
	d := bus.Delivery{MaxAttempts: r.cfg.MaxAttempts}
	transients := 0
	for {
		out, err := h(msg)
		if err == nil {
			return out, nil
		}
		st := r.Decide(d, err, r.now())
		if st.GiveUp {
			if st.Class == bus.ClassPermanent {
				return nil, err
			}
			return nil, fmt.Errorf("%w after %d attempts: %w", ErrBudgetSpent, d.Attempts+1, err)
		}
		if st.Class == bus.ClassTransient {
			if transients++; transients > r.cfg.MaxTransientInProcess {
				return nil, err
			}
		} else {
			d.Attempts++
		}
		wait := time.NewTimer(max(0, st.RetryAt.Sub(r.now())))
		select {
		case <-msg.Context().Done():
			wait.Stop()
			return nil, err
		case <-wait.C:
		}
	}
}
