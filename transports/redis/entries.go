package redis

import (
	"context"
	"fmt"
	"strconv"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
)

// streamEntry is a stream entry as read or reclaimed. Its fields are nil
// when the entry was trimmed from the stream while it was pending.
type streamEntry struct {
	id     string
	fields fields
}

// fields are an entry's field names and values, alternating, in the order
// Redis keeps them (a repeated name is kept, and its last value counts, as in
// go-redis's map of an entry).
type fields []string

// fieldsOf turns go-redis's map of an entry into fields.
func fieldsOf(m map[string]any) fields {
	if m == nil {
		return nil
	}
	f := make(fields, 0, 2*len(m))
	for k, v := range m {
		f = append(f, k, fieldText(v))
	}
	return f
}

// fieldText is a field's name or value as go-redis gives it: a string, or
// (not for entries of a stream, whose fields are all strings) a number,
// written in decimal as XADD stores it.
func fieldText(v any) string {
	if s, ok := v.(string); ok {
		return s
	}
	return fmt.Sprint(v)
}

// entriesOf turns the reply of go-redis's typed XREADGROUP into entries,
// in stream order.
func entriesOf(res []redis.XStream) []streamEntry {
	var entries []streamEntry
	for _, xs := range res {
		for _, xm := range xs.Messages {
			entries = append(entries, streamEntry{id: xm.ID, fields: fieldsOf(xm.Values)})
		}
	}
	return entries
}

// asMap is the map a Marshaler's Unmarshal takes.
func (f fields) asMap() map[string]any {
	m := make(map[string]any, len(f)/2)
	for i := 0; i+1 < len(f); i += 2 {
		m[f[i]] = f[i+1]
	}
	return m
}

// decode builds the message of an entry's fields: with DefaultMarshaler
// straight from them, with any other Marshaler from the map it takes.
func (sub *subscription) decode(f fields) (*message.Message, error) {
	switch sub.cfg.Marshaler.(type) {
	case DefaultMarshaler, *DefaultMarshaler:
		return decodeFields(f)
	}
	return sub.cfg.Marshaler.Unmarshal(f.asMap())
}

// readRaw reads up to count new entries of stream for the group without
// blocking, and parses the reply itself rather than through go-redis's map
// of strings per entry: the entries' strings all share one copy of the
// reply. It is for reads that follow a full batch (a backlog), where the
// decoding is most of a read's cost; a blocking read goes through go-redis's
// typed command, whose connection deadline allows for the block.
func readRaw(ctx context.Context, c redis.UniversalClient, group, consumer, stream string, count int) ([]streamEntry, error) {
	cmd := redis.NewRawCmd(ctx, "xreadgroup", "group", group, consumer, "count", count, "streams", stream, ">")
	cmd.SetFirstKeyPos(7) // the stream: a cluster client routes by it
	if err := c.Process(ctx, cmd); err != nil {
		return nil, err
	}
	return parseReadGroupReply(cmd.Val())
}

// replyError is an error reply that go-redis left in a raw reply. It is a
// redis.Error, so redis.HasErrorPrefix sees it (NOGROUP recreates the group).
type replyError string

func (e replyError) Error() string { return string(e) }

// RedisError marks replyError as an error of the server.
func (replyError) RedisError() {}

// parseReadGroupReply parses the raw reply of an XREADGROUP of one stream,
// in RESP2 (an array of [stream, entries] pairs) or RESP3 (a map of stream
// to entries): the entries, in stream order. No entries is a nil reply.
func parseReadGroupReply(raw []byte) ([]streamEntry, error) {
	r := respReader{s: string(raw)}
	kind, n, err := r.header()
	if err != nil {
		return nil, err
	}
	switch {
	case kind == '-' || kind == '!':
		return nil, r.errorReply(n)
	case n < 0 || kind == '_':
		return nil, nil
	case kind != '*' && kind != '%':
		return nil, r.unexpected(kind, "an array or a map of streams")
	}
	var entries []streamEntry
	for range n {
		if kind == '*' {
			if err := r.expectArray(2, "a [stream, entries] pair"); err != nil {
				return nil, err
			}
		}
		if _, err := r.str(); err != nil { // the stream's name
			return nil, err
		}
		m, err := r.arrayLen("the stream's entries")
		if err != nil {
			return nil, err
		}
		for range m {
			e, err := r.entry()
			if err != nil {
				return nil, err
			}
			entries = append(entries, e)
		}
	}
	return entries, nil
}

