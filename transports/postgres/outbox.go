package postgres

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/omnibus-go/omnibus/bus"
)

// Defaults of OutboxConfig.
const (
	DefaultMaxPayloadBytes  = 1 << 20
	DefaultMaxMetadataBytes = 64 << 10
	DefaultMaxAttempts      = 6
	DefaultMaxDeliverAhead  = 365 * 24 * time.Hour
)

// Metadata keys read by Enqueue as per-message options. They are removed from
// the stored metadata: they steer the outbox and are not part of the event.
const (
	// MetaDeliverAt holds an RFC 3339 time before which the event is not
	// delivered. Set it with SetDeliverAt.
	MetaDeliverAt = "omnibus_deliver_at"
	// MetaMaxAttempts holds the event's attempt budget. Set it with SetMaxAttempts.
	MetaMaxAttempts = "omnibus_max_attempts"
)

// SetDeliverAt asks the outbox not to deliver msg before t.
func SetDeliverAt(msg *message.Message, t time.Time) {
	msg.Metadata.Set(MetaDeliverAt, t.UTC().Format(time.RFC3339Nano))
}

// SetMaxAttempts sets the attempt budget of msg (default DefaultMaxAttempts),
// from 1 to bus.MaxAttemptsLimit.
func SetMaxAttempts(msg *message.Message, n int) {
	msg.Metadata.Set(MetaMaxAttempts, strconv.Itoa(n))
}

// OutboxConfig configures an Outbox.
type OutboxConfig struct {
	// Table is the outbox table, optionally schema-qualified. Default DefaultOutboxTable.
	Table string
	// MaxPayloadBytes bounds a payload. Default DefaultMaxPayloadBytes (1 MiB).
	MaxPayloadBytes int
	// MaxMetadataBytes bounds the JSON of a message's metadata. Default DefaultMaxMetadataBytes (64 KiB).
	MaxMetadataBytes int
	// MaxAttempts is the attempt budget of events that do not set their own. Default DefaultMaxAttempts.
	MaxAttempts int
	// MaxDeliverAhead bounds how far in the future a deliver-at time may be. Default 365 days.
	MaxDeliverAhead time.Duration
}

func (c *OutboxConfig) setDefaults() {
	if c.Table == "" {
		c.Table = DefaultOutboxTable
	}
	if c.MaxPayloadBytes == 0 {
		c.MaxPayloadBytes = DefaultMaxPayloadBytes
	}
	if c.MaxMetadataBytes == 0 {
		c.MaxMetadataBytes = DefaultMaxMetadataBytes
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = DefaultMaxAttempts
	}
	if c.MaxDeliverAhead == 0 {
		c.MaxDeliverAhead = DefaultMaxDeliverAhead
	}
}

// Validate reports the first invalid field.
func (c OutboxConfig) Validate() error {
	if _, err := parseTableName(c.Table); err != nil {
		return fmt.Errorf("Table: %w", err)
	}
	if c.MaxPayloadBytes < 0 {
		return errors.New("MaxPayloadBytes: must not be negative")
	}
	if c.MaxMetadataBytes < 0 {
		return errors.New("MaxMetadataBytes: must not be negative")
	}
	if c.MaxAttempts < 0 {
		return errors.New("MaxAttempts: must not be negative")
	}
	if c.MaxAttempts > bus.MaxAttemptsLimit {
		return fmt.Errorf("MaxAttempts: at most %d, got %d", bus.MaxAttemptsLimit, c.MaxAttempts)
	}
	if c.MaxDeliverAhead < 0 {
		return errors.New("MaxDeliverAhead: must not be negative")
	}
	return nil
}

// Outbox writes events into an outbox table inside the caller's transaction.
type Outbox struct {
	cfg OutboxConfig
	q   *queries
}

// NewOutbox validates cfg and returns an Outbox. It does not touch the
// database; run Migrate first.
func NewOutbox(cfg OutboxConfig) (*Outbox, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("invalid config: %w", err)
	}
	tn, _ := parseTableName(cfg.Table)
	return &Outbox{cfg: cfg, q: newQueries(tn, false)}, nil
}

