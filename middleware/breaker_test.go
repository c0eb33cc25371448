package middleware

import (
	"errors"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omnibus-go/omnibus/bus"
)

// A handler that panics failed its attempt: the Recoverer outside the
// breaker turns the panic into an error, but the breaker must count it too.
// A panicking probe used to leave the breaker half-open with its one probe
// slot taken, refusing every message forever.
func TestCircuitBreaker_PanickingProbeOpensItAgain(t *testing.T) {
	t.Parallel()
	b, err := NewCircuitBreaker(CircuitBreakerConfig{FailureThreshold: 1, OpenTimeout: time.Minute}, nil)
	require.NoError(t, err)
	now := time.Now()
	b.now = func() time.Time { return now }
	mode := "fail"
	h := b.Middleware(func(*message.Message) ([]*message.Message, error) {
		switch mode {
		case "panic":
			panic("handler bug")
		case "fail":
			return nil, errors.New("down")
		}
		return nil, nil
	})
	_, _ = h(handlerMsg())
	require.Equal(t, BreakerOpen, b.State())

	now = now.Add(2 * time.Minute)
	mode = "panic"
	assert.PanicsWithValue(t, "handler bug", func() { _, _ = h(handlerMsg()) }, "the breaker passes the panic on to the Recoverer")
	require.Equal(t, BreakerOpen, b.State(), "a panicking probe is a failed probe")

	now = now.Add(2 * time.Minute)
	mode = "ok"
	_, err = h(handlerMsg())
	require.NoError(t, err, "after OpenTimeout the next probe goes through")
	assert.Equal(t, BreakerClosed, b.State())
}

// A panic while closed is a failure of a different message like any other.
func TestCircuitBreaker_PanicsCountTowardOpeningIt(t *testing.T) {
	t.Parallel()
	b, err := NewCircuitBreaker(CircuitBreakerConfig{FailureThreshold: 2, OpenTimeout: time.Hour}, nil)
	require.NoError(t, err)
	h := b.Middleware(func(*message.Message) ([]*message.Message, error) { panic("handler bug") })
	for range 2 {
		assert.Panics(t, func() { _, _ = h(handlerMsg()) })
	}
	require.Equal(t, BreakerOpen, b.State(), "two different messages panicked")
	_, err = h(handlerMsg())
	assert.ErrorIs(t, err, ErrCircuitOpen)
	assert.Equal(t, bus.ClassTransient, bus.ClassOf(err))
}

// A result that arrives after the breaker changed state says nothing about
// the target now (gobreaker's generations): a message let through while
// closed that succeeds after other messages opened the breaker does not
// close it; the probe after OpenTimeout decides.
func TestCircuitBreaker_ResultFromBeforeItOpenedIsIgnored(t *testing.T) {
	t.Parallel()
	b, err := NewCircuitBreaker(CircuitBreakerConfig{FailureThreshold: 2, OpenTimeout: time.Hour}, nil)
	require.NoError(t, err)
	slow := handlerMsg()
	started, release := make(chan struct{}), make(chan struct{})
	h := b.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		if msg == slow {
			close(started)
			<-release
			return nil, nil
		}
		return nil, errors.New("down")
	})
	done := make(chan error)
	go func() {
		_, err := h(slow)
		done <- err
	}()
	<-started
	for range 2 {
		_, _ = h(handlerMsg())
	}
	require.Equal(t, BreakerOpen, b.State())
	close(release)
	require.NoError(t, <-done)
	assert.Equal(t, BreakerOpen, b.State(), "a success from before the breaker opened does not close it")
}
