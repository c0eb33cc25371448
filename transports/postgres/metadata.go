package postgres

import (
	"bytes"
	"encoding/json"
	"unicode/utf8"
)

// decodeMetadata decodes a row's metadata column, a JSON object of strings,
// into a map. The shape PostgreSQL prints for what omnibus writes (jsonb:
// string keys and values, most without escapes) is read here, without
// reflection; anything else (an escape, a value that is not a string, bytes
// that are not UTF-8, null) goes to encoding/json, so the map and the error
// are what json.Unmarshal gives, whichever way it was read. Decoding the
// metadata with json.Unmarshal was a tenth of the relay's CPU in its process
// (BenchmarkRelayDrain).
func decodeMetadata(b []byte) (map[string]string, error) {
	return decodeMetadataWith(b, nil)
}

// decodeMetadataWith is decodeMetadata making its plain strings with c (nil:
// a new string each).
func decodeMetadataWith(b []byte, c textCache) (map[string]string, error) {
	if m, ok := decodePlainObject(b, c); ok {
		return m, nil
	}
	var m map[string]string
	err := json.Unmarshal(b, &m)
	return m, err
}

// decodePlainObject reads b when it is a JSON object whose keys and values
// are all strings without escapes or control characters; ok is false for
// anything else.
func decodePlainObject(b []byte, c textCache) (m map[string]string, ok bool) {
	i := skipJSONSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return nil, false
	}
	m = make(map[string]string, bytes.Count(b, []byte{','})+1)
	i = skipJSONSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		return m, skipJSONSpace(b, i+1) == len(b)
	}
	for {
		k, j, ok := plainJSONString(b, i)
		if !ok {
			return nil, false
		}
		i = skipJSONSpace(b, j)
		if i >= len(b) || b[i] != ':' {
			return nil, false
		}
		v, j, ok := plainJSONString(b, skipJSONSpace(b, i+1))
		if !ok {
			return nil, false
		}
		m[c.of(k)] = c.of(v) // a repeated key: the last one wins, as in encoding/json
		i = skipJSONSpace(b, j)
		if i >= len(b) {
			return nil, false
		}
		switch b[i] {
		case ',':
			i = skipJSONSpace(b, i+1)
		case '}':
			return m, skipJSONSpace(b, i+1) == len(b)
		default:
			return nil, false
		}
	}
}

// plainJSONString reads the JSON string that starts at b[i] and returns it
// and the index after it; ok is false unless it is a string without
// escapes, without control characters, of valid UTF-8.
func plainJSONString(b []byte, i int) (s []byte, next int, ok bool) {
	if i >= len(b) || b[i] != '"' {
		return nil, 0, false
	}
	ascii := true
	for j := i + 1; j < len(b); j++ {
		switch c := b[j]; {
		case c == '"':
			raw := b[i+1 : j]
			if !ascii && !utf8.Valid(raw) {
				return nil, 0, false
			}
			return raw, j + 1, true
		case c == '\\' || c < 0x20:
			return nil, 0, false
		case c >= utf8.RuneSelf:
			ascii = false
		}
	}
	return nil, 0, false
}

// textCache makes strings of bytes, giving the same string again for bytes
// it made one of before: the metadata of a fetch's rows repeat their names
// and, within a run, their values (a partition key). Nil makes a new string
// each time.
type textCache map[string]string

// maxCachedTexts bounds a textCache: values that do not repeat (a trace id)
// fill it once and are then made as they come.
const maxCachedTexts = 256

func (c textCache) of(b []byte) string {
	if s, ok := c[string(b)]; ok {
		return s
	}
	s := string(b)
	if c != nil && len(c) < maxCachedTexts {
		c[s] = s
	}
	return s
}

func skipJSONSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}
