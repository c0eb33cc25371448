package middleware

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omnibus-go/omnibus/bus"
)

// letterBox is a dead-letter publisher that records what it is given and
// fails while fail is set.
type letterBox struct {
	mu      sync.Mutex
	fail    error
	topics  []string
	letters []*message.Message
}

func (b *letterBox) Publish(topic string, msgs ...*message.Message) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.fail != nil {
		return b.fail
	}
	for _, m := range msgs {
		b.topics = append(b.topics, topic)
		b.letters = append(b.letters, m)
	}
	return nil
}

func (b *letterBox) Close() error { return nil }

func durableMsg(attempts, maxAttempts int) *message.Message {
	msg := message.NewMessage(watermill.NewUUID(), []byte("payload"))
	msg.Metadata.Set("trace", "kept")
	msg.Metadata.Set(MetaDeadLetterError, "from an earlier dead-lettering")
	msg.SetContext(bus.WithDelivery(context.Background(), bus.Delivery{
		Attempts: attempts, MaxAttempts: maxAttempts, Topic: "orders", Source: "outbox",
	}))
	return msg
}

func newDeadLetterChain(t *testing.T, box *letterBox, h message.HandlerFunc) (message.HandlerFunc, *DeadLetter) {
	t.Helper()
	dl, err := NewDeadLetter(DeadLetterConfig{Publisher: box, Topic: "orders.dlq", RetryDelay: time.Minute}, nil)
	require.NoError(t, err)
	retry, err := NewRetry(RetryConfig{MaxAttempts: 3}, nil)
	require.NoError(t, err)
	return dl.Middleware(retry.Middleware(h)), dl
}

func TestDeadLetter_GivenUpMessageIsPublishedWithItsReasonAndAcked(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		attempts int
		err      error
		class    string
		spent    string
	}{
		{"budget spent", 2, errors.New("rejected by the target"), "counted", "3"},
		{"permanent", 0, bus.Permanent(errors.New("undecodable payload")), "permanent", "1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			box := &letterBox{}
			h, _ := newDeadLetterChain(t, box, func(*message.Message) ([]*message.Message, error) { return nil, tc.err })
			msg := durableMsg(tc.attempts, 3)
			out, err := h(msg)
			require.NoError(t, err, "a dead-lettered message is acked")
			assert.Nil(t, out)
			require.Len(t, box.letters, 1)
			letter := box.letters[0]
			assert.Equal(t, "orders.dlq", box.topics[0])
			assert.Equal(t, msg.UUID, letter.UUID)
			assert.Equal(t, "payload", string(letter.Payload))
			assert.Equal(t, "kept", letter.Metadata.Get("trace"))
			assert.Equal(t, tc.err.Error(), letter.Metadata.Get(MetaDeadLetterError), "this failure, not an earlier one")
			assert.Equal(t, tc.class, letter.Metadata.Get(MetaDeadLetterClass))
			assert.Equal(t, tc.spent, letter.Metadata.Get(MetaDeadLetterAttempts))
			assert.Equal(t, "orders", letter.Metadata.Get(MetaDeadLetterTopic))
			at, perr := time.Parse(time.RFC3339Nano, letter.Metadata.Get(MetaDeadLetterAt))
			require.NoError(t, perr)
			assert.WithinDuration(t, time.Now(), at, time.Minute)
			assert.Empty(t, msg.Metadata.Get(MetaDeadLetterClass), "the original message is not changed")
		})
	}
}

func TestDeadLetter_FailuresThatWillBeRetriedPassThrough(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"counted, budget left", errors.New("rejected")},
		{"transient", bus.Transient(errors.New("broker down"))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			box := &letterBox{}
			h, _ := newDeadLetterChain(t, box, func(*message.Message) ([]*message.Message, error) { return nil, tc.err })
			msg := durableMsg(0, 3)
			_, err := h(msg)
			require.ErrorIs(t, err, tc.err)
			assert.Empty(t, box.letters)
			st, ok := bus.SettlementOf(msg)
			require.True(t, ok)
			assert.False(t, st.GiveUp, "Retry's settlement stands")
		})
	}
}

func TestDeadLetter_UnpublishedLetterKeepsTheMessageForARetryWithoutSpendingAnAttempt(t *testing.T) {
	t.Parallel()
	box := &letterBox{fail: errors.New("dead-letter broker down")}
	h, dl := newDeadLetterChain(t, box, func(*message.Message) ([]*message.Message, error) {
		return nil, bus.Permanent(errors.New("undecodable"))
	})
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	dl.now = func() time.Time { return now }
	msg := durableMsg(0, 3)
	_, err := h(msg)
	require.Error(t, err)
	assert.Equal(t, bus.ClassTransient, bus.ClassOf(err), "the message is kept, not failed")
	assert.Contains(t, err.Error(), "dead-letter broker down")
	assert.Contains(t, err.Error(), "undecodable")
	st, ok := bus.SettlementOf(msg)
	require.True(t, ok)
	assert.False(t, st.GiveUp)
	assert.Equal(t, bus.ClassTransient, st.Class)
	assert.Equal(t, now.Add(time.Minute), st.RetryAt)

	// Once the dead-letter topic takes it, the next delivery is acked.
	box.fail = nil
	msg = durableMsg(0, 3)
	_, err = h(msg)
	require.NoError(t, err)
	assert.Len(t, box.letters, 1)
}

func TestDeadLetter_WithoutDeliveryAfterInProcessRetries(t *testing.T) {
	t.Parallel()
	box := &letterBox{}
	dl, err := NewDeadLetter(DeadLetterConfig{Publisher: box, Topic: "dlq"}, nil)
	require.NoError(t, err)
	retry, err := NewRetry(RetryConfig{MaxAttempts: 2, Base: NoDelay}, nil)
	require.NoError(t, err)
	calls := 0
	h := dl.Middleware(retry.Middleware(func(*message.Message) ([]*message.Message, error) {
		calls++
		return nil, errors.New("always")
	}))
	_, err = h(message.NewMessage(watermill.NewUUID(), nil))
	require.NoError(t, err)
	assert.Equal(t, 2, calls)
	require.Len(t, box.letters, 1)
	assert.True(t, strings.HasPrefix(box.letters[0].Metadata.Get(MetaDeadLetterError), ErrBudgetSpent.Error()))
	assert.Empty(t, box.letters[0].Metadata.Get(MetaDeadLetterAttempts), "no delivery, no attempt count")
}

func TestDeadLetterConfig_InvalidFieldsAreNamed(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cfg   DeadLetterConfig
		field string
	}{
		{DeadLetterConfig{Topic: "dlq"}, "Publisher"},
		{DeadLetterConfig{Publisher: &letterBox{}, Topic: " "}, "Topic"},
		{DeadLetterConfig{Publisher: &letterBox{}, Topic: "dlq", RetryDelay: -time.Second}, "RetryDelay"},
	} {
		_, err := NewDeadLetter(tc.cfg, nil)
		require.Error(t, err)
		assert.Contains(t, err.Error(), "invalid config: "+tc.field)
	}
}
