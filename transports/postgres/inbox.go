package postgres

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/omnibus-go/omnibus/bus"
)

// MaxMessageIDBytes bounds a message id (the sender's event id) in the
// inbox: it is part of a unique index, whose entries PostgreSQL limits.
const MaxMessageIDBytes = 1024

// InboxConfig configures an Inbox.
type InboxConfig struct {
	// Table is the inbox table, optionally schema-qualified. Default DefaultInboxTable.
	Table string
	// MaxPayloadBytes bounds a payload. Default DefaultMaxPayloadBytes (1 MiB).
	MaxPayloadBytes int
	// MaxMetadataBytes bounds the JSON of a message's metadata. Default DefaultMaxMetadataBytes (64 KiB).
	MaxMetadataBytes int
	// MaxAttempts is the attempt budget of stored messages that do not set
	// their own (SetMaxAttempts). Default DefaultMaxAttempts.
	MaxAttempts int
	// Observer, when set, is told how many messages of every successful
	// store were new and how many were duplicates (Metrics implements it).
	// It is told when the insert statement returns: a store in a transaction
	// that is rolled back later has been counted all the same.
	Observer InboxObserver
}

func (c *InboxConfig) setDefaults() {
	if c.Table == "" {
		c.Table = DefaultInboxTable
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
}

// Validate reports the first invalid field.
func (c InboxConfig) Validate() error {
	if _, err := parseTableName(c.Table); err != nil {
		return fmt.Errorf("Table: %w", err)
	}
	switch {
	case c.MaxPayloadBytes < 0:
		return errors.New("MaxPayloadBytes: must not be negative")
	case c.MaxMetadataBytes < 0:
		return errors.New("MaxMetadataBytes: must not be negative")
	case c.MaxAttempts < 0:
		return errors.New("MaxAttempts: must not be negative")
	case c.MaxAttempts > bus.MaxAttemptsLimit:
		return fmt.Errorf("MaxAttempts: at most %d, got %d", bus.MaxAttemptsLimit, c.MaxAttempts)
	}
	return nil
}

// Inbox stores received messages in an inbox table, deduplicated per
// consumer group: a message is stored once per (message id, consumer group)
// however often the broker delivers it. The stored rows are handled later by
// a Subscriber over the inbox table (KindInbox, one ConsumerGroup), in order
// per (source topic, partition key) — see processors.Dispatcher.
type Inbox struct {
	cfg InboxConfig
	q   *queries
}

// NewInbox validates cfg and returns an Inbox. It does not touch the
// database; run Migrate with InboxTable first.
func NewInbox(cfg InboxConfig) (*Inbox, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("invalid config: %w", err)
	}
	tn, _ := parseTableName(cfg.Table)
	return &Inbox{cfg: cfg, q: newQueries(tn, true)}, nil
}

// Table returns the inbox table's name.
func (in *Inbox) Table() string { return in.cfg.Table }

// Config returns the configuration in effect, defaults applied.
func (in *Inbox) Config() InboxConfig { return in.cfg }

// StoreOptions steer StoreWith.
type StoreOptions struct {
	// Group is the consumer group the messages are stored for. Required.
	Group string
	// Topic is the source topic stored with every message. Empty means: the
	// topic of each message's bus.Delivery (Delivery.Topic, or Delivery.Source
	// for transports that do not set Topic). A message with neither is
	// refused.
	Topic string
	// Completed stores new rows as completed: for consumers that handle the
	// message in the same transaction as the insert (inline), so the row only
	// records that the message was seen. Completed rows are never dispatched.
	Completed bool
	// DedupPerTopic makes the deduplication key the message id within its
	// topic rather than the message id alone, so one message published to
	// two topics is stored once for each: a queue's semantics (the postgres
	// broker) rather than an inbox's, where a redelivered event is the same
	// event whatever topic it came through.
	DedupPerTopic bool
}

