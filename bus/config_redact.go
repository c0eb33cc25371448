package bus

import (
	"fmt"
	"log/slog"
	"net/url"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"time"
	"unicode"

	"go.yaml.in/yaml/v3"
)

// Redacted is what a secret is replaced with when a Config is printed.
const Redacted = "REDACTED"

// Redacted returns a copy of c whose secrets are replaced by Redacted: keys
// tagged secret (passwords), the password and secret parameters inside a
// connection string (postgres.url, observability.otlp_endpoint),
// credentials written into any other key by mistake (a redis.addr given as
// redis://user:password@host), a secret copied into another key, and values
// the file took from variables whose names say secret (see ParseConfigEnv). Empty secrets stay empty, so a printed config
// shows whether a secret is set.
func (c Config) Redacted() Config {
	secrets := append(c.secretValues(), c.expandedSecrets...)
	d := c.doc() // its lists are copies
	walkConfig(d, "", func(_ string, f reflect.StructField, v reflect.Value) {
		switch {
		case f.Tag.Get("secret") == "true":
			if v.String() != "" {
				v.SetString(Redacted)
			}
		case f.Tag.Get("secret") == "dsn":
			v.SetString(RedactDSN(v.String()))
		case v.Kind() == reflect.String:
			v.SetString(scrub(redactValue(v.String()), secrets))
		case v.Kind() == reflect.Slice && v.Type().Elem().Kind() == reflect.String:
			for i := range v.Len() {
				v.Index(i).SetString(scrub(redactValue(v.Index(i).String()), secrets))
			}
		}
	})
	return c.fromDoc(d)
}

// String returns c as YAML with its secrets redacted: what `omnibus config
// check` prints. It is also what %v and %s print.
func (c Config) String() string {
	var out strings.Builder
	enc := yaml.NewEncoder(&out)
	enc.SetIndent(2)
	if err := enc.Encode(c.Redacted().doc().Interface()); err != nil {
		return fmt.Sprintf("<config: %v>", err)
	}
	_ = enc.Close()
	return out.String()
}

// GoString makes %#v redact too.
func (c Config) GoString() string { return c.String() }

// LogValue logs c as one attribute per key, dotted, secrets redacted.
func (c Config) LogValue() slog.Value {
	var attrs []slog.Attr
	walkConfig(c.Redacted().doc(), "", func(key string, _ reflect.StructField, v reflect.Value) {
		switch x := v.Interface().(type) {
		case time.Duration:
			attrs = append(attrs, slog.String(key, x.String()))
		case []string:
			attrs = append(attrs, slog.String(key, strings.Join(x, ",")))
		default:
			attrs = append(attrs, slog.Any(key, x))
		}
	})
	return slog.GroupValue(attrs...)
}

// secretValues returns the secrets c holds, as written: the secret keys and
// the masked parts of its connection strings. Error messages are scrubbed of
// them (see scrub), so a secret copied into another key by mistake is not
// shown either.
func (c Config) secretValues() []string {
	var out []string
	walkConfig(c.doc(), "", func(_ string, f reflect.StructField, v reflect.Value) {
		switch f.Tag.Get("secret") {
		case "true":
			out = append(out, v.String())
		case "dsn":
			_, secrets := redactDSN(v.String())
			out = append(out, secrets...)
		}
	})
	return out
}

// minScrubLength is the shortest secret scrub looks for: shorter strings
// occur in ordinary words, and replacing them would garble the message
// without hiding anything.
const minScrubLength = 4

// configWords are words of the configuration itself (broker names, default
// names, enumerations). A development password is often one of them
// (postgres://postgres:postgres@…): scrub leaves them alone, or every
// message and printed config would lose the word, hiding nothing.
// Each transport adds its name and its Transport.Words (isConfigWord).
var configWords = map[string]bool{
	"postgresql":       true,
	DefaultOutboxTable: true, DefaultInboxTable: true, DefaultQueueTable: true, DefaultConsumerGroup: true,
	"public": true, "oldest": true, "newest": true, "none": true, "skip": true,
	"block": true, "debug": true, "info": true, "warn": true, "error": true, "text": true, "json": true,
	TracesOTLP: true, "true": true, "false": true,
}

// isConfigWord says s is a word of the configuration: one of configWords,
// or a registered transport's name or word.
func isConfigWord(s string) bool {
	if configWords[s] {
		return true
	}
	registryMu.RLock()
	defer registryMu.RUnlock()
	for name, t := range registry {
		if s == name || slices.Contains(t.Words, s) {
			return true
		}
	}
	return false
}