// Table returns the outbox table's name.
func (o *Outbox) Table() string { return o.cfg.Table }

// InvalidMessageError reports a message Enqueue refused. Nothing of the call
// was written.
type InvalidMessageError struct {
	UUID  string
	Field string
	Why   string
	// Err is the rule's own error where it has one (a *bus.TopicError for
	// the topic), for errors.Is and errors.As.
	Err error
}

func (e *InvalidMessageError) Error() string {
	return fmt.Sprintf("invalid message %q: %s: %s", e.UUID, e.Field, e.Why)
}

func (e *InvalidMessageError) Unwrap() error { return e.Err }

// Enqueue inserts msgs into the outbox for topic using db: a pgx.Tx of the
// caller's business transaction, a pool or a connection. It never begins or
// commits; the events become visible to relays when db's transaction commits,
// and a notification wakes them then. An event whose UUID is already in the
// outbox is skipped without error (and without aborting the transaction).
//
// Each message's UUID must be a UUID. Its partition_key and event_type
// metadata go into their columns; SetDeliverAt and SetMaxAttempts steer it.
// When ctx carries an OpenTelemetry span, its W3C trace context is stored in
// each event's metadata (traceparent, tracestate), replacing any the message
// carried, so the relay and the consumers continue the caller's trace.
// The topic must pass bus.ValidateTopic (no control or invisible
// character, valid UTF-8, at most bus.MaxTopicLength bytes). Text that
// PostgreSQL cannot store (a NUL byte or invalid UTF-8 in the partition
// key, event type, or a metadata key or value) makes a message invalid; it is refused before any SQL runs, so the caller's
// transaction stays usable and nothing is stored altered.
// If any message is invalid, nothing is written and the error names it.
func (o *Outbox) Enqueue(ctx context.Context, db DB, topic string, msgs ...*message.Message) error {
	rows, err := o.rows(ctx, topic, msgs)
	if err != nil || rows == nil {
		return err
	}
	if _, err := db.Exec(ctx, o.q.insertOutbox, topic, rows.ids, rows.keys, rows.types, rows.payloads, rows.metas, rows.attempts, rows.schedules); err != nil {
		return fmt.Errorf("enqueue %d events to %q: %w", len(rows.ids), o.cfg.Table, err)
	}
	return nil
}

// outboxRows are the columns of the events of one Enqueue call, checked.
type outboxRows struct {
	ids       []pgtype.UUID // not []uuid.UUID: pgx encodes those element by element through driver.Valuer (40× the time)
	keys      []*string
	types     []*string
	payloads  [][]byte
	metas     [][]byte
	attempts  []int32
	schedules []*time.Time
}

