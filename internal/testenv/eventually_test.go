package testenv_test

import (
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus/internal/testenv"
)

// fakeTB records a Fatalf instead of ending the test, so a test can observe
// Eventually failing.
type fakeTB struct {
	testing.TB
	failed string
}

func (f *fakeTB) Helper() {}

func (f *fakeTB) Fatalf(format string, args ...any) { f.failed = fmt.Sprintf(format, args...) }

func TestEventually_ReturnsAsSoonAsTheConditionHolds(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	ft := &fakeTB{TB: t}
	start := time.Now()
	testenv.Eventually(ft, time.Minute, func() bool { return calls.Add(1) >= 3 }, "three calls")
	elapsed := time.Since(start)
	if ft.failed != "" {
		t.Fatalf("Eventually failed although the condition held: %s", ft.failed)
	}
	if got := calls.Load(); got != 3 {
		t.Fatalf("condition checked %d times, want 3 (it should stop at the first true)", got)
	}
	if elapsed > 10*time.Second {
		t.Fatalf("Eventually took %s for a condition true on the third check; it should return at once", elapsed)
	}
}

func TestEventually_FailsWithTheMessageAndTimeoutWhenTheConditionNeverHolds(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	ft := &fakeTB{TB: t}
	testenv.Eventually(ft, 50*time.Millisecond, func() bool { calls.Add(1); return false }, "%d rows completed", 3)
	if ft.failed == "" {
		t.Fatal("Eventually returned without failing for a condition that never held")
	}
	for _, want := range []string{"50ms", "3 rows completed"} {
		if !strings.Contains(ft.failed, want) {
			t.Errorf("failure %q does not mention %q", ft.failed, want)
		}
	}
	if calls.Load() < 2 {
		t.Errorf("condition checked %d times in 50ms; Eventually should poll it", calls.Load())
	}
}
