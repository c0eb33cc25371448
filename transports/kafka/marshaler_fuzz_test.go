package kafka_test

import (
	"bytes"
	"errors"
	"testing"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/transports/kafka"
)

// FuzzDefaultMarshaler_RoundTrip checks the codec both ways. Whatever
// Marshal accepts, Unmarshal decodes to the same UUID, metadata and payload
// (and the partition key is the record key). Whatever Marshal refuses it
// refuses with ErrUnencodable, and only when the record it would have
// written is one Unmarshal refuses too (or it would spoof the UUID header):
// Marshal is exactly as strict as the decoder. The seeds run with go test.
func FuzzDefaultMarshaler_RoundTrip(f *testing.F) {
	type seed struct {
		uuid    string
		payload []byte
		pairs   uint8 // how many of the metadata pairs below the message has (0-3)
		k1, v1  string
		k2, v2  string
		k3, v3  string
	}
	for _, s := range []seed{
		{"6a0e1c44-4b1e-4df5-9a43-3f9a1f1d1e11", []byte("payload"), 3, bus.KeyPartitionKey, "order-7", bus.KeyEventType, "order.paid", "custom", "value"},
		{"id", nil, 0, "", "", "", "", "", ""},
		{"id", []byte{}, 1, bus.KeyPartitionKey, "", "", "", "", ""},
		{"", []byte("x"), 0, "", "", "", "", "", ""},
		{"id-\xff", []byte("x"), 0, "", "", "", "", "", ""},
		{"id", []byte("x"), 1, "", "v", "", "", "", ""},
		{"id", []byte("x"), 1, "k\xff", "v", "", "", "", ""},
		{"id", []byte("x"), 1, "k", "v\xfe", "", "", "", ""},
		{"id", []byte("x"), 1, bus.KeyPartitionKey, "\xc3\x28", "", "", "", ""},
		{"id", []byte("x"), 1, kafka.HeaderUUID, "spoofed", "", "", "", ""},
		{"id", []byte("x"), 2, "k", "v", "k", "w", "", ""},
		{"ünïcødé-🙂", []byte("\x00\xff"), 3, "a=b,c", "n\x00ul", "😀", "", "_watermill", "x"},
		{"id", []byte("x"), 1, bus.DeadLetterPrefix + "reason", "gave_up", "", "", "", ""},
	} {
		f.Add(s.uuid, s.payload, s.pairs, s.k1, s.v1, s.k2, s.v2, s.k3, s.v3)
	}
	f.Fuzz(func(t *testing.T, uuid string, payload []byte, pairs uint8, k1, v1, k2, v2, k3, v3 string) {
		msg := message.NewMessage(uuid, payload)
		kv := [][2]string{{k1, v1}, {k2, v2}, {k3, v3}}[:pairs%4]
		for _, p := range kv {
			msg.Metadata.Set(p[0], p[1])
		}
		m := kafka.DefaultMarshaler{}

		pm, err := m.Marshal("orders", msg)
		if err != nil {
			if !errors.Is(err, kafka.ErrUnencodable) {
				t.Fatalf("Marshal refused with %v, which does not wrap ErrUnencodable", err)
			}
			if _, spoof := msg.Metadata[kafka.HeaderUUID]; spoof {
				return
			}
			if _, derr := m.Unmarshal(unchecked(msg)); derr == nil {
				t.Fatalf("Marshal refused a message whose record Unmarshal decodes: %v", err)
			}
			return
		}

		got, err := m.Unmarshal(consumed(t, pm, 7))
		if err != nil {
			t.Fatalf("Unmarshal refused what Marshal wrote: %v", err)
		}
		if got.UUID != msg.UUID {
			t.Fatalf("UUID %q came back as %q", msg.UUID, got.UUID)
		}
		if !bytes.Equal(got.Payload, msg.Payload) {
			t.Fatalf("payload %q came back as %q", msg.Payload, got.Payload)
		}
		if len(got.Metadata) != len(msg.Metadata) {
			t.Fatalf("metadata %q came back as %q", msg.Metadata, got.Metadata)
		}
		for k, v := range msg.Metadata {
			if gv, ok := got.Metadata[k]; !ok || gv != v {
				t.Fatalf("metadata %q came back as %q", msg.Metadata, got.Metadata)
			}
		}
		var key []byte
		if pm.Key != nil {
			key, _ = pm.Key.Encode()
		}
		if string(key) != bus.PartitionKey(msg) {
			t.Fatalf("record key %q, partition key %q", key, bus.PartitionKey(msg))
		}
	})
}

// unchecked is the record Marshal would write for msg without its checks:
// the UUID header and one header per metadata entry.
func unchecked(msg *message.Message) *sarama.ConsumerMessage {
	rec := &sarama.ConsumerMessage{Topic: "orders", Partition: 3, Offset: 7, Value: msg.Payload}
	rec.Headers = append(rec.Headers, &sarama.RecordHeader{Key: []byte(kafka.HeaderUUID), Value: []byte(msg.UUID)})
	for k, v := range msg.Metadata {
		rec.Headers = append(rec.Headers, &sarama.RecordHeader{Key: []byte(k), Value: []byte(v)})
	}
	return rec
}
