package kafka

import (
	"encoding/base64"
	"strings"
	"testing"

	"github.com/IBM/sarama"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/xdg-go/scram"
)

// TestSCRAM_IterationCountOutsideBoundsIsRefused answers the client's first
// message with each iteration count: a count below MinSCRAMIterations (a
// server, or an impostor, asking for a proof that is cheap to brute-force
// offline) or above MaxSCRAMIterations (a hostile server pinning the CPU)
// is refused before any key is derived, with an error naming the count and
// the bounds; the counts at the bounds are accepted. The upper bound is ours:
// github.com/xdg-go/scram only has a minimum.
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
		new  func() sarama.SCRAMClient
	}{
		{"SHA-256", func() sarama.SCRAMClient { return newSCRAMClient(scram.SHA256) }},
		{"SHA-512", func() sarama.SCRAMClient { return newSCRAMClient(scram.SHA512) }},
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

// TestSCRAM_PasswordIsUsedWithoutSASLprep authenticates against a SCRAM
// server whose credentials were derived from the password as given, the way
// Kafka stores them: a password that SASLprep would change (a soft hyphen,
// which it deletes) still authenticates, and a wrong password is refused
// without the password in the error.
func TestSCRAM_PasswordIsUsedWithoutSASLprep(t *testing.T) {
	t.Parallel()
	const password = "pass\u00adword"
	for _, h := range []struct {
		name string
		hash scram.HashGeneratorFcn
	}{{"SHA-256", scram.SHA256}, {"SHA-512", scram.SHA512}} {
		t.Run(h.name, func(t *testing.T) {
			t.Parallel()
			stored, err := h.hash.NewClientUnprepped("user", password, "")
			require.NoError(t, err)
			creds, err := stored.GetStoredCredentialsWithError(scram.KeyFactors{Salt: "0123456789abcdef", Iters: MinSCRAMIterations})
			require.NoError(t, err)
			server, err := h.hash.NewServer(func(string) (scram.StoredCredentials, error) { return creds, nil })
			require.NoError(t, err)

			converse := func(pass string) error {
				c := newSCRAMClient(h.hash)
				require.NoError(t, c.Begin("user", pass, ""))
				sc := server.NewConversation()
				challenge := ""
				for !c.Done() {
					resp, err := c.Step(challenge)
					if err != nil {
						return err
					}
					if sc.Done() {
						break
					}
					// The server's answer to a wrong proof is "e=…": the
					// client must refuse it.
					challenge, _ = sc.Step(resp)
				}
				return nil
			}
			require.NoError(t, converse(password), "the password as given authenticates")
			err = converse("wrong-" + password)
			require.Error(t, err, "a wrong password is refused")
			assert.NotContains(t, err.Error(), "wrong-")
			assert.NotContains(t, err.Error(), "pass")
		})
	}
}
