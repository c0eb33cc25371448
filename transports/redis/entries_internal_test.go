package redis

import (
	"context"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omnibus-go/omnibus/internal/testenv"
)

// rawEntries are entries as XADD writes them: names and values in order, a
// repeated name included.
var rawEntries = [][]string{
	{FieldUUID, "a", FieldPayload, `{"id":1}`, FieldMetadataPrefix + "partition_key", "k"},
	{FieldUUID, "b", FieldPayload, ""},
	{FieldUUID, "c\r\n$3\r\n", FieldPayload, "\x00\xff\r\n*2\r\n", "other", "x"},
	{"dup", "1", FieldUUID, "d", "dup", "2", FieldPayload, strings.Repeat("p", 70_000)},
}

// The raw read parses what the server sends on either protocol, and through
// a cluster client, into the entries as written (names, values and their
// order, repeated names kept), tells a missing group apart as NOGROUP and
// reads nothing as no entries.
func TestReadRaw_GivesTheEntriesAsWritten(t *testing.T) {
	t.Parallel()
	for _, server := range []struct {
		name   string
		client func(t *testing.T) (redis.UniversalClient, string)
	}{
		{"RESP2", func(t *testing.T) (redis.UniversalClient, string) { return singleClient(t, 2), testenv.RedisPrefix(t) }},
		{"RESP3", func(t *testing.T) (redis.UniversalClient, string) { return singleClient(t, 3), testenv.RedisPrefix(t) }},
		{"cluster", func(t *testing.T) (redis.UniversalClient, string) {
			return testenv.RedisCluster(t), testenv.RedisClusterPrefix(t)
		}},
	} {
		t.Run(server.name, func(t *testing.T) {
			t.Parallel()
			c, prefix := server.client(t)
			ctx := context.Background()
			stream := prefix + "raw"
			t.Cleanup(func() { _ = c.Del(context.Background(), stream).Err() })

			_, err := readRaw(ctx, c, "g", "c", stream, 10)
			require.Error(t, err, "a read of a stream without the group")
			assert.True(t, redis.HasErrorPrefix(err, "NOGROUP"), "the error is not a NOGROUP reply: %v", err)

			var ids []string
			for _, fs := range rawEntries {
				values := make([]any, len(fs))
				for i, v := range fs {
					values[i] = v
				}
				id, err := c.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: values}).Result()
				require.NoError(t, err)
				ids = append(ids, id)
			}
			require.NoError(t, c.XGroupCreate(ctx, stream, "g", "0").Err())

			got, err := readRaw(ctx, c, "g", "c", stream, 3)
			require.NoError(t, err)
			more, err := readRaw(ctx, c, "g", "c", stream, 3)
			require.NoError(t, err)
			got = append(got, more...)
			require.Len(t, got, len(rawEntries), "entries read in two batches of at most 3")
			for i, e := range got {
				assert.Equal(t, ids[i], e.id, "entry %d's id", i)
				assert.Equal(t, fields(rawEntries[i]), e.fields, "entry %d's fields", i)
			}

			none, err := readRaw(ctx, c, "g", "c", stream, 3)
			require.NoError(t, err, "a read with nothing new")
			assert.Empty(t, none)
		})
	}
}

// singleClient is a client of its own of the single server, speaking RESP
// protocol.
func singleClient(t *testing.T, protocol int) *redis.Client {
	testenv.Redis(t) // fails with how to start Redis when it is not up
	c := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr(), Protocol: protocol})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// A reply that is cut short or is not an XREADGROUP reply is an error
// naming what was wrong, not a panic or a short batch.
func TestParseReadGroupReply_RefusesMalformedReplies(t *testing.T) {
	t.Parallel()
	entry := "*2\r\n$3\r\n1-0\r\n*2\r\n$1\r\nk\r\n$1\r\nv\r\n"
	good := "*1\r\n*2\r\n$1\r\ns\r\n*1\r\n" + entry
	got, err := parseReadGroupReply([]byte(good))
	require.NoError(t, err)
	require.Equal(t, []streamEntry{{id: "1-0", fields: fields{"k", "v"}}}, got)

	for name, reply := range map[string]string{
		"empty":              "",
		"cut in a line":      good[:len(good)-1],
		"cut in a value":     good[:len(good)-4],
		"a short value":      strings.Replace(good, "$3\r\n1-0", "$4\r\n1-0", 1),
		"a number":           ":1\r\n",
		"a bad length":       "*x\r\n",
		"an entry of three":  strings.Replace(good, "*2\r\n$3", "*3\r\n$3", 1),
		"an integer as name": strings.Replace(good, "$1\r\nk", ":1", 1),
	} {
		_, err := parseReadGroupReply([]byte(reply))
		assert.Error(t, err, "%s: %q was accepted", name, reply)
	}
}

// FuzzParseReadGroupReply: any bytes give entries or an error, never a
// panic.
func FuzzParseReadGroupReply(f *testing.F) {
	f.Add([]byte("*1\r\n*2\r\n$1\r\ns\r\n*1\r\n*2\r\n$3\r\n1-0\r\n*2\r\n$1\r\nk\r\n$1\r\nv\r\n"))
	f.Add([]byte("%1\r\n$1\r\ns\r\n*1\r\n*2\r\n$3\r\n1-0\r\n_\r\n"))
	f.Add([]byte("-NOGROUP no such group\r\n"))
	f.Add([]byte("!5\r\nerror\r\n"))
	f.Fuzz(func(t *testing.T, raw []byte) {
		_, _ = parseReadGroupReply(raw)
	})
}

// FuzzDecodeFields_AgreesWithUnmarshal: the subscriber's decoding of an
// entry's fields gives what DefaultMarshaler.Unmarshal gives for go-redis's
// map of the same entry (a repeated name's last value counts).
func FuzzDecodeFields_AgreesWithUnmarshal(f *testing.F) {
	for _, fs := range rawEntries {
		f.Add(strings.Join(fs, "\x1f"))
	}
	f.Add("uuid\x1f\x1fpayload\x1fx")
	f.Add("payload\x1fx")
	f.Add("uuid\x1fu\x1fmeta:a\x1f1\x1fmeta:a\x1f2\x1fpayload\x1fp\x1fuuid\x1fv")
	f.Fuzz(func(t *testing.T, joined string) {
		f := fields(strings.Split(joined, "\x1f"))
		if len(f)%2 == 1 {
			f = f[:len(f)-1]
		}
		got, gotErr := decodeFields(f)
		want, wantErr := DefaultMarshaler{}.Unmarshal(f.asMap())
		if wantErr != nil {
			assert.Error(t, gotErr, "Unmarshal refused %q (%v); decodeFields did not", f, wantErr)
			return
		}
		require.NoError(t, gotErr, "decodeFields refused %q, which Unmarshal decodes", f)
		assertSame(t, want, got)
	})
}

func assertSame(t *testing.T, want, got *message.Message) {
	t.Helper()
	assert.Equal(t, want.UUID, got.UUID)
	assert.Equal(t, string(want.Payload), string(got.Payload))
	assert.Equal(t, map[string]string(want.Metadata), map[string]string(got.Metadata))
}
