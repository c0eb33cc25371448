package bus

import "github.com/ThreeDotsLabs/watermill/message"

// Reserved metadata keys. Every transport carries them (and all other
// metadata) across unchanged.
const (
	// KeyPartitionKey is the ordering key: messages with the same key and
	// topic are delivered in the order they were written. Empty means unordered.
	KeyPartitionKey = "partition_key"
	// KeyEventType names the kind of event; the typed dispatcher routes on it.
	KeyEventType = "event_type"
	// KeyEventID is the sender's event id. Receivers deduplicate on it; when it
	// is absent the message UUID is used.
	KeyEventID = "event_id"
	// KeyCorrelationID ties together every message of one business operation.
	KeyCorrelationID = "correlation_id"
	// KeyCausationID is the id of the message that caused this one.
	KeyCausationID = "causation_id"
	// KeyTraceparent and KeyTracestate carry the W3C trace context.
	KeyTraceparent = "traceparent"
	KeyTracestate  = "tracestate"
)

// SetPartitionKey sets the ordering key of msg.
func SetPartitionKey(msg *message.Message, key string) { msg.Metadata.Set(KeyPartitionKey, key) }

// PartitionKey returns the ordering key of msg, or "" when it has none.
func PartitionKey(msg *message.Message) string { return msg.Metadata.Get(KeyPartitionKey) }

// SetEventType sets the event type of msg.
func SetEventType(msg *message.Message, eventType string) { msg.Metadata.Set(KeyEventType, eventType) }

// EventType returns the event type of msg, or "".
func EventType(msg *message.Message) string { return msg.Metadata.Get(KeyEventType) }

// SetCorrelationID sets the correlation id of msg.
func SetCorrelationID(msg *message.Message, id string) { msg.Metadata.Set(KeyCorrelationID, id) }

// CorrelationID returns the correlation id of msg, or "".
func CorrelationID(msg *message.Message) string { return msg.Metadata.Get(KeyCorrelationID) }

// SetCausationID sets the causation id of msg.
func SetCausationID(msg *message.Message, id string) { msg.Metadata.Set(KeyCausationID, id) }

// CausationID returns the causation id of msg, or "".
func CausationID(msg *message.Message) string { return msg.Metadata.Get(KeyCausationID) }

// EventID returns the sender's event id of msg: the event_id metadata when
// set, else the message UUID. Inboxes deduplicate on it.
func EventID(msg *message.Message) string {
	if id := msg.Metadata.Get(KeyEventID); id != "" {
		return id
	}
	return msg.UUID
}

// CausedBy makes msg a consequence of cause: it copies the correlation id
// (or starts one from cause's event id) and sets the causation id to cause's
// event id.
func CausedBy(msg, cause *message.Message) {
	corr := CorrelationID(cause)
	if corr == "" {
		corr = EventID(cause)
	}
	SetCorrelationID(msg, corr)
	SetCausationID(msg, EventID(cause))
}

// Dead-letter metadata: every dead letter omnibus writes carries these keys,
// whichever transport (Kafka headers, Redis fields) or middleware wrote it,
// so a dead letter reads the same whichever way it came. Writers add keys of
// their own under DeadLetterPrefix, and drop every key under it that an
// earlier dead-lettering left before adding theirs.
const (
	// DeadLetterPrefix starts every dead-letter key.
	DeadLetterPrefix = "omnibus_dead_letter_"
	// KeyDeadLetterReason is DeadLetterReasonGaveUp or DeadLetterReasonUndecodable
	// (transports only; middleware.DeadLetter writes only given-up messages).
	KeyDeadLetterReason = DeadLetterPrefix + "reason"
	// KeyDeadLetterError is the error text (at most MaxDeadLetterErrorBytes).
	KeyDeadLetterError = DeadLetterPrefix + "error"
	// KeyDeadLetterClass is the failure class: counted, transient or permanent.
	KeyDeadLetterClass = DeadLetterPrefix + "class"
	// KeyDeadLetterAttempts is the number of attempts spent.
	KeyDeadLetterAttempts = DeadLetterPrefix + "attempts"
	// KeyDeadLetterTopic is the topic the message was received from.
	KeyDeadLetterTopic = DeadLetterPrefix + "topic"
	// KeyDeadLetterGroup is the consumer group that gave up.
	KeyDeadLetterGroup = DeadLetterPrefix + "consumer_group"
	// KeyDeadLetterAt is when it was dead-lettered, RFC 3339 in UTC.
	KeyDeadLetterAt = DeadLetterPrefix + "at"

	// DeadLetterReasonGaveUp: a handler failure settled with GiveUp (the
	// budget ran out, or the failure was permanent).
	DeadLetterReasonGaveUp = "gave_up"
	// DeadLetterReasonUndecodable: the transport could not decode the message.
	DeadLetterReasonUndecodable = "undecodable"

	// MaxDeadLetterErrorBytes bounds the error text kept in a dead letter.
	MaxDeadLetterErrorBytes = 4096
)
