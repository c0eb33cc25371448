package kafka

import (
	"errors"
	"fmt"
	"sort"
	"strconv"
	"unicode/utf8"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"

	"github.com/omnibus-go/omnibus/bus"
)

// HeaderUUID is the record header carrying the message UUID. It is the
// header watermill-kafka uses, so records flow between the two unchanged.
const HeaderUUID = "_watermill_message_uuid"

// Marshaler turns messages into Kafka records and back. A Subscriber sends
// a record whose Unmarshal fails to the dead-letter topic, with the error,
// instead of stopping its partition.
type Marshaler interface {
	// Marshal builds the record for msg on topic. The Publisher sets the
	// record's Metadata field itself; Marshal must leave it alone.
	Marshal(topic string, msg *message.Message) (*sarama.ProducerMessage, error)
	// Unmarshal builds a message from a consumed record.
	Unmarshal(rec *sarama.ConsumerMessage) (*message.Message, error)
}

// DefaultMarshaler maps a message to a record as follows: the partition key
// (bus.KeyPartitionKey metadata) is the record key, so records of one key
// share a partition and keep their order; the payload is the value; the UUID
// travels in the HeaderUUID header and every metadata entry in a header of
// its own name.
//
// Marshal refuses, with an error wrapping ErrUnencodable, every message
// Unmarshal would refuse to decode: an empty or non-UTF-8 UUID, an empty or
// non-UTF-8 metadata key, a non-UTF-8 metadata value (the partition key
// included), and a metadata key equal to HeaderUUID.
//
// Unmarshal is the reverse. A record without a UUID header (written by
// another producer) gets a UUID derived from its topic, partition and offset,
// so every delivery of it carries the same one; a record with a (UTF-8) key
// and no partition_key header gets the key as its partition key. A record is
// undecodable when a header name is empty, a header name or value is not
// valid UTF-8, or the UUID header is empty or repeated with different values.
// (Metadata is text everywhere else in omnibus, the PostgreSQL inbox keeps it
// as jsonb, so a binary header is stopped here, next to its cause, rather
// than failing an insert further on.)
type DefaultMarshaler struct{}

// ErrUndecodable is wrapped by the errors DefaultMarshaler.Unmarshal returns.
var ErrUndecodable = errors.New("undecodable record")

// ErrUnencodable is wrapped by the errors DefaultMarshaler.Marshal returns:
// the message cannot become a record that Unmarshal would decode.
var ErrUnencodable = errors.New("unencodable message")

// recordUUIDSpace namespaces the UUIDs derived for records without one.
var recordUUIDSpace = uuid.MustParse("6f6d6e69-6275-5300-8000-6b61666b6121")

// Marshal implements Marshaler. The header names and values of one record
// are copied into one buffer, so a record costs a fixed few allocations
// however much metadata it carries.
func (DefaultMarshaler) Marshal(topic string, msg *message.Message) (*sarama.ProducerMessage, error) {
	switch {
	case msg.UUID == "":
		return nil, fmt.Errorf("%w: message uuid is empty", ErrUnencodable)
	case !utf8.ValidString(msg.UUID):
		return nil, fmt.Errorf("%w: message uuid %q is not valid UTF-8", ErrUnencodable, msg.UUID)
	}
	size := len(HeaderUUID) + len(msg.UUID)
	keys := make([]string, 0, len(msg.Metadata))
	for k, v := range msg.Metadata {
		keys = append(keys, k)
		size += len(k) + len(v)
	}
	if len(keys) > 1 {
		sort.Strings(keys) // deterministic records and errors
	}
	for _, k := range keys {
		// What Unmarshal refuses, so that the subscriber never has to
		// dead-letter what this publisher wrote. The value is not quoted:
		// metadata may hold what should not reach a log.
		switch {
		case k == "":
			return nil, fmt.Errorf("%w: metadata key \"\" is empty (a record header needs a name)", ErrUnencodable)
		case k == HeaderUUID:
			return nil, fmt.Errorf("%w: metadata key %q is reserved for the message uuid", ErrUnencodable, k)
		case !utf8.ValidString(k):
			return nil, fmt.Errorf("%w: metadata key %q is not valid UTF-8", ErrUnencodable, k)
		case !utf8.ValidString(msg.Metadata[k]):
			return nil, fmt.Errorf("%w: the value of metadata key %q is not valid UTF-8", ErrUnencodable, k)
		}
	}
	buf := make([]byte, 0, size)
	take := func(s string) []byte {
		buf = append(buf, s...)
		return buf[len(buf)-len(s) : len(buf) : len(buf)]
	}
	headers := make([]sarama.RecordHeader, 0, len(keys)+1)
	headers = append(headers, sarama.RecordHeader{Key: take(HeaderUUID), Value: take(msg.UUID)})
	for _, k := range keys {
		headers = append(headers, sarama.RecordHeader{Key: take(k), Value: take(msg.Metadata[k])})
	}
	pm := &sarama.ProducerMessage{
		Topic:   topic,
		Value:   sarama.ByteEncoder(msg.Payload),
		Headers: headers,
	}
	if key := bus.PartitionKey(msg); key != "" {
		pm.Key = sarama.StringEncoder(key)
	}
	return pm, nil
}

// Unmarshal implements Marshaler.
func (DefaultMarshaler) Unmarshal(rec *sarama.ConsumerMessage) (*message.Message, error) {
	msg := message.NewMessage("", rec.Value)
	md := msg.Metadata
	hasID := false
	for _, h := range rec.Headers {
		if h == nil {
			continue
		}
		switch {
		case len(h.Key) == 0:
			return nil, fmt.Errorf("%w: a header has an empty name", ErrUndecodable)
		case !utf8.Valid(h.Key):
			return nil, fmt.Errorf("%w: header name %q is not valid UTF-8", ErrUndecodable, h.Key)
		case !utf8.Valid(h.Value):
			return nil, fmt.Errorf("%w: the value of header %q is not valid UTF-8", ErrUndecodable, h.Key)
		}
		if string(h.Key) == HeaderUUID {
			switch {
			case len(h.Value) == 0:
				return nil, fmt.Errorf("%w: header %s is empty", ErrUndecodable, HeaderUUID)
			case hasID && string(h.Value) != msg.UUID:
				return nil, fmt.Errorf("%w: header %s repeated with different values", ErrUndecodable, HeaderUUID)
			}
			if !hasID {
				msg.UUID, hasID = string(h.Value), true
			}
			continue
		}
		md[string(h.Key)] = string(h.Value) // a repeated header keeps its last value, as Kafka's lastHeader does
	}
	if !hasID {
		msg.UUID = uuid.NewSHA1(recordUUIDSpace, []byte(rec.Topic+"/"+strconv.Itoa(int(rec.Partition))+"/"+strconv.FormatInt(rec.Offset, 10))).String()
	}
	if _, ok := md[bus.KeyPartitionKey]; !ok && len(rec.Key) > 0 && utf8.Valid(rec.Key) {
		// A binary key is not copied; the Subscriber still orders by it.
		md[bus.KeyPartitionKey] = string(rec.Key)
	}
	return msg, nil
}