// scrub replaces every secret (of at least minScrubLength bytes, and not a
// word of the configuration) in msg with Redacted, the longest first so that
// a secret containing another is masked whole.
func scrub(msg string, secrets []string) string {
	secrets = slices.Clone(secrets)
	slices.SortFunc(secrets, func(a, b string) int { return len(b) - len(a) })
	for _, s := range secrets {
		if len(s) >= minScrubLength && !isConfigWord(s) {
			msg = strings.ReplaceAll(msg, s, Redacted)
		}
	}
	return msg
}

// redactValue masks credentials a value that is not meant to hold any may
// carry all the same: a URL with a password (redis://u:pw@host) is redacted
// as RedactDSN does, and in user:password@host the part before the '@' is
// masked. Anything else is returned as is.
func redactValue(v string) string {
	if schemeRE.MatchString(v) {
		return RedactDSN(v)
	}
	if at := strings.LastIndexByte(v, '@'); at >= 0 && strings.Contains(v[:at], ":") {
		return Redacted + v[at:]
	}
	return v
}

// schemeRE matches the start of a URL: scheme://, after optional spaces.
var schemeRE = regexp.MustCompile(`^\s*[A-Za-z][A-Za-z0-9+.-]*://`)

// schemeAnywhereRE finds a URL inside a longer text.
var schemeAnywhereRE = regexp.MustCompile(`[A-Za-z][A-Za-z0-9+.-]*://`)

// RedactDSN replaces the secrets of a connection string with Redacted. It
// parses the string the way the PostgreSQL driver does and masks what the
// parse says is secret:
//
//   - a URL (scheme://…): the password of the user info and the value of every
//     query parameter whose (percent-decoded) name says secret — password,
//     sslpassword, and names containing pass, pwd, secret, token, key, auth,
//     signature or credential. A URL net/url and libpq read differently, or
//     cannot read (an unescaped '@', '/', '?' or '#' in the password, a bad
//     port), or with an '@' besides the one ending the user info (even in a
//     query value: it may end a password that was not escaped), is masked
//     from the first ':' after the scheme to its last '@' (the user name is
//     kept), and every parameter of a secret name anywhere in it is masked.
//   - key=value pairs with libpq's quoting rules (single quotes, backslash
//     escapes, spaces around '='): the value of every key of a secret name.
//     The text from where the pairs stop parsing to the end is masked (a
//     password with an unquoted space).
//   - any other text (an error message quoting a connection string): URLs in
//     it are redacted as above, and the value of key=value words of a secret
//     name, with the words that follow it up to the next key=value word.
//     A single word that is neither a URL nor a pair is masked whole.
//
// Everything else is left as it was written. An empty password stays empty.
func RedactDSN(dsn string) string {
	out, _ := redactDSN(dsn)
	return out
}

// redactDSN is RedactDSN that also returns the masked texts as written.
func redactDSN(s string) (string, []string) {
	if s == "" {
		return "", nil
	}
	var spans []span
	if loc := schemeRE.FindStringIndex(s); loc != nil {
		spans = urlSecretSpans(s, loc[1])
	} else if kv := parseKeyValue(s); kv.failAt < 0 {
		spans = kv.spans
	} else if kv.pairs > 0 {
		spans = append(kv.spans, span{kv.failAt, len(s)})
	} else if strings.ContainsFunc(strings.TrimSpace(s), unicode.IsSpace) {
		spans = textSecretSpans(s)
	} else {
		spans = []span{{0, len(s)}}
	}
	return maskSpans(s, spans)
}

// span is the byte range [start, end) of a secret.
type span struct{ start, end int }

func (sp span) shift(off int) span { return span{sp.start + off, sp.end + off} }

func shiftSpans(spans []span, off int) []span {
	for i := range spans {
		spans[i] = spans[i].shift(off)
	}
	return spans
}

// maskSpans replaces each (merged) non-empty span of s with Redacted and
// returns the result and the texts replaced.
func maskSpans(s string, spans []span) (string, []string) {
	spans = slices.DeleteFunc(slices.Clone(spans), func(sp span) bool { return sp.end <= sp.start })
	if len(spans) == 0 {
		return s, nil
	}
	slices.SortFunc(spans, func(a, b span) int { return a.start - b.start })
	merged := spans[:1]
	for _, sp := range spans[1:] {
		last := &merged[len(merged)-1]
		if sp.start <= last.end {
			last.end = max(last.end, sp.end)
			continue
		}
		merged = append(merged, sp)
	}
	var b strings.Builder
	var secrets []string
	pos := 0
	for _, sp := range merged {
		b.WriteString(s[pos:sp.start])
		b.WriteString(Redacted)
		secrets = append(secrets, s[sp.start:sp.end])
		pos = sp.end
	}
	b.WriteString(s[pos:])
	return b.String(), secrets
}

