package kafka

import (
	"encoding/base64"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestSCRAM_IterationCountOutsideBoundsIsRefused answers the client's first
// message with each iteration count: a count below MinSCRAMIterations (a
// server, or an impostor, asking for a proof that is cheap to brute-force
// offline) or above MaxSCRAMIterations (a hostile server pinning the CPU)
// is refused before any key is derived, with an error naming the count and
// the bounds; the counts at the bounds are accepted.
func TestSCRAM_IterationCountOutsideBoundsIsRefused(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		iter string
		ok   bool
	}{
		{"minimum", "4096", true},
		{"maximum", "100000", true},
		{"one below the minimum", "4095", false},
		{"one", "1", false},
		{"zero", "0", false},
		{"negative", "-4096", false},
		{"one above the maximum", "100001", false},
		{"hostile 2^31-1", "2147483647", false},
		{"beyond int64", "99999999999999999999999", false},
		{"not a number", "many", false},
		{"empty", "", false},
	}
	for _, h := range []struct {
		name string
		new  func() *scramClient
	}{
		{"SHA-256", func() *scramClient { return newSCRAMClient(sha256Hash) }},
		{"SHA-512", func() *scramClient { return newSCRAMClient(sha512Hash) }},
	} {
		for _, tc := range cases {
			t.Run(h.name+"/"+tc.name, func(t *testing.T) {
				t.Parallel()
				c := h.new()
				require.NoError(t, c.Begin("user", "s3cret-password", ""))
				first, err := c.Step("")
				require.NoError(t, err)
				clientNonce := first[strings.Index(first, "r=")+2:]
				salt := base64.StdEncoding.EncodeToString([]byte("0123456789abcdef"))
				final, err := c.Step("r=" + clientNonce + "server,s=" + salt + ",i=" + tc.iter)
				if tc.ok {
					require.NoError(t, err, "iteration count %s", tc.iter)
					assert.Contains(t, final, ",p=", "the client-final message carries a proof")
					return
				}
				require.Error(t, err, "iteration count %q is accepted", tc.iter)
				assert.Contains(t, err.Error(), "iteration count")
				assert.Contains(t, err.Error(), "4096")
				assert.Contains(t, err.Error(), "100000")
				assert.NotContains(t, err.Error(), "s3cret-password")
				assert.Empty(t, final)
			})
		}
	}
}
