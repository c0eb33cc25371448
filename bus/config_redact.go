package bus

import (
	"fmt"
	"log/slog"
	"net/url"
	"reflect"
	"regexp"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// Redacted is what a secret is replaced with when a Config is printed.
const Redacted = "REDACTED"

// Redacted returns a copy of c whose secrets are replaced by Redacted: keys
// tagged secret (passwords) and the password inside a connection string
// (postgres.url), whether in the user info of a URL, a password query
// parameter or a password=… pair. Empty secrets stay empty, so a printed
// config shows whether a secret is set.
func (c Config) Redacted() Config {
	c.Kafka.Brokers = append([]string(nil), c.Kafka.Brokers...)
	c.Inbox.Topics = append([]string(nil), c.Inbox.Topics...)
	c.Postgres.QueueGroups = append([]string(nil), c.Postgres.QueueGroups...)
	walkConfig(reflect.ValueOf(&c).Elem(), "", func(_ string, f reflect.StructField, v reflect.Value) {
		switch f.Tag.Get("secret") {
		case "true":
			if v.String() != "" {
				v.SetString(Redacted)
			}
		case "dsn":
			v.SetString(RedactDSN(v.String()))
		}
	})
	return c
}

// String returns c as YAML with its secrets redacted: what `omnibus config
// check` prints. It is also what %v and %s print.
func (c Config) String() string {
	var out strings.Builder
	enc := yaml.NewEncoder(&out)
	enc.SetIndent(2)
	if err := enc.Encode(c.Redacted()); err != nil {
		return fmt.Sprintf("<config: %v>", err)
	}
	_ = enc.Close()
	return out.String()
}

// GoString makes %#v redact too.
func (c Config) GoString() string { return c.String() }

// LogValue logs c as one attribute per key, dotted, secrets redacted.
func (c Config) LogValue() slog.Value {
	r := c.Redacted()
	var attrs []slog.Attr
	walkConfig(reflect.ValueOf(&r).Elem(), "", func(key string, _ reflect.StructField, v reflect.Value) {
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

var (
	dsnUserinfoRE = regexp.MustCompile(`^([a-zA-Z][a-zA-Z0-9+.-]*://[^:/@?#]*):([^@]*)@`)
	dsnKeyValueRE = regexp.MustCompile(`(?i)(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s]*)`)
)

// RedactDSN replaces the password of a connection string with Redacted:
// the password in a URL's user info or password query parameter, or the
// value of a password=… pair in key=value form. It works on malformed input
// too, so that an error message quoting it can be redacted.
func RedactDSN(dsn string) string {
	if dsn == "" {
		return ""
	}
	if strings.Contains(dsn, "://") {
		out := dsnUserinfoRE.ReplaceAllString(dsn, "${1}:"+Redacted+"@")
		if u, err := url.Parse(out); err == nil && u.RawQuery != "" {
			q := u.Query()
			changed := false
			for k := range q {
				if strings.EqualFold(k, "password") {
					q.Set(k, Redacted)
					changed = true
				}
			}
			if changed {
				u.RawQuery = q.Encode()
				out = u.String()
			}
		}
		return out
	}
	return dsnKeyValueRE.ReplaceAllString(dsn, "${1}"+Redacted)
}