// Store inserts msgs for the consumer group with db — a pgx.Tx, a pool or a
// connection; it never begins or commits — and reports, for each message,
// whether it was new. A message whose id is already stored for group is
// skipped (ON CONFLICT DO NOTHING), without error and without aborting the
// transaction; so is a repeat of an id within msgs (the first one is new).
//
// The message id is the sender's event id: the event_id metadata, else the
// message UUID (bus.EventID). The partition key and event type metadata go
// into their columns, so stored rows are dispatched in order per key and
// routed by type. The source topic is taken from each message's bus.Delivery
// (see StoreOptions.Topic); use StoreWith to name it.
//
// If any message is invalid, nothing is written and the error wraps an
// *InvalidMessageError naming it.
func (in *Inbox) Store(ctx context.Context, db DB, group string, msgs ...*message.Message) ([]bool, error) {
	return in.StoreWith(ctx, db, StoreOptions{Group: group}, msgs...)
}

// StoreWith is Store with options: an explicit source topic, or rows stored
// completed. See Store.
func (in *Inbox) StoreWith(ctx context.Context, db DB, opts StoreOptions, msgs ...*message.Message) ([]bool, error) {
	return in.storeEach(ctx, db, opts, len(msgs), func(i int) (inboxRow, bool, error) {
		if msgs[i] == nil {
			return inboxRow{}, false, nil
		}
		var r inboxRow
		err := in.prepare(&r, msgs[i], opts.Topic)
		return r, true, err
	})
}

// Checked is a message CheckMessage accepted, made ready for the insert:
// StoreChecked stores it without checking and encoding it again.
type Checked struct {
	in    *Inbox
	msg   *message.Message
	topic string // as given to CheckMessage
	row   inboxRow
}

// Message returns the message that was checked.
func (c *Checked) Message() *message.Message { return c.msg }

// CheckMessage is Check that keeps what it made ready for the insert, for
// StoreChecked: a consumer that checks each message before it stores a
// batch of them (processors.InboxIngest) then encodes each message once.
func (in *Inbox) CheckMessage(msg *message.Message, topic string) (*Checked, error) {
	if msg == nil {
		return nil, errors.New("check: message is nil")
	}
	c := &Checked{in: in, msg: msg, topic: topic}
	if err := in.prepare(&c.row, msg, topic); err != nil {
		return nil, err
	}
	return c, nil
}

// StoreChecked is StoreWith for messages CheckMessage accepted. Each message
// keeps the source topic it was checked with (opts.Topic is not used). A
// message another Inbox checked is checked again, against this one's
// limits.
func (in *Inbox) StoreChecked(ctx context.Context, db DB, opts StoreOptions, msgs ...*Checked) ([]bool, error) {
	return in.storeEach(ctx, db, opts, len(msgs), func(i int) (inboxRow, bool, error) {
		switch c := msgs[i]; {
		case c == nil:
			return inboxRow{}, false, nil
		case c.in == in:
			return c.row, true, nil
		default:
			var r inboxRow
			err := in.prepare(&r, c.msg, c.topic)
			return r, true, err
		}
	})
}

// storeEach stores n messages, the i-th made ready by row(i) (ok false for
// a nil message); see Store.
func (in *Inbox) storeEach(ctx context.Context, db DB, opts StoreOptions, n int, row func(i int) (r inboxRow, ok bool, err error)) ([]bool, error) {
	if opts.Group == "" {
		return nil, errors.New("store: consumer group: must not be empty")
	}
	rows := make([]inboxRow, n)
	for i := range n {
		r, ok, err := row(i)
		if !ok {
			return nil, fmt.Errorf("store: message %d is nil", i)
		}
		if err != nil {
			return nil, fmt.Errorf("store to %q: %w", in.cfg.Table, err)
		}
		rows[i] = r
	}
	return in.store(ctx, db, opts, rows)
}

