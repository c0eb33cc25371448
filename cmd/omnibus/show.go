package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/omnibus-go/omnibus/transports/postgres"
)

// printRow prints every column of r, its metadata, its full last error and
// its payload (see `show --help`). Nothing read from the row reaches the
// terminal unescaped.
func (a *app) printRow(adm *postgres.Admin, r postgres.Row) {
	w := tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', 0)
	field := func(name, value string) { fmt.Fprintf(w, "%s\t%s\n", name, value) }
	field("table", adm.Table().Name)
	field("id", fmt.Sprint(r.ID))
	if adm.Table().Kind == postgres.KindInbox {
		field("consumer group", escapeLine(r.ConsumerGroup))
		field("message id", escapeLine(r.MessageID))
	}
	field("event id", orDash(r.EventID))
	field("topic", escapeLine(r.Topic))
	field("partition key", orDash(escapeLine(r.PartitionKey)))
	field("event type", orDash(escapeLine(r.EventType)))
	field("status", r.Status)
	field("attempts", fmt.Sprintf("%d/%d", r.Attempts, r.MaxAttempts))
	field("created at", formatTime(&r.CreatedAt))
	field("scheduled at", formatTime(&r.ScheduledAt))
	field("completed at", formatTime(r.CompletedAt))
	leased := "-"
	if r.LockedBy != "" {
		leased = escapeLine(r.LockedBy) + " until " + formatTime(r.LockedUntil)
	}
	field("leased by", leased)
	metadata := metadataLines(r.Metadata)
	if metadata == "" {
		field("metadata", "-")
	}
	if r.LastError == "" {
		field("last error", "-")
	}
	if len(r.Payload) == 0 {
		field("payload", "0 bytes")
	}
	_ = w.Flush()

	if metadata != "" {
		fmt.Fprintf(a.stdout, "metadata\n%s", metadata)
	}
	if r.LastError != "" {
		fmt.Fprintf(a.stdout, "last error\n%s", indent(escapeText(r.LastError)))
	}
	if len(r.Payload) > 0 {
		printPayload(a.stdout, r.Payload)
	}
}

// formatTime renders a timestamp in UTC with its full precision ("-" for none).
func formatTime(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return t.UTC().Format(time.RFC3339Nano)
}

// metadataLines renders the metadata object one key per line, in key
// order, indented ("" when it is empty). A value that is not a string is
// shown as JSON; metadata that is not a JSON object is shown as it is.
func metadataLines(raw json.RawMessage) string {
	var md map[string]any
	if err := json.Unmarshal(raw, &md); err != nil {
		if len(bytes.TrimSpace(raw)) == 0 {
			return ""
		}
		return indent(escapeText(string(raw)))
	}
	keys := make([]string, 0, len(md))
	for k := range md {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		v, ok := md[k].(string)
		if !ok {
			j, _ := json.Marshal(md[k])
			v = string(j)
		}
		fmt.Fprintf(&b, "  %s: %s\n", escapeLine(k), escapeLine(v))
	}
	return b.String()
}

// printPayload prints p (not empty) indented under a line saying its size
// and how it is shown: JSON (indented), text, or binary (not valid UTF-8:
// each invalid byte as \xNN).
func printPayload(w io.Writer, p []byte) {
	size := plural(int64(len(p)), "byte")
	switch {
	case json.Valid(p):
		var buf bytes.Buffer
		_ = json.Indent(&buf, p, "", "  ")
		fmt.Fprintf(w, "payload (%s, JSON)\n%s", size, indent(escapeText(buf.String())))
	case utf8.Valid(p):
		fmt.Fprintf(w, "payload (%s, text)\n%s", size, indent(escapeText(string(p))))
	default:
		fmt.Fprintf(w, "payload (%s, binary: bytes that are not UTF-8 shown as \\xNN)\n%s", size, indent(escapeText(string(p))))
	}
}

// escapeText makes s safe to print: bytes that are not valid UTF-8 become
// \xNN, control characters other than newline and tab become \xNN (or
// \u{NNNN} outside ASCII), and a backslash stays a backslash (the escapes
// are for reading, not for parsing back).
func escapeText(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size <= 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case r == '\n' || r == '\t':
			b.WriteRune(r)
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(&b, `\x%02x`, r)
		case r >= 0x80 && r < 0xa0, r == 0x2028, r == 0x2029, r == 0x202e:
			fmt.Fprintf(&b, `\u{%04x}`, r) // C1 controls, line separators, bidi override
		default:
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	return b.String()
}

// escapeLine is escapeText for a value printed on one line: newlines and
// tabs are escaped too.
func escapeLine(s string) string {
	return strings.NewReplacer("\n", `\n`, "\t", `\t`).Replace(escapeText(s))
}

// indent indents every line of s by two spaces and ends it with a newline.
func indent(s string) string {
	s = strings.TrimRight(s, "\n")
	return "  " + strings.ReplaceAll(s, "\n", "\n  ") + "\n"
}