// respReader reads RESP values from a reply held in one string; the
// strings it returns share it.
type respReader struct {
	s   string
	off int
}

// header reads a line "<kind><n>\r\n" (n is absent from "_\r\n").
func (r *respReader) header() (kind byte, n int, err error) {
	line, err := r.line()
	if err != nil {
		return 0, 0, err
	}
	kind, line = line[0], line[1:]
	switch kind {
	case '_':
		return kind, -1, nil
	case '-', '+':
		// A simple string or error: its text is the line itself.
		r.off -= len(line) + 2
		return kind, len(line), nil
	}
	n, err = strconv.Atoi(line)
	if err != nil {
		return 0, 0, fmt.Errorf("unexpected XREADGROUP reply: bad length %q of a %q", line, kind)
	}
	return kind, n, nil
}

func (r *respReader) line() (string, error) {
	for i := r.off; i+1 < len(r.s); i++ {
		if r.s[i] == '\r' && r.s[i+1] == '\n' {
			line := r.s[r.off:i]
			r.off = i + 2
			if line == "" {
				break
			}
			return line, nil
		}
	}
	return "", fmt.Errorf("unexpected XREADGROUP reply: truncated at byte %d of %d", r.off, len(r.s))
}

// text reads the n bytes (and the CRLF) of a bulk or simple value.
func (r *respReader) text(n int) (string, error) {
	end := r.off + n
	if n < 0 || end+2 > len(r.s) || r.s[end:end+2] != "\r\n" {
		return "", fmt.Errorf("unexpected XREADGROUP reply: a %d-byte string at byte %d of %d", n, r.off, len(r.s))
	}
	s := r.s[r.off:end]
	r.off = end + 2
	return s, nil
}

func (r *respReader) str() (string, error) {
	kind, n, err := r.header()
	if err != nil {
		return "", err
	}
	switch kind {
	case '$', '+':
		return r.text(n)
	case '-', '!':
		return "", r.errorReply(n)
	}
	return "", r.unexpected(kind, "a string")
}

// arrayLen reads an array's header; a nil array has length -1.
func (r *respReader) arrayLen(what string) (int, error) {
	kind, n, err := r.header()
	if err != nil {
		return 0, err
	}
	switch kind {
	case '*':
		return n, nil
	case '_':
		return -1, nil
	}
	return 0, r.unexpected(kind, what)
}

func (r *respReader) expectArray(n int, what string) error {
	got, err := r.arrayLen(what)
	if err == nil && got != n {
		err = fmt.Errorf("unexpected XREADGROUP reply: %s of %d elements", what, got)
	}
	return err
}

// entry reads [id, [name, value, ...]]; fields of nil are a trimmed entry.
func (r *respReader) entry() (streamEntry, error) {
	if err := r.expectArray(2, "an entry"); err != nil {
		return streamEntry{}, err
	}
	id, err := r.str()
	if err != nil {
		return streamEntry{}, err
	}
	n, err := r.arrayLen("an entry's fields")
	if err != nil || n < 0 {
		return streamEntry{id: id}, err
	}
	f := make(fields, n)
	for i := range f {
		if f[i], err = r.str(); err != nil {
			return streamEntry{}, err
		}
	}
	return streamEntry{id: id, fields: f}, nil
}

func (r *respReader) errorReply(n int) error {
	text, err := r.text(n)
	if err != nil {
		return err
	}
	return replyError(text)
}

func (r *respReader) unexpected(kind byte, want string) error {
	return fmt.Errorf("unexpected XREADGROUP reply: %q where %s belongs", kind, want)
}
