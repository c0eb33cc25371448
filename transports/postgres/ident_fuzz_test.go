package postgres

import (
	"regexp"
	"strings"
	"testing"
)

// safeQuotedRE is what a quoted table name may look like: one or two quoted
// plain identifiers. Nothing in it can end the quotes, start a comment or a
// statement.
var safeQuotedRE = regexp.MustCompile(`^"[A-Za-z_][A-Za-z0-9_]*"(\."[A-Za-z_][A-Za-z0-9_]*")?$`)

// FuzzParseTableName: whatever parseTableName accepts quotes to a safe
// identifier (and so do all the names derived from it), fits PostgreSQL's
// 63-byte limit, and reads back as given; nothing with a quote, a NUL, a
// space or a semicolon is accepted.
func FuzzParseTableName(f *testing.F) {
	for _, seed := range []string{
		"omnibus_outbox", "events.outbox", "a", "_", "A1_b2", "x_lanes",
		"", ".", "a.", ".a", "a.b.c", "1abc", "a-b", "a b", `a"b`, `"a"`, "a\x00b", "a;DROP TABLE x",
		"a--", "ä", "a\u200bb", strings.Repeat("t", 47), strings.Repeat("t", 48), strings.Repeat("s", 63) + ".t",
		strings.Repeat("s", 64) + ".t", `x"; DROP TABLE y; --`, "public.omnibus_outbox",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, s string) {
		tn, err := parseTableName(s)
		if strings.ContainsAny(s, "\"\x00 ;'\\-\n") && err == nil {
			t.Fatalf("parseTableName(%q) accepted a quote, NUL, space, semicolon or comment", s)
		}
		if err != nil {
			return
		}
		if tn.String() != s {
			t.Fatalf("parseTableName(%q).String() = %q", s, tn.String())
		}
		for _, part := range strings.Split(s, ".") {
			if len(part) > maxIdentLen {
				t.Fatalf("parseTableName(%q) accepted a part longer than %d bytes", s, maxIdentLen)
			}
		}
		names := []string{tn.quoted(), tn.derived("_lanes").quoted(), tn.qualifiedIdent("_lane_fn"), tn.ident("_lanes_ready_idx")}
		for _, q := range names {
			if !safeQuotedRE.MatchString(q) {
				t.Fatalf("parseTableName(%q) quotes to %q, not a plain quoted identifier", s, q)
			}
			for _, part := range strings.Split(q, ".") {
				if len(part)-2 > maxIdentLen {
					t.Fatalf("parseTableName(%q): derived name %s is longer than %d bytes (PostgreSQL would truncate it)", s, q, maxIdentLen)
				}
			}
		}
		if ch := tn.channel(); len(ch) > maxIdentLen || !regexp.MustCompile(`^[A-Za-z0-9_]+$`).MatchString(ch) {
			t.Fatalf("parseTableName(%q): channel %q is not a plain name of at most %d bytes", s, ch, maxIdentLen)
		}
	})
}