// rows checks msgs and turns them into the columns of their rows; nil (and
// no error) when there are none. It runs no SQL, so an invalid message
// leaves the caller's transaction usable.
func (o *Outbox) rows(ctx context.Context, topic string, msgs []*message.Message) (*outboxRows, error) {
	if len(msgs) == 0 {
		if err := bus.ValidateTopic(topic); err != nil {
			return nil, fmt.Errorf("enqueue to %q: %w", o.cfg.Table, err)
		}
		return nil, nil
	}
	topicErr := bus.ValidateTopic(topic)
	n := len(msgs)
	r := &outboxRows{
		ids:       make([]pgtype.UUID, n),
		keys:      make([]*string, n),
		types:     make([]*string, n),
		payloads:  make([][]byte, n),
		metas:     make([][]byte, n),
		attempts:  make([]int32, n),
		schedules: make([]*time.Time, n),
	}
	ids, keys, types, payloads, metas, attempts, schedules := r.ids, r.keys, r.types, r.payloads, r.metas, r.attempts, r.schedules
	now := time.Now()
	// The caller's span, if any, becomes the parent of the relay's.
	var trace message.Metadata
	if t := (message.Metadata{}); bus.InjectTraceContext(ctx, t) {
		trace = t
	}
	for i, msg := range msgs {
		if msg == nil {
			return nil, fmt.Errorf("enqueue: message %d is nil", i)
		}
		bad := func(field, why string) error {
			return fmt.Errorf("enqueue to %q: %w", o.cfg.Table, &InvalidMessageError{UUID: msg.UUID, Field: field, Why: why})
		}
		id, err := uuid.Parse(msg.UUID)
		if err != nil {
			return nil, bad("UUID", "not a UUID (the outbox keys events by UUID)")
		}
		ids[i] = pgtype.UUID{Bytes: id, Valid: true}
		var terr *bus.TopicError
		if errors.As(topicErr, &terr) {
			return nil, fmt.Errorf("enqueue to %q: %w", o.cfg.Table, &InvalidMessageError{UUID: msg.UUID, Field: "topic", Why: terr.Error(), Err: terr})
		}
		if len(msg.Payload) > o.cfg.MaxPayloadBytes {
			return nil, bad("Payload", overLimit("", len(msg.Payload), o.cfg.MaxPayloadBytes))
		}
		payloads[i] = msg.Payload
		if payloads[i] == nil {
			payloads[i] = []byte{}
		}
		var buf [8]metaPair
		meta := metaPairs(buf[:0])
		attempts[i] = int32(o.cfg.MaxAttempts)
		for k, v := range msg.Metadata {
			switch k {
			case MetaDeliverAt:
				t, err := time.Parse(time.RFC3339Nano, v)
				if err != nil {
					return nil, bad(MetaDeliverAt, "not an RFC 3339 time")
				}
				if t.After(now.Add(o.cfg.MaxDeliverAhead)) {
					return nil, bad(MetaDeliverAt, fmt.Sprintf("%s is more than %s ahead", v, o.cfg.MaxDeliverAhead))
				}
				schedules[i] = &t
			case MetaMaxAttempts:
				a, err := strconv.Atoi(v)
				if err != nil || a < 1 || a > bus.MaxAttemptsLimit {
					return nil, bad(MetaMaxAttempts, wantAttempts())
				}
				attempts[i] = int32(a)
			case bus.KeyPartitionKey, bus.KeyEventType:
				if why := badText(v); why != "" {
					return nil, bad(k, why)
				}
				meta = append(meta, metaPair{k, v})
			default:
				if why := badText(k); why != "" {
					return nil, bad("Metadata", aboutKey("key %q: %s", k, why))
				}
				if why := badText(v); why != "" {
					return nil, bad("Metadata", aboutKey("value of %q: %s", k, why))
				}
				meta = append(meta, metaPair{k, v})
			}
		}
		if trace != nil {
			meta = meta.remove(bus.KeyTraceparent).remove(bus.KeyTracestate)
			for k, v := range trace {
				meta = meta.set(k, v)
			}
		}
		if k := bus.PartitionKey(msg); k != "" {
			keys[i] = &k
		}
		if t := bus.EventType(msg); t != "" {
			types[i] = &t
		}
		metas[i] = meta.json()
		if len(metas[i]) > o.cfg.MaxMetadataBytes {
			return nil, bad("Metadata", overLimit(" of JSON", len(metas[i]), o.cfg.MaxMetadataBytes))
		}
	}
	return r, nil
}

// Publisher returns a message.Publisher that enqueues into the outbox with
// db. Publish with a pgx.Tx to write events in a business transaction.
// Close is a no-op: db belongs to the caller.
func (o *Outbox) Publisher(db DB) message.Publisher {
	return publisherFunc(func(topic string, msgs ...*message.Message) error {
		return o.Enqueue(messagesContext(msgs), db, topic, msgs...)
	})
}

// publisherFunc is a message.Publisher whose Close does nothing.
type publisherFunc func(topic string, msgs ...*message.Message) error

func (f publisherFunc) Publish(topic string, msgs ...*message.Message) error {
	return f(topic, msgs...)
}

func (publisherFunc) Close() error { return nil }

// messagesContext is the context of a Publish call: the first message's.
func messagesContext(msgs []*message.Message) context.Context {
	if len(msgs) > 0 && msgs[0].Context() != nil {
		return msgs[0].Context()
	}
	return context.Background()
}
