// Package testenv gives tests the services they talk to: PostgreSQL, Redis
// and an in-process Kafka (kfake). A service that cannot be reached fails the
// test with instructions for starting it; nothing is skipped silently.
//
// Every test names its own tables, streams and topics with Name, so the
// suite runs in parallel against one server.
package testenv

import (
	"crypto/rand"
	"encoding/hex"
	"strings"
	"testing"
	"unicode"
)

// Name returns a unique identifier built from the test's name and a random
// suffix: lower case letters, digits and underscores, at most 48 bytes, safe
// as a table, stream or topic name.
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
	if len(base) > 36 {
		base = base[len(base)-36:]
	}
	base = strings.Trim(base, "_")
	if base == "" || (base[0] >= '0' && base[0] <= '9') {
		base = "t" + base
	}
	var suffix [5]byte
	_, _ = rand.Read(suffix[:])
	return base + "_" + hex.EncodeToString(suffix[:])
}
