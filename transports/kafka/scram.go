package kafka

import (
	"crypto/hmac"
	"crypto/pbkdf2"
	"crypto/rand"
	"crypto/sha256"
	"crypto/sha512"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"hash"
	"strconv"
	"strings"
)

// The iteration counts a SCRAM client accepts from the server. Deriving the
// salted password costs one PBKDF2 iteration each, and the server chooses
// the count, so it is bounded both ways:
//
//   - MinSCRAMIterations is the minimum of RFC 7677 and of Kafka itself: a
//     lower count (an impostor asking for 1) makes the client proof it
//     receives cheap to brute-force offline for the password.
//   - MaxSCRAMIterations bounds what a hostile or misconfigured server can
//     make a client spend: 100,000 iterations of SCRAM-SHA-512 cost about
//     80 ms of one core per connection (measured; 2^31, the most a server
//     can ask, would take about half an hour). Kafka stores credentials of
//     4096 to 16384 iterations, so this leaves room for Kafka-compatible
//     brokers configured with more.
const (
	MinSCRAMIterations = 4096
	MaxSCRAMIterations = 100_000
)

// scramClient is the client side of SCRAM (RFC 5802) for sarama's
// SCRAMClient interface: client-first, client-final, then verification of the
// server signature.
type scramClient struct {
	newHash func() hash.Hash

	user, password, authzID string
	nonce                   string
	clientFirstBare         string
	serverSignature         []byte
	step                    int
	done                    bool
}

var (
	sha256Hash = sha256.New
	sha512Hash = sha512.New
)

func newSCRAMClient(h func() hash.Hash) *scramClient { return &scramClient{newHash: h} }

// Begin starts a conversation.
func (c *scramClient) Begin(user, password, authzID string) error {
	var b [24]byte
	if _, err := rand.Read(b[:]); err != nil {
		return fmt.Errorf("scram: nonce: %w", err)
	}
	*c = scramClient{newHash: c.newHash, user: user, password: password, authzID: authzID,
		nonce: base64.RawStdEncoding.EncodeToString(b[:])}
	return nil
}

func (c *scramClient) gs2Header() string {
	if c.authzID == "" {
		return "n,,"
	}
	return "n,a=" + scramEscape(c.authzID) + ","
}

// Step answers the server's challenge (empty on the first step).
func (c *scramClient) Step(challenge string) (string, error) {
	c.step++
	switch c.step {
	case 1:
		c.clientFirstBare = "n=" + scramEscape(c.user) + ",r=" + c.nonce
		return c.gs2Header() + c.clientFirstBare, nil
	case 2:
		return c.clientFinal(challenge)
	case 3:
		return "", c.verify(challenge)
	}
	return "", errors.New("scram: unexpected challenge after the conversation ended")
}

// Done reports whether the conversation is over.
func (c *scramClient) Done() bool { return c.done }

func (c *scramClient) clientFinal(serverFirst string) (string, error) {
	attrs := scramAttrs(serverFirst)
	nonce, salt64, iter := attrs["r"], attrs["s"], attrs["i"]
	if e, ok := attrs["e"]; ok {
		return "", fmt.Errorf("scram: server error %q", e)
	}
	if !strings.HasPrefix(nonce, c.nonce) || len(nonce) == len(c.nonce) {
		return "", errors.New("scram: server nonce does not extend the client nonce")
	}
	salt, err := base64.StdEncoding.DecodeString(salt64)
	if err != nil {
		return "", fmt.Errorf("scram: salt: %w", err)
	}
	n, err := strconv.Atoi(iter)
	if err != nil || n < MinSCRAMIterations || n > MaxSCRAMIterations {
		if len(iter) > 32 {
			iter = iter[:32] + "..."
		}
		return "", fmt.Errorf("scram: the server's iteration count %q is outside %d..%d: fewer make the proof cheap to brute-force, more would pin the CPU",
			iter, MinSCRAMIterations, MaxSCRAMIterations)
	}
	size := c.newHash().Size()
	salted, err := pbkdf2.Key(c.newHash, c.password, salt, n, size)
	if err != nil {
		return "", fmt.Errorf("scram: pbkdf2: %w", err)
	}
	clientKey := c.hmac(salted, "Client Key")
	h := c.newHash()
	h.Write(clientKey)
	storedKey := h.Sum(nil)

	finalNoProof := "c=" + base64.StdEncoding.EncodeToString([]byte(c.gs2Header())) + ",r=" + nonce
	authMessage := c.clientFirstBare + "," + serverFirst + "," + finalNoProof
	clientSig := c.hmac(storedKey, authMessage)
	proof := make([]byte, len(clientKey))
	for i := range clientKey {
		proof[i] = clientKey[i] ^ clientSig[i]
	}
	c.serverSignature = c.hmac(c.hmac(salted, "Server Key"), authMessage)
	return finalNoProof + ",p=" + base64.StdEncoding.EncodeToString(proof), nil
}

func (c *scramClient) verify(serverFinal string) error {
	attrs := scramAttrs(serverFinal)
	if e, ok := attrs["e"]; ok {
		return fmt.Errorf("scram: server error %q", e)
	}
	sig, err := base64.StdEncoding.DecodeString(attrs["v"])
	if err != nil {
		return fmt.Errorf("scram: server signature: %w", err)
	}
	if subtle.ConstantTimeCompare(sig, c.serverSignature) != 1 {
		return errors.New("scram: the server signature does not match")
	}
	c.done = true
	return nil
}

func (c *scramClient) hmac(key []byte, msg string) []byte {
	m := hmac.New(c.newHash, key)
	m.Write([]byte(msg))
	return m.Sum(nil)
}

func scramAttrs(s string) map[string]string {
	attrs := make(map[string]string)
	for part := range strings.SplitSeq(s, ",") {
		if k, v, ok := strings.Cut(part, "="); ok && len(k) == 1 {
			attrs[k] = v
		}
	}
	return attrs
}

func scramEscape(s string) string {
	return strings.NewReplacer("=", "=3D", ",", "=2C").Replace(s)
}
