package kafka

import (
	"github.com/omnibus-go/omnibus/bus"
)

// maxTopicLength is Kafka's limit on a topic name.
const maxTopicLength = 249

// ValidateTopic applies the rule every transport shares (bus.ValidateTopic)
// and Kafka's own: 1 to 249 characters of [a-zA-Z0-9._-], and neither "."
// nor "..". The Publisher refuses any other topic as a permanent error
// before it sends anything, so a relay fails the row at once with this
// reason instead of retrying what the broker will always refuse.
func ValidateTopic(topic string) error {
	if err := bus.ValidateTopic(topic); err != nil {
		return err
	}
	bad := func(why string) error { return &bus.TopicError{Topic: topic, Transport: "kafka", Why: why} }
	if len(topic) > maxTopicLength {
		return bad("are at most 249 characters")
	}
	if topic == "." || topic == ".." {
		return bad(`cannot be "." or ".."`)
	}
	for _, c := range []byte(topic) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return bad("may hold only ASCII letters, digits, '.', '_' and '-'")
		}
	}
	return nil
}
