package main

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/bus"
)

// openWhenReachable opens the Bus of a serving command (relay, ingest). A
// PostgreSQL or a broker that is down at start is waited for, as an outage
// while running is: each failed attempt is logged at Warn with the reason
// (passwords redacted), with bus.ConnectBackoff between attempts (100 ms
// doubling to 5 s). PostgreSQL is waited for here; the broker by the Bus,
// which connects in the background (bus.OpenBroker). Errors that waiting will not
// fix (bad configuration, a server refusing the credentials) end the wait at
// once. When ctx ends (SIGINT, SIGTERM) it returns nil and no Bus: the
// command stops cleanly.
func openWhenReachable(ctx context.Context, cfg bus.Config, logger *slog.Logger) (*omnibus.Bus, error) {
	var b *omnibus.Bus
	err := waitReachable(ctx, logger, "PostgreSQL", func(ctx context.Context) error {
		var err error
		b, err = omnibus.Open(ctx, cfg, omnibus.WithLogger(logger))
		return err
	})
	if err == nil {
		if err = b.WaitBroker(ctx); err != nil {
			_ = b.Close()
		}
	}
	switch {
	case err == nil:
		return b, nil
	case ctx.Err() != nil:
		logger.Info("stopped while waiting to start", "reason", context.Cause(ctx))
		return nil, nil
	default:
		return nil, err
	}
}

// waitReachable calls open until it succeeds or fails with an error that is
// not transient (which it returns), or until ctx ends (ctx's error). After
// each transient failure it logs the reason at Warn and waits
// bus.ConnectBackoff.
func waitReachable(ctx context.Context, logger *slog.Logger, what string, open func(context.Context) error) error {
	for n := 1; ; n++ {
		err := open(ctx)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return errors.Join(ctx.Err(), err)
		}
		if bus.ClassOf(err) != bus.ClassTransient {
			return err
		}
		wait := bus.ConnectBackoff(n)
		logger.Warn("omnibus: "+what+" unreachable; waiting before starting",
			"attempt", n, "retry_in", wait, "error", bus.RedactDSN(err.Error()))
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}
