package middleware

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/omnibus-go/omnibus/bus"
)

// Metadata a DeadLetter adds to the copy it publishes. The copy keeps the
// message's UUID, payload and metadata; these say why and where it came from.
// Published through the omnibus Kafka publisher they become record headers
// of the same names.
const (
	// MetaDeadLetterError is the error text (at most MaxDeadLetterErrorBytes).
	MetaDeadLetterError = bus.KeyDeadLetterError
	// MetaDeadLetterClass is the failure class: counted or permanent.
	MetaDeadLetterClass = bus.KeyDeadLetterClass
	// MetaDeadLetterAttempts is the number of counted attempts spent,
	// including the last one when it was counted; empty when the message
	// carried no bus.Delivery.
	MetaDeadLetterAttempts = bus.KeyDeadLetterAttempts
	// MetaDeadLetterTopic is the topic the message was received from.
	MetaDeadLetterTopic = bus.KeyDeadLetterTopic
	// MetaDeadLetterHandler is the Watermill handler that gave up on it.
	MetaDeadLetterHandler = bus.DeadLetterPrefix + "handler"
	// MetaDeadLetterAt is when it was dead-lettered, RFC 3339 in UTC.
	MetaDeadLetterAt = bus.KeyDeadLetterAt
)

// MaxDeadLetterErrorBytes bounds the error text kept in a dead letter.
const MaxDeadLetterErrorBytes = bus.MaxDeadLetterErrorBytes

// DefaultDeadLetterRetryDelay is how long a message whose dead letter could
// not be published waits before it is tried again.
const DefaultDeadLetterRetryDelay = 5 * time.Second

// DeadLetterConfig configures a DeadLetter.
type DeadLetterConfig struct {
	// Publisher receives the messages given up on. Required. The caller
	// owns it; the DeadLetter never closes it.
	Publisher message.Publisher
	// Topic is the dead-letter topic. Required.
	Topic string
	// RetryDelay is how long a message waits before it is tried again when
	// its dead letter could not be published. Default
	// DefaultDeadLetterRetryDelay.
	RetryDelay time.Duration
}

func (c *DeadLetterConfig) setDefaults() {
	if c.RetryDelay == 0 {
		c.RetryDelay = DefaultDeadLetterRetryDelay
	}
}

// Validate reports the first invalid field.
func (c DeadLetterConfig) Validate() error {
	switch {
	case c.Publisher == nil:
		return errors.New("Publisher: required")
	case strings.TrimSpace(c.Topic) == "":
		return errors.New("Topic: required")
	case c.RetryDelay < 0:
		return fmt.Errorf("RetryDelay: must not be negative, got %s", c.RetryDelay)
	}
	return nil
}

// DeadLetter publishes a message that failed for good to a dead-letter
// topic and lets it be acked, instead of leaving it to its transport (a
// failed outbox or inbox row, the transport's own dead-letter topic).
//
// "For good" is what Retry decided: a settlement with GiveUp (a permanent
// failure, or a counted one that spent the budget); for a message without a
// bus.Delivery, which Retry retries in process, a permanent error or
// ErrBudgetSpent. Every other failure passes through untouched, so place
// DeadLetter outside Retry:
//
//	h.AddMiddleware(dlq.Middleware, retry.Middleware, middleware.Timeout(30*time.Second))
//
// Nothing is lost: when the dead letter cannot be published the message is
// not acked; it fails with a transient error (no attempt spent) and is tried
// again after RetryDelay, and given up on, and dead-lettered, again.
type DeadLetter struct {
	cfg DeadLetterConfig
	log *slog.Logger
	now func() time.Time
}

// NewDeadLetter validates cfg and returns the middleware. A nil logger means
// no logging.
func NewDeadLetter(cfg DeadLetterConfig, logger *slog.Logger) (*DeadLetter, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("invalid config: %w", err)
	}
	return &DeadLetter{cfg: cfg, log: bus.LoggerOrNop(logger), now: time.Now}, nil
}

// Middleware is the message.HandlerMiddleware.
func (d *DeadLetter) Middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		out, err := h(msg)
		if err == nil {
			return out, nil
		}
		st, given := givenUp(msg, err)
		if !given {
			return out, err
		}
		letter := d.letter(msg, st, err)
		if perr := d.cfg.Publisher.Publish(d.cfg.Topic, letter); perr != nil {
			retryAt := d.now().Add(d.cfg.RetryDelay)
			bus.Settle(msg, bus.Settlement{Class: bus.ClassTransient, RetryAt: retryAt, Error: err.Error()})
			d.log.ErrorContext(msg.Context(), "omnibus: dead letter not published; the message will be tried again",
				"event_id", bus.EventID(msg), "dead_letter_topic", d.cfg.Topic, "publish_error", perr,
				"error", err, "retry_at", retryAt)
			return nil, bus.RetryAt(retryAt, bus.Transient(
				fmt.Errorf("publish dead letter of %s to %q: %w (after: %w)", msg.UUID, d.cfg.Topic, perr, err)))
		}
		d.log.WarnContext(msg.Context(), "omnibus: message dead-lettered",
			"event_id", bus.EventID(msg), "dead_letter_topic", d.cfg.Topic, "class", st.Class.String(), "error", err)
		// Metrics, outside, counts it as dead-lettered rather than ok.
		msg.SetContext(context.WithValue(msg.Context(), deadLetteredKey{}, true))
		return nil, nil
	}
}

type deadLetteredKey struct{}

// wasDeadLettered reports whether a DeadLetter published msg.
func wasDeadLettered(msg *message.Message) bool {
	v, _ := msg.Context().Value(deadLetteredKey{}).(bool)
	return v
}

// givenUp reports whether the failure err of msg is final, and its settlement.
func givenUp(msg *message.Message, err error) (bus.Settlement, bool) {
	if st, ok := bus.SettlementOf(msg); ok {
		return st, st.GiveUp
	}
	if _, durable := bus.DeliveryOf(msg); durable {
		return bus.Settlement{}, false // not settled by Retry: the transport decides
	}
	class := bus.ClassOf(err)
	return bus.Settlement{Class: class, GiveUp: true, Error: err.Error()},
		class == bus.ClassPermanent || errors.Is(err, ErrBudgetSpent)
}

// letter copies msg for the dead-letter topic, the reason in its metadata.
func (d *DeadLetter) letter(msg *message.Message, st bus.Settlement, err error) *message.Message {
	letter := msg.Copy()
	letter.SetContext(msg.Context())
	for k := range letter.Metadata {
		if strings.HasPrefix(k, bus.DeadLetterPrefix) {
			delete(letter.Metadata, k) // a letter dead-lettered again says why this time
		}
	}
	text := err.Error()
	if len(text) > MaxDeadLetterErrorBytes {
		text = text[:MaxDeadLetterErrorBytes]
	}
	letter.Metadata.Set(MetaDeadLetterError, strings.ToValidUTF8(text, "\uFFFD"))
	letter.Metadata.Set(MetaDeadLetterClass, st.Class.String())
	if dl, ok := bus.DeliveryOf(msg); ok {
		attempts := dl.Attempts
		if st.Class != bus.ClassTransient {
			attempts++
		}
		letter.Metadata.Set(MetaDeadLetterAttempts, strconv.Itoa(attempts))
	}
	letter.Metadata.Set(MetaDeadLetterTopic, topicOf(msg))
	letter.Metadata.Set(MetaDeadLetterHandler, message.HandlerNameFromCtx(msg.Context()))
	letter.Metadata.Set(MetaDeadLetterAt, d.now().UTC().Format(time.RFC3339Nano))
	return letter
}
