package example

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/omnibus-go/omnibus/processors"
	"github.com/omnibus-go/omnibus/transports/postgres"
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

// RelayInOrder runs an outbox relay from outboxTable to pub until total
// events have arrived, checks them with InOrder, and stops the relay. It
// returns how many each consumer handled.
func RelayInOrder(ctx context.Context, pool *pgxpool.Pool, pub message.Publisher, outboxTable string, logger *slog.Logger,
	arrived <-chan Arrival, total int, steps []string) (map[string]int, error) {
	relay, err := processors.NewOutboxRelay(pool, processors.OutboxRelayConfig{
		Publisher:  pub,
		Subscriber: postgres.SubscriberConfig{Table: outboxTable},
	}, logger)
	if err != nil {
		return nil, err
	}
	running := Start(ctx, relay)
	defer running.Stop()
	perConsumer, err := InOrder(ctx, arrived, total, steps)
	if err != nil {
		return nil, err
	}
	return perConsumer, running.Stop()
}
