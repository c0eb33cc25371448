package testenv

import (
	"fmt"
	"testing"
	"time"
)

// PollInterval is how often Eventually checks its condition.
const PollInterval = 10 * time.Millisecond

// Eventually checks cond every PollInterval until it returns true, and fails
// the test with t.Fatalf when timeout passes first. The failure names the
// timeout and the message built from format and args, which should say what
// was awaited ("3 rows completed"). cond is checked once more at the
// deadline, so a condition that becomes true while the last interval passes
// still counts. Eventually returns as soon as cond holds, without waiting.
func Eventually(t testing.TB, timeout time.Duration, cond func() bool, format string, args ...any) {
	t.Helper()
	if cond() {
		return
	}
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(PollInterval)
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
			if cond() {
				return
			}
		case <-deadline.C:
			if cond() {
				return
			}
			t.Fatalf("not true within %s: %s", timeout, fmt.Sprintf(format, args...))
			return
		}
	}
}
