package middleware

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omnibus-go/omnibus/bus"
)

func TestBackoff_EachDelayLiesInHalfToFullNominal(t *testing.T) {
	t.Parallel()
	base, cap := 10*time.Second, time.Hour
	for attempt := 0; attempt < 12; attempt++ {
		nominal := min(cap, base<<attempt)
		for i := 0; i < 200; i++ {
			d, err := Backoff(attempt, base, cap)
			require.NoError(t, err)
			require.GreaterOrEqual(t, d, nominal/2, "attempt %d", attempt)
			require.LessOrEqual(t, d, nominal, "attempt %d", attempt)
		}
	}
}

func TestBackoff_CapHolds(t *testing.T) {
	t.Parallel()
	for _, attempt := range []int{9, 20, 62, 1000} {
		lo, hi, err := BackoffBounds(attempt, 10*time.Second, time.Hour)
		require.NoError(t, err)
		assert.Equal(t, time.Hour, hi)
		assert.Equal(t, 30*time.Minute, lo)
	}
}

// Six attempts mean five waits: 10+20+40+80+160 s nominal, so the budget runs
// out 155–310 s after the first failure ("2.5 to 5 minutes").
func TestBackoff_DefaultBudgetRunsOutBetweenTwoAndAHalfAndFiveMinutes(t *testing.T) {
	t.Parallel()
	var lo, hi time.Duration
	for attempt := 0; attempt < DefaultMaxAttempts-1; attempt++ {
		l, h, err := BackoffBounds(attempt, DefaultBase, DefaultCap)
		require.NoError(t, err)
		lo, hi = lo+l, hi+h
	}
	assert.Equal(t, 155*time.Second, lo)
	assert.Equal(t, 310*time.Second, hi)
}

func TestBackoff_ZeroBaseMeansNextCycle(t *testing.T) {
	t.Parallel()
	d, err := Backoff(3, 0, time.Hour)
	require.NoError(t, err)
	assert.Zero(t, d)
}

func TestBackoff_InvalidArgumentsAreRefused(t *testing.T) {
	t.Parallel()
	for name, args := range map[string]struct {
		attempt   int
		base, cap time.Duration
	}{
		"negative attempt": {-1, time.Second, time.Hour},
		"negative base":    {0, -time.Second, time.Hour},
		"negative cap":     {0, time.Second, -time.Hour},
		"cap below base":   {0, time.Hour, time.Second},
	} {
		_, err := Backoff(args.attempt, args.base, args.cap)
		assert.Error(t, err, name)
	}
}

func TestRetryConfig_InvalidFieldsAreNamed(t *testing.T) {
	t.Parallel()
	for field, cfg := range map[string]RetryConfig{
		"MaxAttempts":    {MaxAttempts: -1},
		"Base":           {Base: -5 * time.Second},
		"Cap":            {Cap: -time.Second},
		"TransientDelay": {TransientDelay: -time.Second},
	} {
		_, err := NewRetry(cfg, nil)
		require.Error(t, err, field)
		assert.Contains(t, err.Error(), "invalid config: "+field)
	}
	_, err := NewRetry(RetryConfig{Base: time.Hour, Cap: time.Minute}, nil)
	assert.ErrorContains(t, err, "invalid config: Cap")
}

