// Package testenv gives tests the services they talk to: PostgreSQL, Redis
// and an in-process Kafka (kfake). A service that cannot be reached fails the
// test with instructions for starting it; nothing is skipped silently.
//
// Every test names its own tables, streams and topics with Name, so the
// suite runs in parallel against one server.
package testenv

import (
	"github.com/omnibus-go/omnibus/bus"

	"crypto/rand"
	"encoding/hex"
	"strings"
	"testing"
	"unicode"
)

// Name returns a unique identifier built from the test's name and a random
// suffix: lower case letters, digits and underscores, at most 32 bytes, safe
// as a table, stream or topic name. The test's part is at most 21 bytes, so
// that the random part survives PostgreSQL's truncation of the names it
// makes up for a partition's indexes (the table's part cut to 35 bytes or
// less): two runs of one test at once (make test runs the PostgreSQL suite
// on both layouts side by side) otherwise made indexes of the same name and
// the second CREATE failed on pg_class's unique index.
func Name(t testing.TB) string {
	var b strings.Builder
	for _, r := range strings.ToLower(t.Name()) {
		switch {
		case r < unicode.MaxASCII && (unicode.IsLetter(r) || unicode.IsDigit(r)):
			b.WriteRune(r)
		default:
			b.WriteByte('_')
		}
	}
	base := b.String()
	if len(base) > 21 {
		base = base[len(base)-21:]
	}
	base = strings.Trim(base, "_")
	if base == "" || (base[0] >= '0' && base[0] <= '9') {
		base = "t" + base
	}
	var suffix [5]byte
	_, _ = rand.Read(suffix[:])
	return base + "_" + hex.EncodeToString(suffix[:])
}

// ParseConfig reads yaml and then env (a map of OMNIBUS_* variables) as a
// process would, applies the defaults and validates: the transports'
// configuration tests share it.
func ParseConfig(yaml string, env map[string]string) (bus.Config, error) {
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	cfg, err := bus.ParseConfigEnv([]byte(yaml), lookup)
	if err != nil {
		return cfg, err
	}
	if err := cfg.ApplyEnv(lookup); err != nil {
		return cfg, err
	}
	cfg = cfg.WithDefaults()
	return cfg, cfg.Validate()
}
