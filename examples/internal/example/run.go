package example

import (
	"context"
	"errors"
	"sync"
)

// Runner is a processor that runs until its context ends: an
// OutboxRelay, an InboxIngest or a Dispatcher.
type Runner interface {
	Run(ctx context.Context) error
}

// Running is runners running in the background, started by Start.
type Running struct {
	cancel   context.CancelFunc
	wg       sync.WaitGroup
	failed   chan struct{}
	failOnce sync.Once
	mu       sync.Mutex
	errs     []error
}

// Start runs each runner in a goroutine of its own until Stop is called or
// ctx ends.
func Start(ctx context.Context, runners ...Runner) *Running {
	ctx, cancel := context.WithCancel(ctx)
	r := &Running{cancel: cancel, failed: make(chan struct{})}
	for _, runner := range runners {
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			if err := runner.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
				r.mu.Lock()
				r.errs = append(r.errs, err)
				r.mu.Unlock()
				r.failOnce.Do(func() { close(r.failed) })
			}
		}()
	}
	return r
}

// Failed is closed when a runner has returned an error, so that a loop
// waiting for the example's outcome can stop early (and call Stop for the
// error).
func (r *Running) Failed() <-chan struct{} { return r.failed }

// Stop ends the runners, waits for them to return and returns their errors,
// joined. It may be called again (deferred, say) and returns the same.
func (r *Running) Stop() error {
	r.cancel()
	r.wg.Wait()
	r.mu.Lock()
	defer r.mu.Unlock()
	return errors.Join(r.errs...)
}
