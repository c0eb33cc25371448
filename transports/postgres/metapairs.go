package postgres

import (
	"cmp"
	"slices"
	"unicode/utf8"
)

// metaPairs builds the metadata column of written rows: the JSON object
// that json.Marshal makes of a map[string]string, byte for byte (keys
// sorted, each once, strings escaped as encoding/json escapes them, HTML
// characters included), without the map and the reflection. Building a
// map per message and marshaling it was most of the inbox's check of a
// message (BenchmarkInboxIngest). A writer collects a message's pairs in a
// slice on its stack and appends to it: set and remove return the slice.
type metaPairs []metaPair

type metaPair struct{ k, v string }

// set sets k to v, replacing an earlier value of k.
func (ps metaPairs) set(k, v string) metaPairs {
	for i := range ps {
		if ps[i].k == k {
			ps[i].v = v
			return ps
		}
	}
	return append(ps, metaPair{k, v})
}

// get returns k's value, "" when k is not set.
func (ps metaPairs) get(k string) string {
	for _, p := range ps {
		if p.k == k {
			return p.v
		}
	}
	return ""
}

// remove takes k out.
func (ps metaPairs) remove(k string) metaPairs {
	return slices.DeleteFunc(ps, func(p metaPair) bool { return p.k == k })
}

// json returns the object, sorting ps by key.
func (ps metaPairs) json() []byte {
	slices.SortFunc(ps, func(a, b metaPair) int { return cmp.Compare(a.k, b.k) })
	n := 2
	for _, p := range ps {
		n += len(p.k) + len(p.v) + 6
	}
	dst := make([]byte, 0, n)
	dst = append(dst, '{')
	for i, p := range ps {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = appendJSONString(dst, p.k)
		dst = append(dst, ':')
		dst = appendJSONString(dst, p.v)
	}
	return append(dst, '}')
}

// appendJSONString appends s as a JSON string, escaped as encoding/json
// escapes it with HTML escaping on (json.Marshal's default): ", \ and
// control characters, <, > and &, U+2028 and U+2029, and each byte that is
// not UTF-8 as U+FFFD.
func appendJSONString(dst []byte, s string) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		if b := s[i]; b < utf8.RuneSelf {
			if b >= 0x20 && b != '"' && b != '\\' && b != '<' && b != '>' && b != '&' {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch b {
			case '\\', '"':
				dst = append(dst, '\\', b)
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hex[b>>4], hex[b&0xF])
			}
			i++
			start = i
			continue
		}
		c, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case c == utf8.RuneError && size == 1:
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
		case c == '\u2028' || c == '\u2029':
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hex[c&0xF])
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}
