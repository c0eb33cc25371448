package handout

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func leaseUntil(until *atomic.Int64) func() time.Duration {
	return func() time.Duration { return time.Duration(until.Load() - time.Now().UnixNano()) }
}

func TestSend_HandsOutWhileTheLeaseHolds(t *testing.T) {
	t.Parallel()
	out := make(chan int)
	var until atomic.Int64
	until.Store(time.Now().Add(time.Hour).UnixNano())
	var timer Timer
	sent := make(chan bool, 1)
	go func() { sent <- Send(out, 1, leaseUntil(&until), nil, nil, &timer) }()
	time.Sleep(50 * time.Millisecond) // Send waits for the consumer
	assert.Equal(t, 1, <-out)
	assert.True(t, <-sent)
}

func TestSend_GivesUpWhenTheLeaseEndsWhileItWaits(t *testing.T) {
	t.Parallel()
	out := make(chan int)
	var until atomic.Int64
	until.Store(time.Now().Add(100 * time.Millisecond).UnixNano())
	var timer Timer
	sent := make(chan bool, 1)
	go func() { sent <- Send(out, 1, leaseUntil(&until), nil, nil, &timer) }()
	select {
	case ok := <-sent:
		assert.False(t, ok)
	case <-time.After(5 * time.Second):
		t.Fatal("Send still waits after the lease ended")
	}
	select {
	case v := <-out:
		t.Fatalf("handed out %d after the lease ended", v)
	default:
	}
}

func TestSend_WaitsOnWhileRenewalsExtendTheLease(t *testing.T) {
	t.Parallel()
	out := make(chan int)
	var until atomic.Int64
	until.Store(time.Now().Add(50 * time.Millisecond).UnixNano())
	stop := make(chan struct{})
	defer close(stop)
	go func() { // renews every 20 ms
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
				until.Store(time.Now().Add(50 * time.Millisecond).UnixNano())
			}
		}
	}()
	var timer Timer
	sent := make(chan bool, 1)
	go func() { sent <- Send(out, 1, leaseUntil(&until), nil, nil, &timer) }()
	time.Sleep(300 * time.Millisecond) // six lease lengths
	assert.Equal(t, 1, <-out)
	assert.True(t, <-sent)
}

func TestSend_GivesUpWhenDoneOrLost(t *testing.T) {
	t.Parallel()
	forever := func() time.Duration { return time.Hour }
	for _, name := range []string{"done", "lost"} {
		out := make(chan int)
		c := make(chan struct{})
		done, lost := c, (chan struct{})(nil)
		if name == "lost" {
			done, lost = nil, c
		}
		var timer Timer
		sent := make(chan bool, 1)
		go func() { sent <- Send(out, 1, forever, done, lost, &timer) }()
		time.Sleep(20 * time.Millisecond)
		close(c)
		select {
		case ok := <-sent:
			assert.False(t, ok, name)
		case <-time.After(5 * time.Second):
			t.Fatalf("Send still waits after %s was closed", name)
		}
	}
}