// store inserts rows for opts.Group; see Store.
func (in *Inbox) store(ctx context.Context, db DB, opts StoreOptions, rs []inboxRow) ([]bool, error) {
	n := len(rs)
	if n == 0 {
		return nil, nil
	}
	var (
		msgIDs   = make([]string, n)
		eventIDs = make([]pgtype.UUID, n) // not []*uuid.UUID: pgx encodes those element by element through reflection and driver.Valuer
		topics   = make([]string, n)
		keys     = make([]*string, n)
		types    = make([]*string, n)
		payloads = make([][]byte, n)
		metas    = make([][]byte, n)
		attempts = make([]int32, n)
	)
	for i, r := range rs {
		if opts.DedupPerTopic {
			r.messageID = r.topic + "/" + r.messageID
			if len(r.messageID) > MaxMessageIDBytes {
				return nil, fmt.Errorf("store to %q: %w", in.cfg.Table, &InvalidMessageError{UUID: r.uuid, Field: "topic and event id",
					Why: fmt.Sprintf("%d bytes together is over the limit of %d", len(r.messageID), MaxMessageIDBytes)})
			}
		}
		msgIDs[i], topics[i], keys[i], types[i] = r.messageID, r.topic, r.key, r.eventType
		if r.eventID != nil {
			eventIDs[i] = pgtype.UUID{Bytes: *r.eventID, Valid: true}
		}
		payloads[i], metas[i], attempts[i] = r.payload, r.metadata, r.maxAttempts
	}
	rows, err := db.Query(ctx, in.q.insertInbox, opts.Group, msgIDs, eventIDs, topics, keys, types, payloads, metas, attempts,
		opts.Completed)
	if err != nil {
		return nil, fmt.Errorf("store %d messages to %q for group %q: %w", n, in.cfg.Table, opts.Group, err)
	}
	defer rows.Close()
	inserted := make(map[string]bool, n)
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, fmt.Errorf("store %d messages to %q for group %q: scan: %w", n, in.cfg.Table, opts.Group, err)
		}
		inserted[id] = true
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store %d messages to %q for group %q: %w", n, in.cfg.Table, opts.Group, err)
	}
	fresh := make([]bool, n)
	newCount := 0
	for i, id := range msgIDs {
		if inserted[id] {
			fresh[i] = true
			newCount++
			delete(inserted, id) // a repeat within msgs is not new
		}
	}
	if in.cfg.Observer != nil {
		in.cfg.Observer.ObserveStore(StoreInfo{Table: in.cfg.Table, ConsumerGroup: opts.Group, New: newCount, Duplicates: n - newCount})
	}
	return fresh, nil
}

// Check reports whether Store would accept msg with the source topic (""
// for the topic of its bus.Delivery), without writing anything. The error
// wraps an *InvalidMessageError. A consumer that stores many messages in one
// statement checks each first, so that one bad message cannot fail the
// others.
func (in *Inbox) Check(msg *message.Message, topic string) error {
	_, err := in.CheckMessage(msg, topic)
	return err
}

// Remove deletes the rows of msgs (by message id) stored for group, with db.
// An inline consumer uses it to undo, in the same transaction, the Store of
// a message whose handling failed, so that nothing of it is stored and the
// broker's redelivery is new again.
func (in *Inbox) Remove(ctx context.Context, db DB, group string, msgs ...*message.Message) error {
	if len(msgs) == 0 {
		return nil
	}
	ids := make([]string, len(msgs))
	for i, m := range msgs {
		ids[i] = bus.EventID(m)
	}
	if _, err := db.Exec(ctx, in.q.removeInbox, group, ids); err != nil {
		return fmt.Errorf("remove %d messages from %q for group %q: %w", len(ids), in.cfg.Table, group, err)
	}
	return nil
}

// inboxRow is one message made ready for the insert.
type inboxRow struct {
	uuid        string // the message's, for errors
	messageID   string
	eventID     *uuid.UUID
	topic       string
	key         *string
	eventType   *string
	payload     []byte
	metadata    []byte
	maxAttempts int32
}

// SourceTopic returns the topic msg was received from, as Store takes it:
// the Topic of its bus.Delivery, else the Delivery's Source; "" when msg
// carries no Delivery.
func SourceTopic(msg *message.Message) string {
	d, ok := bus.DeliveryOf(msg)
	if !ok {
		return ""
	}
	if d.Topic != "" {
		return d.Topic
	}
	return d.Source
}

