package redis_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	omniredis "github.com/omnibus-go/omnibus/transports/redis"
)

// codecSeed is one input of FuzzDefaultMarshaler_RoundTrip: metadata is
// encoded by encodeMetadata.
type codecSeed struct {
	uuid     string
	payload  []byte
	metadata []byte
}

func codecSeeds() []codecSeed {
	return []codecSeed{
		{"0f8fad5b-d9cb-469f-a165-70867728950e", []byte(`{"id":42}`), encodeMetadata("partition_key", "order-42", "event_type", "order.paid")},
		{"u", nil, nil},
		{"u", []byte{}, encodeMetadata()},
		{"", []byte("refused: no UUID"), nil},
		{"u", []byte{0, 0xff, '\r', '\n'}, encodeMetadata("", "")},
		{"u", []byte("x"), encodeMetadata("uuid", "a", "payload", "b", "meta:", "c", "meta:meta:", "d")},
		{"\xff\xfe\x00", []byte("\xc3\x28"), encodeMetadata("k\xff", "v\x00", "omnibus_dead_letter_reason", "x")},
		{"u", []byte("x"), encodeMetadata("dup", "1", "dup", "2")},
		{"u", []byte("x"), []byte{0xff, 0xff, 0xff}}, // malformed metadata encoding: none
	}
}

// encodeMetadata encodes alternating keys and values, each as a uvarint
// length and its bytes.
func encodeMetadata(kv ...string) []byte {
	var b []byte
	for _, s := range kv {
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	return b
}

// decodeMetadata is the inverse of encodeMetadata; it stops at the first
// malformed length, so any bytes give some metadata. A later duplicate key
// wins, as with Metadata.Set.
func decodeMetadata(b []byte) message.Metadata {
	md := message.Metadata{}
	next := func() (string, bool) {
		n, w := binary.Uvarint(b)
		if w <= 0 || n > uint64(len(b)-w) {
			return "", false
		}
		s := string(b[w : w+int(n)])
		b = b[w+int(n):]
		return s, true
	}
	for {
		k, ok := next()
		if !ok {
			return md
		}
		v, ok := next()
		if !ok {
			return md
		}
		md.Set(k, v)
	}
}

// wire turns the fields Marshal returns into what the subscriber gets
// back from Redis: go-redis writes every name and value as a bulk string
// (numbers in decimal) and reads an entry into a map of strings, where a
// repeated name keeps its last value. TestCodec_FuzzSeedsMatchRedis checks
// this model against a real server.
func wire(t *testing.T, fields []any) map[string]any {
	t.Helper()
	require.Zero(t, len(fields)%2, "Marshal returned an odd number of fields")
	str := func(v any) string {
		switch v := v.(type) {
		case string:
			return v
		case []byte:
			return string(v)
		default:
			return fmt.Sprint(v)
		}
	}
	m := make(map[string]any, len(fields)/2)
	for i := 0; i < len(fields); i += 2 {
		m[str(fields[i])] = str(fields[i+1])
	}
	return m
}

// FuzzDefaultMarshaler_RoundTrip: whatever DefaultMarshaler.Marshal
// accepts, Unmarshal decodes from the entry Redis gives back to the same
// UUID, payload and metadata; Marshal refuses exactly the messages without
// a UUID.
func FuzzDefaultMarshaler_RoundTrip(f *testing.F) {
	for _, s := range codecSeeds() {
		f.Add(s.uuid, s.payload, s.metadata)
	}
	f.Fuzz(func(t *testing.T, uuid string, payload []byte, metadata []byte) {
		sent := message.NewMessage(uuid, payload)
		sent.Metadata = decodeMetadata(metadata)
		var codec omniredis.DefaultMarshaler

		fields, err := codec.Marshal("orders", sent)
		if uuid == "" {
			require.Error(t, err, "Marshal accepted a message without a UUID")
			return
		}
		require.NoError(t, err, "Marshal refused a message with a UUID")

		got, err := codec.Unmarshal(wire(t, fields))
		require.NoError(t, err, "Unmarshal refused what Marshal wrote")
		assertSameMessage(t, sent, got)
	})
}

// TestCodec_FuzzSeedsMatchRedis checks the fuzz target's model of the wire
// against a real server: each seed Marshal accepts, written with XADD and
// read with XRANGE, comes back as wire says.
func TestCodec_FuzzSeedsMatchRedis(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	stream := e.prefix + "seeds"
	var codec omniredis.DefaultMarshaler
	for i, s := range codecSeeds() {
		msg := message.NewMessage(s.uuid, s.payload)
		msg.Metadata = decodeMetadata(s.metadata)
		fields, err := codec.Marshal("seeds", msg)
		if err != nil {
			continue
		}
		id, err := e.client.XAdd(ctx, &goredis.XAddArgs{Stream: stream, Values: fields}).Result()
		require.NoError(t, err)
		entries, err := e.client.XRange(ctx, stream, id, id).Result()
		require.NoError(t, err)
		require.Len(t, entries, 1)
		assert.Equal(t, wire(t, fields), entries[0].Values, "seed %d: Redis gave back other fields than the model says", i)
	}
}
