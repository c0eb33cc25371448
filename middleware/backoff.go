package middleware

import (
	"fmt"
	"math/rand/v2"
	"time"
)

// Backoff returns the delay before the next try of a message that has
// already failed attempt times (0 for the first failure), with equal jitter:
// d = min(cap, base·2^attempt), delay = d/2 + uniform(0, d/2). The delay is
// never below half the nominal one, unlike full jitter, which can draw
// almost nothing on any attempt. base = 0 means "retry at once".
func Backoff(attempt int, base, cap time.Duration) (time.Duration, error) {
	lo, hi, err := BackoffBounds(attempt, base, cap)
	if err != nil {
		return 0, err
	}
	if hi == lo {
		return lo, nil
	}
	return lo + rand.N(hi-lo+1), nil
}

// BackoffBounds returns the interval [d/2, d] Backoff draws from.
func BackoffBounds(attempt int, base, cap time.Duration) (lo, hi time.Duration, err error) {
	switch {
	case attempt < 0:
		return 0, 0, fmt.Errorf("backoff: attempt must not be negative, got %d", attempt)
	case base < 0:
		return 0, 0, fmt.Errorf("backoff: base must not be negative, got %s", base)
	case cap < 0:
		return 0, 0, fmt.Errorf("backoff: cap must not be negative, got %s", cap)
	case cap < base:
		return 0, 0, fmt.Errorf("backoff: cap %s is below base %s", cap, base)
	}
	d := base
	for i := 0; i < attempt && d < cap; i++ {
		d *= 2
	}
	d = min(d, cap)
	return d / 2, d, nil
}