// prepare checks msg and makes it ready for the insert, in r.
func (in *Inbox) prepare(r *inboxRow, msg *message.Message, topic string) error {
	bad := func(field, why string) error {
		return &InvalidMessageError{UUID: msg.UUID, Field: field, Why: why}
	}
	*r = inboxRow{uuid: msg.UUID, messageID: bus.EventID(msg)}
	switch {
	case r.messageID == "":
		return bad("event id", "empty (neither event_id metadata nor a UUID)")
	case len(r.messageID) > MaxMessageIDBytes:
		return bad("event id", overLimit("", len(r.messageID), MaxMessageIDBytes))
	}
	if why := badText(r.messageID); why != "" {
		return bad("event id", why)
	}
	if topic == "" {
		topic = SourceTopic(msg)
	}
	if topic == "" {
		return bad("topic", "no source topic: the message carries no bus.Delivery; name the topic with StoreWith")
	}
	if why := badText(topic); why != "" {
		return bad("topic", why)
	}
	r.topic = topic
	if id, err := uuid.Parse(msg.UUID); err == nil {
		r.eventID = &id
	}
	if len(msg.Payload) > in.cfg.MaxPayloadBytes {
		return bad("Payload", overLimit("", len(msg.Payload), in.cfg.MaxPayloadBytes))
	}
	r.payload = msg.Payload
	if r.payload == nil {
		r.payload = []byte{}
	}
	r.maxAttempts = int32(in.cfg.MaxAttempts)
	var buf [8]metaPair
	meta := metaPairs(buf[:0])
	for k, v := range msg.Metadata {
		if k == MetaMaxAttempts {
			a, err := strconv.Atoi(v)
			if err != nil || a < 1 || a > bus.MaxAttemptsLimit {
				return bad(MetaMaxAttempts, wantAttempts())
			}
			r.maxAttempts = int32(a)
			continue
		}
		if why := badText(k); why != "" {
			return bad("Metadata", aboutKey("key %q: %s", k, why))
		}
		if why := badText(v); why != "" {
			return bad("Metadata", aboutKey("value of %q: %s", k, why))
		}
		meta = append(meta, metaPair{k, v})
	}
	// The dispatched message's UUID is the stored event_id column; when the
	// UUID is not a UUID that column is NULL, so keep the id in the metadata
	// for bus.EventID on the other side.
	if r.eventID == nil && meta.get(bus.KeyEventID) == "" {
		meta = meta.set(bus.KeyEventID, r.messageID)
	}
	if k := bus.PartitionKey(msg); k != "" {
		r.key = &k
	}
	if t := bus.EventType(msg); t != "" {
		r.eventType = &t
	}
	r.metadata = meta.json()
	if len(r.metadata) > in.cfg.MaxMetadataBytes {
		return bad("Metadata", overLimit(" of JSON", len(r.metadata), in.cfg.MaxMetadataBytes))
	}
	return nil
}

// overLimit, wantAttempts and aboutKey word the writers' refusals (the
// inbox's prepare, the outbox's rows). They are functions of their own so
// that prepare's frame holds no arguments of fmt.Sprintf: prepare runs on
// the goroutine the Watermill router starts for each message, and a larger
// frame made that goroutine grow its stack (a copy of it) for most messages.
//
//go:noinline
func overLimit(what string, n, limit int) string {
	return fmt.Sprintf("%d bytes%s is over the limit of %d", n, what, limit)
}

//go:noinline
func wantAttempts() string {
	return fmt.Sprintf("want a whole number from 1 to %d", bus.MaxAttemptsLimit)
}

//go:noinline
func aboutKey(format, k, why string) string { return fmt.Sprintf(format, k, why) }

// badText says why s cannot be stored as PostgreSQL text (or inside jsonb),
// or "" when it can.
func badText(s string) string {
	switch {
	case !utf8.ValidString(s):
		return "not valid UTF-8"
	case strings.IndexByte(s, 0) >= 0:
		return "contains a NUL byte"
	}
	return ""
}
