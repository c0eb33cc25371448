package kafka_test

import (
	"testing"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/transports/kafka"
)

// consumed turns a produced record into the record a consumer would read.
func consumed(t *testing.T, pm *sarama.ProducerMessage, offset int64) *sarama.ConsumerMessage {
	t.Helper()
	rec := &sarama.ConsumerMessage{Topic: pm.Topic, Partition: 3, Offset: offset}
	if pm.Key != nil {
		k, err := pm.Key.Encode()
		require.NoError(t, err)
		rec.Key = k
	}
	if pm.Value != nil {
		v, err := pm.Value.Encode()
		require.NoError(t, err)
		rec.Value = v
	}
	for _, h := range pm.Headers {
		rec.Headers = append(rec.Headers, &sarama.RecordHeader{Key: h.Key, Value: h.Value})
	}
	return rec
}

func TestMarshaler_RoundTripKeepsUUIDMetadataPayloadAndKey(t *testing.T) {
	t.Parallel()
	msg := message.NewMessage("6a0e1c44-4b1e-4df5-9a43-3f9a1f1d1e11", []byte("payload"))
	bus.SetPartitionKey(msg, "order-7")
	bus.SetEventType(msg, "order.paid")
	msg.Metadata.Set("custom", "value")

	pm, err := kafka.DefaultMarshaler{}.Marshal("orders", msg)
	require.NoError(t, err)
	key, _ := pm.Key.Encode()
	assert.Equal(t, "order-7", string(key), "the partition key is the record key")

	got, err := kafka.DefaultMarshaler{}.Unmarshal(consumed(t, pm, 42))
	require.NoError(t, err)
	assert.Equal(t, msg.UUID, got.UUID)
	assert.Equal(t, msg.Payload, got.Payload)
	assert.Equal(t, msg.Metadata, got.Metadata)
}

func TestMarshaler_ForeignRecordGetsStableUUIDAndKeyAsPartitionKey(t *testing.T) {
	t.Parallel()
	rec := &sarama.ConsumerMessage{Topic: "t", Partition: 1, Offset: 9, Key: []byte("k1"), Value: []byte("v")}
	a, err := kafka.DefaultMarshaler{}.Unmarshal(rec)
	require.NoError(t, err)
	b, err := kafka.DefaultMarshaler{}.Unmarshal(rec)
	require.NoError(t, err)
	assert.NotEmpty(t, a.UUID)
	assert.Equal(t, a.UUID, b.UUID, "every delivery of a record carries the same UUID")
	assert.Equal(t, "k1", bus.PartitionKey(a))

	other := *rec
	other.Offset = 10
	c, err := kafka.DefaultMarshaler{}.Unmarshal(&other)
	require.NoError(t, err)
	assert.NotEqual(t, a.UUID, c.UUID, "another record gets another UUID")

	binKey := *rec
	binKey.Key = []byte{0xff, 0x00}
	d, err := kafka.DefaultMarshaler{}.Unmarshal(&binKey)
	require.NoError(t, err, "a binary key is not an error")
	assert.Empty(t, bus.PartitionKey(d))
}

func TestMarshaler_UndecodableHeaders(t *testing.T) {
	t.Parallel()
	h := func(k, v string) *sarama.RecordHeader { return &sarama.RecordHeader{Key: []byte(k), Value: []byte(v)} }
	cases := map[string][]*sarama.RecordHeader{
		"empty header name":          {h("", "x")},
		"header name not UTF-8":      {h("\xff", "x")},
		"header value not UTF-8":     {h("k", "\xfe\xff")},
		"empty UUID":                 {h(kafka.HeaderUUID, "")},
		"UUID repeated with changes": {h(kafka.HeaderUUID, "a"), h(kafka.HeaderUUID, "b")},
	}
	for name, headers := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			_, err := kafka.DefaultMarshaler{}.Unmarshal(&sarama.ConsumerMessage{Topic: "t", Headers: headers})
			assert.ErrorIs(t, err, kafka.ErrUndecodable)
		})
	}
}

func TestMarshaler_ReservedMetadataKeyIsRefused(t *testing.T) {
	t.Parallel()
	msg := message.NewMessage("id", nil)
	msg.Metadata.Set(kafka.HeaderUUID, "spoofed")
	_, err := kafka.DefaultMarshaler{}.Marshal("t", msg)
	assert.ErrorIs(t, err, kafka.ErrUnencodable)
}

func TestMarshaler_HeadersAreSortedAndDoNotShareBytes(t *testing.T) {
	t.Parallel()
	msg := message.NewMessage("6a0e1c44-4b1e-4df5-9a43-3f9a1f1d1e11", []byte("p"))
	msg.Metadata.Set("b", "2")
	msg.Metadata.Set("a", "1")
	msg.Metadata.Set("c", "3")

	pm, err := kafka.DefaultMarshaler{}.Marshal("t", msg)
	require.NoError(t, err)
	var got []string
	for _, h := range pm.Headers {
		got = append(got, string(h.Key)+"="+string(h.Value))
	}
	assert.Equal(t, []string{kafka.HeaderUUID + "=" + msg.UUID, "a=1", "b=2", "c=3"}, got,
		"the UUID header first, then the metadata in name order")

	// Growing one header's value must not write over the next header.
	pm.Headers[1].Value = append(pm.Headers[1].Value, 'x')
	assert.Equal(t, "b", string(pm.Headers[2].Key))
	assert.Equal(t, "2", string(pm.Headers[2].Value))
}

func BenchmarkDefaultMarshaler_Marshal(b *testing.B) {
	msg := message.NewMessage("6a0e1c44-4b1e-4df5-9a43-3f9a1f1d1e11", make([]byte, 256))
	bus.SetPartitionKey(msg, "order-7")
	b.ReportAllocs()
	for b.Loop() {
		if _, err := (kafka.DefaultMarshaler{}).Marshal("orders", msg); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDefaultMarshaler_Unmarshal(b *testing.B) {
	msg := message.NewMessage("6a0e1c44-4b1e-4df5-9a43-3f9a1f1d1e11", make([]byte, 256))
	bus.SetPartitionKey(msg, "order-7")
	pm, err := kafka.DefaultMarshaler{}.Marshal("orders", msg)
	if err != nil {
		b.Fatal(err)
	}
	rec := &sarama.ConsumerMessage{Topic: "orders", Partition: 3, Offset: 42, Key: []byte("order-7"), Value: msg.Payload}
	for _, h := range pm.Headers {
		rec.Headers = append(rec.Headers, &sarama.RecordHeader{Key: h.Key, Value: h.Value})
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := (kafka.DefaultMarshaler{}).Unmarshal(rec); err != nil {
			b.Fatal(err)
		}
	}
}