// secretKey reports whether a connection-string parameter of this name holds
// a secret. The paths of key and password files (sslkey, passfile) do not.
func secretKey(name string) bool {
	n := strings.ToLower(name)
	if n == "sslkey" || n == "passfile" {
		return false
	}
	for _, w := range []string{"pass", "pwd", "secret", "token", "key", "auth", "signature", "credential"} {
		if strings.Contains(n, w) {
			return true
		}
	}
	return false
}

// secretQueryKey is secretKey of a raw URL query key, percent-decoded both
// as a query (+ is a space) and as libpq does (+ is a +).
func secretQueryKey(raw string) bool {
	if secretKey(raw) {
		return true
	}
	if k, err := url.QueryUnescape(raw); err == nil && secretKey(k) {
		return true
	}
	if k, err := url.PathUnescape(raw); err == nil && secretKey(k) {
		return true
	}
	return false
}

// urlSecretSpans returns the secret spans of the URL s whose scheme and "://"
// end at off.
func urlSecretSpans(s string, off int) []span {
	if spans, ok := exactURLSpans(s, off); ok {
		return spans
	}
	return looseURLSpans(s, off)
}

// exactURLSpans returns the secret spans of a URL whose parts net/url and
// libpq agree on: net/url parses it, it has no '#', the user info ends at
// the same '@' for both (net/url takes the last '@' before the path, libpq
// the first '@' before a '/'), and it has no other '@'. It reports false for
// anything else.
func exactURLSpans(s string, off int) ([]span, bool) {
	rest := s[off:]
	if strings.Contains(rest, "#") {
		return nil, false
	}
	if _, err := url.Parse(strings.TrimLeftFunc(s, unicode.IsSpace)); err != nil {
		return nil, false
	}
	authEnd := strings.IndexAny(rest, "/?")
	if authEnd < 0 {
		authEnd = len(rest)
	}
	urlAt := strings.LastIndexByte(rest[:authEnd], '@')
	pgAt := -1
	if i := strings.IndexAny(rest, "@/"); i >= 0 && rest[i] == '@' {
		pgAt = i
	}
	// Any other '@' may end a password that was not escaped, wherever it
	// sits (postgres://u:@pass?word@host is host "pass" and query
	// "word@host" to both parsers).
	if urlAt != pgAt || strings.Count(rest, "@") != min(1, urlAt+1) {
		return nil, false
	}
	tail := rest[urlAt+1:]
	qi := strings.IndexByte(tail, '?')
	if qi < 0 {
		qi = len(tail)
	}
	var spans []span
	if urlAt >= 0 {
		if c := strings.IndexByte(rest[:urlAt], ':'); c >= 0 {
			spans = append(spans, span{off + c + 1, off + urlAt})
		}
	}
	if qi < len(tail) {
		qoff := off + urlAt + 1 + qi + 1
		spans = append(spans, shiftSpans(querySpans(s[qoff:], "&"), qoff)...)
	}
	return spans, true
}

// looseURLSpans masks a URL that does not parse cleanly: the value of every
// parameter of a secret name, wherever it sits (pairs split at '?', '&' and
// ';'), and everything from the first ':' after the scheme to the last '@'
// (the user name before the ':' is kept). The last '@' may be in a query
// value; masking the host then is the price of never showing a part of a
// password that held "?password=…@".
func looseURLSpans(s string, off int) []span {
	spans := shiftSpans(querySpans(s[off:], "?&;"), off)
	at := strings.LastIndexByte(s[off:], '@')
	if at >= 0 {
		at += off
	}
	if at < 0 {
		return spans
	}
	// Without a ':' the user info is a user name, and no parser finds a
	// password in it.
	info := s[off:at]
	if c := strings.IndexByte(info, ':'); c >= 0 {
		start := off + c + 1
		if strings.ContainsAny(info[:c], "/?#&;") {
			start = off // not a user name: mask it all
		}
		spans = append(spans, span{start, at})
	}
	return spans
}

// querySpans returns the spans of the values of secret-named key=value pairs
// in q, pairs separated by any byte of seps.
func querySpans(q, seps string) []span {
	var spans []span
	start := 0
	for start <= len(q) {
		end := strings.IndexAny(q[start:], seps)
		if end < 0 {
			end = len(q)
		} else {
			end += start
		}
		pair := q[start:end]
		if eq := strings.IndexByte(pair, '='); eq >= 0 && secretQueryKey(pair[:eq]) {
			spans = append(spans, span{start + eq + 1, end})
		}
		start = end + 1
	}
	return spans
}

