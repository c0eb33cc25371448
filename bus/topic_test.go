package bus

import (
	"errors"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
)

// Issue 25: ord\x01ers became a Redis stream that looks like "orders".
func TestValidateTopic(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		topic, why string
	}{
		{"orders", ""},
		{"orders.v1-eu_2", ""},
		{"commandes payées", ""},
		{"", "must not be empty"},
		{"ord\x01ers", `character U+0001 at byte 3 does not show`},
		{"orders\n", "U+000A"},
		{"ord\u200bers", "U+200B"},
		{"\ufefforders", "U+FEFF"},
		{"ord\u00a0ers", "U+00A0"},
		{"orders\xff", "not valid UTF-8"},
		{strings.Repeat("o", MaxTopicLength+1), "250 bytes is over the limit of 249"},
	} {
		err := ValidateTopic(tc.topic)
		if tc.why == "" {
			assert.NoError(t, err, "%+q", tc.topic)
			continue
		}
		if assert.Error(t, err, "%+q", tc.topic) {
			assert.True(t, errors.Is(err, ErrInvalidTopic))
			assert.Contains(t, err.Error(), tc.why)
		}
	}
	assert.Contains(t, ValidateTopic("ord\x01ers").Error(), `"ord\x01ers"`, "the error shows the invisible character")
}

func FuzzValidateTopic(f *testing.F) {
	for _, s := range []string{"orders", "ord\x01ers", "orders *?[x] ü/..", "\xff", "a\u200bb"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, topic string) {
		err := ValidateTopic(topic)
		if err != nil {
			if !errors.Is(err, ErrInvalidTopic) {
				t.Fatalf("%+q: error %v does not match ErrInvalidTopic", topic, err)
			}
			if !utf8.ValidString(err.Error()) {
				t.Fatalf("%+q: the error is not valid UTF-8: %q", topic, err.Error())
			}
			return
		}
		if topic == "" || len(topic) > MaxTopicLength || !utf8.ValidString(topic) {
			t.Fatalf("%+q accepted", topic)
		}
		for _, r := range topic {
			if !unicode.IsPrint(r) {
				t.Fatalf("%+q accepted with %U", topic, r)
			}
		}
	})
}
