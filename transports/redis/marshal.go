package redis

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/omnibus-go/omnibus/bus"
)

// Field names written by DefaultMarshaler.
const (
	// FieldUUID holds the message UUID.
	FieldUUID = "uuid"
	// FieldPayload holds the payload bytes, unchanged.
	FieldPayload = "payload"
	// FieldMetadataPrefix prefixes one field per metadata entry:
	// metadata "partition_key" is the field "meta:partition_key".
	FieldMetadataPrefix = "meta:"
)

// Metadata keys the Subscriber adds to an entry it copies to the dead-letter
// stream (as fields FieldMetadataPrefix+key, so a subscriber of the
// dead-letter stream sees them as metadata). They are named as the Kafka
// transport's dead-letter headers and middleware.DeadLetter's metadata, so a
// dead letter reads the same whichever way it came.
const (
	// KeyDeadLetterReason is DeadLetterReasonGaveUp or DeadLetterReasonUndecodable.
	KeyDeadLetterReason = bus.KeyDeadLetterReason
	// KeyDeadLetterError is the error text.
	KeyDeadLetterError = bus.KeyDeadLetterError
	// KeyDeadLetterClass is the failure class: counted, transient or
	// permanent (undecodable entries are permanent).
	KeyDeadLetterClass = bus.KeyDeadLetterClass
	// KeyDeadLetterAttempts is the number of deliveries of the entry.
	KeyDeadLetterAttempts = bus.KeyDeadLetterAttempts
	// KeyDeadLetterStream and KeyDeadLetterID locate the original entry.
	KeyDeadLetterStream = bus.DeadLetterPrefix + "stream"
	KeyDeadLetterID     = bus.DeadLetterPrefix + "id"
	// KeyDeadLetterGroup and KeyDeadLetterConsumer say who gave up on it.
	KeyDeadLetterGroup    = bus.KeyDeadLetterGroup
	KeyDeadLetterConsumer = bus.DeadLetterPrefix + "consumer"
	// KeyDeadLetterAt is when it was dead-lettered (RFC 3339, UTC).
	KeyDeadLetterAt = bus.KeyDeadLetterAt
)

// The values of KeyDeadLetterReason.
const (
	// DeadLetterReasonGaveUp: a handler failure settled with GiveUp (the
	// budget ran out, or the failure was permanent).
	DeadLetterReasonGaveUp = bus.DeadLetterReasonGaveUp
	// DeadLetterReasonUndecodable: the Marshaler could not decode the entry.
	DeadLetterReasonUndecodable = bus.DeadLetterReasonUndecodable
)

// ErrUndecodable is wrapped by the errors a Marshaler returns for an entry
// it cannot turn into a message.
var ErrUndecodable = errors.New("undecodable stream entry")

// Marshaler turns a message into the fields of a stream entry and back.
type Marshaler interface {
	// Marshal returns the entry's fields as alternating names and values.
	Marshal(topic string, msg *message.Message) ([]any, error)
	// Unmarshal builds a message from an entry's fields. An error makes the
	// entry a dead letter; it should wrap ErrUndecodable. With
	// DefaultMarshaler the Subscriber decodes the same way from the fields
	// as read, without building the map.
	Unmarshal(fields map[string]any) (*message.Message, error)
}

// DefaultMarshaler writes the UUID, the payload and one field per metadata
// entry (see FieldUUID, FieldPayload, FieldMetadataPrefix), so entries read
// well in redis-cli. Fields it does not know are ignored when reading.
type DefaultMarshaler struct{}

// Marshal implements Marshaler. It refuses what Unmarshal could not decode:
// a nil message or an empty UUID. Any bytes are accepted in the UUID, the
// payload and metadata keys and values (Redis is binary-safe), and they
// come back unchanged.
func (DefaultMarshaler) Marshal(_ string, msg *message.Message) ([]any, error) {
	if msg == nil {
		return nil, errors.New("nil message")
	}
	if msg.UUID == "" {
		return nil, fmt.Errorf("field %q: the message has an empty UUID; the subscriber cannot decode an entry without one", FieldUUID)
	}
	fields := make([]any, 0, 4+2*len(msg.Metadata))
	fields = append(fields, FieldUUID, msg.UUID, FieldPayload, []byte(msg.Payload))
	if len(msg.Metadata) == 0 {
		return fields, nil
	}
	keys := make([]string, 0, len(msg.Metadata))
	for k := range msg.Metadata {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		fields = append(fields, FieldMetadataPrefix+k, msg.Metadata[k])
	}
	return fields, nil
}

// Unmarshal implements Marshaler.
func (DefaultMarshaler) Unmarshal(m map[string]any) (*message.Message, error) {
	f := make(fields, 0, 2*len(m))
	for k, v := range m {
		s, ok := v.(string)
		switch {
		case ok:
			f = append(f, k, s)
		case strings.HasPrefix(k, FieldMetadataPrefix):
			return nil, fmt.Errorf("%w: field %q is %T, not a string", ErrUndecodable, k, v)
		}
		// A UUID or payload that is not a string is as good as absent.
	}
	return decodeFields(f)
}

// decodeFields is DefaultMarshaler's decoding of an entry's fields, where
// a repeated name's last value counts.
func decodeFields(f fields) (*message.Message, error) {
	var uuid, payload string
	hasPayload := false
	for i := 0; i+1 < len(f); i += 2 {
		switch f[i] {
		case FieldUUID:
			uuid = f[i+1]
		case FieldPayload:
			payload, hasPayload = f[i+1], true
		}
	}
	if uuid == "" {
		return nil, fmt.Errorf("%w: no %q field", ErrUndecodable, FieldUUID)
	}
	if !hasPayload {
		return nil, fmt.Errorf("%w: no %q field", ErrUndecodable, FieldPayload)
	}
	msg := message.NewMessage(uuid, []byte(payload))
	for i := 0; i+1 < len(f); i += 2 {
		if name, ok := strings.CutPrefix(f[i], FieldMetadataPrefix); ok {
			msg.Metadata.Set(name, f[i+1])
		}
	}
	return msg, nil
}