// kvResult is what parseKeyValue read.
type kvResult struct {
	spans  []span // values of keys of a secret name
	pairs  int    // pairs read
	failAt int    // where parsing stopped; -1 when all of the string parsed
	reason string // why it stopped, naming keys only (never values)
}

const kvSpaces = " \t\n\r\v\f"

func isKVSpace(c byte) bool { return strings.IndexByte(kvSpaces, c) >= 0 }

func skipKVSpace(s string, i int) int {
	for i < len(s) && isKVSpace(s[i]) {
		i++
	}
	return i
}

// parseKeyValue reads s as libpq key=value pairs, with the grammar of the
// PostgreSQL driver (pgconn): spaces around '=' are allowed, a value is a
// word (a backslash escapes the next byte, a space included) or single-quoted
// (backslash escapes inside).
func parseKeyValue(s string) kvResult {
	r := kvResult{failAt: -1}
	fail := func(at int, lastKey, format string, args ...any) kvResult {
		r.failAt = at
		where := "at the start"
		if lastKey != "" {
			where = fmt.Sprintf("after key %q", lastKey)
		}
		r.reason = where + ": " + fmt.Sprintf(format, args...)
		return r
	}
	lastKey := ""
	for i := skipKVSpace(s, 0); i < len(s); {
		eq := strings.IndexByte(s[i:], '=')
		if eq < 0 {
			return fail(i, lastKey, "text is not key=value (quote a value that has spaces: key='a b')")
		}
		key := strings.Trim(s[i:i+eq], kvSpaces)
		if key == "" {
			return fail(i, lastKey, "'=' without a key")
		}
		if strings.ContainsAny(key, kvSpaces) {
			return fail(i, lastKey, "text is not key=value (quote a value that has spaces: key='a b')")
		}
		start := skipKVSpace(s, i+eq+1)
		end, ok := scanKVValue(s, start)
		if !ok {
			return fail(start, key, "the quoted value of key %q has no closing quote", key)
		}
		if secretKey(key) {
			sp := span{start, end}
			if start < len(s) && s[start] == '\'' {
				// Mask inside the quotes: a value glued to the next word
				// (password='x'y=) stays a value of its own once masked.
				sp = span{start + 1, end - 1}
			}
			r.spans = append(r.spans, sp)
		}
		r.pairs++
		lastKey = key
		i = skipKVSpace(s, end)
	}
	return r
}

// scanKVValue returns the end of the libpq value that starts at s[start]: a
// single-quoted string (backslash escapes inside) or a word (a backslash
// escapes the next byte, a space included). ok is false for a quote that is
// not closed; end is then len(s).
func scanKVValue(s string, start int) (end int, ok bool) {
	if start < len(s) && s[start] == '\'' {
		k := start + 1
		for k < len(s) && s[k] != '\'' {
			if s[k] == '\\' {
				k++
			}
			k++
		}
		if k >= len(s) {
			return len(s), false
		}
		return k + 1, true
	}
	end = start
	for end < len(s) && !isKVSpace(s[end]) {
		if s[end] == '\\' {
			end++
		}
		end++
	}
	return min(end, len(s)), true
}

// textSecretSpans masks the secrets in free text: URLs, the values of
// key=value words of a secret name and the words after such a value up to
// the next key=value word (an unquoted password with spaces).
func textSecretSpans(s string) []span {
	var spans []span
	afterSecret := false
	for i := 0; i < len(s); {
		if isKVSpace(s[i]) {
			i++
			continue
		}
		end := i
		for end < len(s) && !isKVSpace(s[end]) {
			end++
		}
		word := s[i:end]
		key, vstart := "", -1 // a key=value or key = value here
		if eq := strings.IndexByte(word, '='); eq >= 0 {
			key, vstart = word[:eq], i+eq+1
		} else if j := skipKVSpace(s, end); j < len(s) && s[j] == '=' {
			key, vstart = word, j+1
		}
		key = strings.TrimLeft(key, "`'\"([{<")
		switch loc := schemeAnywhereRE.FindStringIndex(word); {
		case loc != nil && vstart < 0:
			spans = append(spans, shiftSpans(urlSecretSpans(word[loc[0]:], loc[1]-loc[0]), i+loc[0])...)
			afterSecret = false
		case vstart >= 0:
			afterSecret = secretKey(key)
			if !afterSecret {
				break
			}
			if eq := strings.IndexByte(word, '='); eq < 0 || vstart == end {
				vstart = skipKVSpace(s, vstart) // key = value, key= value
			}
			vend, _ := scanKVValue(s, vstart)
			spans = append(spans, span{vstart, vend})
			end = max(end, vend)
		case afterSecret:
			spans = append(spans, span{i, end})
		}
		i = end
	}
	return spans
}