func TestRetry_Decide(t *testing.T) {
	t.Parallel()
	r, err := NewRetry(RetryConfig{}, nil)
	require.NoError(t, err)
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	explicit := now.Add(42 * time.Minute)

	t.Run("counted spends an attempt and backs off", func(t *testing.T) {
		st := r.Decide(bus.Delivery{Attempts: 2, MaxAttempts: 6}, errors.New("x"), now)
		assert.Equal(t, bus.ClassCounted, st.Class)
		assert.False(t, st.GiveUp)
		lo, hi, _ := BackoffBounds(2, DefaultBase, DefaultCap)
		assert.True(t, !st.RetryAt.Before(now.Add(lo)) && !st.RetryAt.After(now.Add(hi)), "retry at %s", st.RetryAt)
	})
	t.Run("explicit RetryAt wins over backoff", func(t *testing.T) {
		st := r.Decide(bus.Delivery{Attempts: 0, MaxAttempts: 6}, bus.RetryAt(explicit, errors.New("x")), now)
		assert.Equal(t, explicit, st.RetryAt)
	})
	t.Run("transient does not count", func(t *testing.T) {
		st := r.Decide(bus.Delivery{Attempts: 5, MaxAttempts: 6}, bus.Transient(errors.New("x")), now)
		assert.Equal(t, bus.ClassTransient, st.Class)
		assert.False(t, st.GiveUp, "a transient failure never spends the last attempt")
		assert.Equal(t, now.Add(DefaultTransientDelay), st.RetryAt)
	})
	t.Run("budget spent gives up", func(t *testing.T) {
		st := r.Decide(bus.Delivery{Attempts: 5, MaxAttempts: 6}, errors.New("x"), now)
		assert.True(t, st.GiveUp)
	})
	t.Run("permanent gives up at once", func(t *testing.T) {
		st := r.Decide(bus.Delivery{Attempts: 0, MaxAttempts: 6}, bus.Permanent(errors.New("x")), now)
		assert.True(t, st.GiveUp)
		assert.Equal(t, bus.ClassPermanent, st.Class)
	})
}

func handlerMsg() *message.Message {
	return message.NewMessage(watermill.NewUUID(), []byte("x"))
}

func TestRetry_DurableMessageGetsASettlementNotAnInProcessRetry(t *testing.T) {
	t.Parallel()
	r, err := NewRetry(RetryConfig{}, nil)
	require.NoError(t, err)
	msg := handlerMsg()
	msg.SetContext(bus.WithDelivery(context.Background(), bus.Delivery{MaxAttempts: 6}))
	calls := 0
	_, err = r.Middleware(func(*message.Message) ([]*message.Message, error) {
		calls++
		return nil, errors.New("boom")
	})(msg)
	require.Error(t, err)
	assert.Equal(t, 1, calls, "the durable subscriber retries, not the middleware")
	st, ok := bus.SettlementOf(msg)
	require.True(t, ok)
	assert.Equal(t, "boom", st.Error)
	assert.False(t, st.GiveUp)
}

func TestRetry_InProcessWithoutDelivery(t *testing.T) {
	t.Parallel()
	r, err := NewRetry(RetryConfig{MaxAttempts: 3, Base: NoDelay}, nil)
	require.NoError(t, err)
	calls := 0
	_, err = r.Middleware(func(*message.Message) ([]*message.Message, error) {
		calls++
		return nil, errors.New("boom")
	})(handlerMsg())
	assert.ErrorIs(t, err, ErrBudgetSpent)
	assert.Equal(t, 3, calls)
}

// A timeout is a failure of an attempted message: it is counted like any
// other (DESIGN §3), so a message that always times out reaches max_attempts.
func TestTimeout_SlowTargetIsCountedLikeAnyFailure(t *testing.T) {
	t.Parallel()
	h := Timeout(20 * time.Millisecond)(func(m *message.Message) ([]*message.Message, error) {
		<-m.Context().Done()
		return nil, m.Context().Err()
	})
	_, err := h(handlerMsg())
	require.Error(t, err)
	assert.Equal(t, bus.ClassCounted, bus.ClassOf(err))
	assert.ErrorIs(t, err, context.DeadlineExceeded)
}

