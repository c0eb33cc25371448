package kafka

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/IBM/sarama"
	"github.com/xdg-go/scram"
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

// scramClient adapts github.com/xdg-go/scram to sarama's SCRAMClient, as
// sarama's own SASL example does, and adds the one rule the library lacks:
// it refuses a server-first message whose iteration count is above
// MaxSCRAMIterations (the library only has a minimum, which is set to
// MinSCRAMIterations too), before any key is derived.
type scramClient struct {
	hash scram.HashGeneratorFcn
	conv *scram.ClientConversation
	step int
}

func newSCRAMClient(h scram.HashGeneratorFcn) sarama.SCRAMClient { return &scramClient{hash: h} }

// Begin starts a conversation. The credentials are used as given, without
// SASLprep: Kafka brokers store them that way (see SASLConfig.Password).
func (c *scramClient) Begin(user, password, authzID string) error {
	client, err := c.hash.NewClientUnprepped(user, password, authzID)
	if err != nil {
		return fmt.Errorf("scram: %w", err)
	}
	c.conv = client.WithMinIterations(MinSCRAMIterations).NewConversation()
	c.step = 0
	return nil
}

// Step answers the server's challenge (empty on the first step).
func (c *scramClient) Step(challenge string) (string, error) {
	if c.conv == nil {
		return "", errors.New("scram: Step before Begin")
	}
	c.step++
	if c.step == 2 {
		if err := checkSCRAMIterations(challenge); err != nil {
			return "", err
		}
	}
	resp, err := c.conv.Step(challenge)
	if err != nil {
		return "", fmt.Errorf("scram: %w", err)
	}
	return resp, nil
}

// Done reports whether the conversation is over.
func (c *scramClient) Done() bool { return c.conv != nil && c.conv.Done() }

// checkSCRAMIterations refuses a server-first message (r=…,s=…,i=…) whose
// iteration count, the field the library reads, is not a number within
// MinSCRAMIterations..MaxSCRAMIterations. A message without that field is
// left to the library, which refuses it.
func checkSCRAMIterations(serverFirst string) error {
	fields := strings.SplitN(serverFirst, ",", 4)
	if len(fields) < 3 || !strings.HasPrefix(fields[2], "i=") {
		return nil
	}
	iter := strings.TrimPrefix(fields[2], "i=")
	n, err := strconv.Atoi(iter)
	if err == nil && n >= MinSCRAMIterations && n <= MaxSCRAMIterations {
		return nil
	}
	if len(iter) > 32 {
		iter = iter[:32] + "..."
	}
	return fmt.Errorf("scram: the server's iteration count %q is outside %d..%d: fewer make the proof cheap to brute-force, more would pin the CPU",
		iter, MinSCRAMIterations, MaxSCRAMIterations)
}
