package redis

import (
	"strings"

	"github.com/omnibus-go/omnibus/bus"
)

// ValidateTopic applies the rule every transport shares (bus.ValidateTopic)
// and one of its own: a topic names a stream key, which operators find with
// SCAN MATCH and KEYS patterns, so it holds no space and none of the glob
// characters * ? [ ] \. The Publisher refuses any other topic as a permanent
// error before it writes anything.
func ValidateTopic(topic string) error {
	if err := bus.ValidateTopic(topic); err != nil {
		return err
	}
	if i := strings.IndexAny(topic, ` *?[]\`); i >= 0 {
		return &bus.TopicError{Topic: topic, Transport: "redis",
			Why: "hold no space and none of the glob characters * ? [ ] \\ (they are stream keys that operators match with patterns)"}
	}
	return nil
}
