// Package handout hands a message to a consumer under a lease: the send
// gives up once the lease ends, whether before or while the message waits
// for the consumer to take it. A transport that checked its lease only
// before a blocking send handed the message out whenever the consumer came
// for it, a process paused past its lease included, when another consumer
// could hold the key or shard by then.
package handout

import "time"

// Timer is the timer Send waits with, made on first use and reused. Its
// zero value is ready. It is not for concurrent use.
type Timer struct{ t *time.Timer }

// Send sends v on out and reports whether it did. It does not once done or
// lost is closed (either may be nil), nor once left, how long the lease is
// surely held from now as far as the caller knows (a renewal may extend
// it), is not positive. It looks at left again each time the time it gave
// has passed.
func Send[T any](out chan<- T, v T, left func() time.Duration, done, lost <-chan struct{}, t *Timer) bool {
	for {
		d := left()
		if d <= 0 {
			return false
		}
		select {
		case out <- v:
			return true
		case <-done:
			return false
		case <-lost:
			return false
		default:
		}
		if t.t == nil {
			t.t = time.NewTimer(d)
		} else {
			t.t.Reset(d)
		}
		select {
		case out <- v:
			t.t.Stop()
			return true
		case <-done:
			t.t.Stop()
			return false
		case <-lost:
			t.t.Stop()
			return false
		case <-t.t.C:
			// The time given has passed: the lease ended unless it was
			// renewed meanwhile. (A stopped timer's channel holds nothing
			// since Go 1.23, so reuse needs no draining.)
		}
	}
}