func TestCircuitBreaker_OpensAfterThresholdAndFailsFastTransient(t *testing.T) {
	t.Parallel()
	b, err := NewCircuitBreaker(CircuitBreakerConfig{FailureThreshold: 3, OpenTimeout: time.Hour}, nil)
	require.NoError(t, err)
	calls := 0
	h := b.Middleware(func(*message.Message) ([]*message.Message, error) {
		calls++
		return nil, errors.New("target down")
	})
	for i := 0; i < 3; i++ {
		_, err := h(handlerMsg())
		assert.Equal(t, bus.ClassCounted, bus.ClassOf(err), "a message that was attempted and failed is counted, breaker or not")
	}
	assert.Equal(t, BreakerOpen, b.State())
	_, err = h(handlerMsg())
	assert.ErrorIs(t, err, ErrCircuitOpen)
	assert.Equal(t, bus.ClassTransient, bus.ClassOf(err), "a message the open breaker did not attempt spends nothing")
	assert.Equal(t, 3, calls, "an open breaker does not call the target")
}

// One poison message failing again and again says nothing about the target:
// it must not open the breaker (which would hold every other key back), and
// each of its failures is counted, so it reaches max_attempts.
func TestCircuitBreaker_OneMessageFailingAgainDoesNotOpenIt(t *testing.T) {
	t.Parallel()
	b, err := NewCircuitBreaker(CircuitBreakerConfig{FailureThreshold: 3, OpenTimeout: time.Hour}, nil)
	require.NoError(t, err)
	h := b.Middleware(func(*message.Message) ([]*message.Message, error) {
		return nil, errors.New("poison")
	})
	poison := handlerMsg()
	for i := 0; i < 10; i++ {
		_, err := h(poison)
		assert.Equal(t, bus.ClassCounted, bus.ClassOf(err), "failure %d of the poison message is counted", i+1)
	}
	assert.Equal(t, BreakerClosed, b.State())
	other := handlerMsg()
	_, err = h(other)
	assert.NotErrorIs(t, err, ErrCircuitOpen, "other messages are still attempted")
}

// A probe is an attempt: when it fails, the failure is counted and the
// breaker opens again.
func TestCircuitBreaker_FailedProbeIsCounted(t *testing.T) {
	t.Parallel()
	b, err := NewCircuitBreaker(CircuitBreakerConfig{FailureThreshold: 1, OpenTimeout: time.Minute}, nil)
	require.NoError(t, err)
	now := time.Now()
	b.now = func() time.Time { return now }
	h := b.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, errors.New("down") })
	_, _ = h(handlerMsg())
	require.Equal(t, BreakerOpen, b.State())
	now = now.Add(2 * time.Minute)
	_, err = h(handlerMsg())
	assert.Equal(t, bus.ClassCounted, bus.ClassOf(err))
	assert.NotErrorIs(t, err, ErrCircuitOpen)
	assert.Equal(t, BreakerOpen, b.State())
}

func TestCircuitBreaker_ProbeClosesIt(t *testing.T) {
	t.Parallel()
	b, err := NewCircuitBreaker(CircuitBreakerConfig{FailureThreshold: 1, OpenTimeout: time.Minute}, nil)
	require.NoError(t, err)
	now := time.Now()
	b.now = func() time.Time { return now }
	fail := true
	h := b.Middleware(func(*message.Message) ([]*message.Message, error) {
		if fail {
			return nil, errors.New("down")
		}
		return nil, nil
	})
	_, _ = h(handlerMsg())
	require.Equal(t, BreakerOpen, b.State())
	now = now.Add(2 * time.Minute)
	fail = false
	_, err = h(handlerMsg())
	require.NoError(t, err)
	assert.Equal(t, BreakerClosed, b.State())
}

func TestCircuitBreaker_PermanentFailuresDoNotTripIt(t *testing.T) {
	t.Parallel()
	b, err := NewCircuitBreaker(CircuitBreakerConfig{FailureThreshold: 2}, nil)
	require.NoError(t, err)
	h := b.Middleware(func(*message.Message) ([]*message.Message, error) {
		return nil, bus.Permanent(errors.New("bad payload"))
	})
	for i := 0; i < 5; i++ {
		_, _ = h(handlerMsg())
	}
	assert.Equal(t, BreakerClosed, b.State())
}
