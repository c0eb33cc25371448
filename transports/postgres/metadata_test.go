package postgres

import (
	"encoding/json"
	"strconv"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// metadataSeeds are metadata columns as PostgreSQL prints them, and inputs
// the plain reading must hand to encoding/json.
var metadataSeeds = []string{
	`{}`, ` { } `, `{"a": "b"}`, `{"partition_key": "order-1", "event_type": "order.created"}`,
	`{"a":"b","a":"c"}`, `{"k": "ä ✓ 日本"}`, `{"k": "a\"b"}`, `{"k": "\u00e4"}`, `{"k": "a\nb"}`,
	"{\"k\": \"a\x01b\"}", "{\"k\": \"\xff\"}", `{"k": 1}`, `{"k": null}`, `{"k": {"x": "y"}}`, `null`,
	`[]`, `"s"`, `{"k": "v",}`, `{"k" "v"}`, `{"k": "v"} x`, `{"k": "v"`, `{"k": "v`, ``, `{`,
	"\ufeff{}", "{\t\"k\"\r\n:\n\"v\"\t}",
}

// FuzzDecodeMetadata: decodeMetadata gives exactly what json.Unmarshal gives
// into a map of strings, the map and whether there is an error, for any
// input.
func FuzzDecodeMetadata(f *testing.F) {
	for _, s := range metadataSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := decodeMetadata(b)
		var want map[string]string
		wantErr := json.Unmarshal(b, &want)
		if (err == nil) != (wantErr == nil) {
			t.Fatalf("decodeMetadata(%q): error %v, json.Unmarshal: %v", b, err, wantErr)
		}
		if (got == nil) != (want == nil) || len(got) != len(want) {
			t.Fatalf("decodeMetadata(%q) = %#v, json.Unmarshal gives %#v", b, got, want)
		}
		for k, v := range want {
			if g, ok := got[k]; !ok || g != v {
				t.Fatalf("decodeMetadata(%q) = %#v, json.Unmarshal gives %#v", b, got, want)
			}
		}
	})
}

func TestDecodeMetadata_ReadsWhatPostgreSQLPrintsWithoutEncodingJSON(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want map[string]string
	}{
		{`{}`, map[string]string{}},
		{`{"event_type": "order.created", "partition_key": "order-1"}`, map[string]string{"event_type": "order.created", "partition_key": "order-1"}},
		{`{"k": "ä ✓"}`, map[string]string{"k": "ä ✓"}},
	} {
		m, ok := decodePlainObject([]byte(tc.in), textCache{})
		require.True(t, ok, "%s is read without encoding/json", tc.in)
		assert.Equal(t, tc.want, m, tc.in)
	}
	for _, in := range []string{`{"k": "a\"b"}`, `{"k": 1}`, `null`, "{\"k\": \"\xff\"}", `{"k": "v"} x`} {
		_, ok := decodePlainObject([]byte(in), nil)
		assert.False(t, ok, "%s goes to encoding/json", in)
	}
	m, err := decodeMetadata([]byte(`{"k": "a\"b", "n": "x"}`))
	require.NoError(t, err)
	assert.Equal(t, map[string]string{"k": `a"b`, "n": "x"}, m, "an escape is decoded by encoding/json")
	_, err = decodeMetadata([]byte(`{"k": 1}`))
	assert.Error(t, err, "a value that is not a string is an error, as from encoding/json")
}

// The metadata of a fetch's rows is decoded from the driver's buffer, which
// the next row overwrites: the strings must be copies, made once per text
// while the cache has room.
func TestDecodeMetadataWith_CopiesAndSharesTexts(t *testing.T) {
	c := textCache{}
	buf := []byte(`{"partition_key": "order-1"}`)
	first, err := decodeMetadataWith(buf, c)
	require.NoError(t, err)
	copy(buf, `{"partition_key": "order-2"}`)
	second, err := decodeMetadataWith(buf, c)
	require.NoError(t, err)
	assert.Equal(t, map[string]string{"partition_key": "order-1"}, first, "the first row's metadata changed with the buffer")
	assert.Equal(t, map[string]string{"partition_key": "order-2"}, second)
	third, err := decodeMetadataWith([]byte(`{"partition_key": "order-2"}`), c)
	require.NoError(t, err)
	assert.Same(t, unsafe.StringData(second["partition_key"]), unsafe.StringData(third["partition_key"]), "a repeated value is one string")

	for i := range 2 * maxCachedTexts {
		c.of([]byte(strconv.Itoa(i)))
	}
	assert.Len(t, c, maxCachedTexts, "the cache is bounded")
}
