package example

import (
	"context"
	"fmt"
)

// Arrival is one event a consumer received: the order id it is keyed by and
// its step.
type Arrival struct{ Consumer, Key, Step string }

// InOrder reads total arrivals and checks that each key's steps come in the
// order of steps. It returns how many each consumer handled.
func InOrder(ctx context.Context, arrived <-chan Arrival, total int, steps []string) (map[string]int, error) {
	next := map[string]string{"": steps[0]}
	for i := 1; i < len(steps); i++ {
		next[steps[i-1]] = steps[i]
	}
	last := map[string]string{}
	perConsumer := map[string]int{}
	for i := range total {
		select {
		case a := <-arrived:
			if next[last[a.Key]] != a.Step {
				return nil, fmt.Errorf("%s: got %s after %q: out of order", a.Key, a.Step, last[a.Key])
			}
			last[a.Key] = a.Step
			perConsumer[a.Consumer]++
		case <-ctx.Done():
			return nil, fmt.Errorf("only %d of %d events delivered: %w", i, total, ctx.Err())
		}
	}
	return perConsumer, nil
}
