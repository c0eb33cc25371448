package bus

import (
	"errors"
	"fmt"
	"unicode"
	"unicode/utf8"
)

// MaxTopicLength is the longest topic name, in bytes, that any omnibus
// transport accepts (Kafka's own limit is 249 characters of a narrower set;
// see the kafka transport).
const MaxTopicLength = 249

// ErrInvalidTopic is matched (errors.Is) by every *TopicError.
var ErrInvalidTopic = errors.New("invalid topic")

// TopicError reports a topic name a writer or a publisher refused: it names
// the topic (quoted, so an invisible character shows) and what is wrong.
type TopicError struct {
	Topic string
	// Transport is the transport whose own rule refused it ("" for the rule
	// every transport shares).
	Transport string
	Why       string
}

func (e *TopicError) Error() string {
	if e.Transport != "" {
		return fmt.Sprintf("%s: topic %+q: %s topics %s", ErrInvalidTopic, e.Topic, e.Transport, e.Why)
	}
	return fmt.Sprintf("%s: topic %+q: %s", ErrInvalidTopic, e.Topic, e.Why)
}

// Is makes every TopicError match ErrInvalidTopic.
func (e *TopicError) Is(target error) bool { return target == ErrInvalidTopic }

// ValidateTopic applies the rule every transport shares to a topic name: not
// empty, at most MaxTopicLength bytes, valid UTF-8, and no character that
// does not show: no control character (a NUL, a tab, a newline, \x01 …),
// no format character (a zero-width space, a byte order mark, a
// direction mark), no unassigned or private-use code point, no space but
// U+0020. A name that
// passes is one an operator can read, type and tell apart from another in
// a listing. Transports add their own rules (Kafka's character set) on top.
func ValidateTopic(topic string) error {
	why := ""
	switch {
	case topic == "":
		why = "must not be empty"
	case len(topic) > MaxTopicLength:
		why = fmt.Sprintf("%d bytes is over the limit of %d", len(topic), MaxTopicLength)
	case !utf8.ValidString(topic):
		why = "not valid UTF-8"
	default:
		for i, r := range topic {
			// IsPrint is letters, marks, numbers, punctuation, symbols and
			// the ASCII space: it leaves out controls, format characters,
			// private use, unassigned code points and every other space.
			if !unicode.IsPrint(r) {
				why = fmt.Sprintf("character %U at byte %d does not show (a control, format or unassigned character, or a space other than U+0020)", r, i)
				break
			}
		}
	}
	if why == "" {
		return nil
	}
	return &TopicError{Topic: topic, Why: why}
}
