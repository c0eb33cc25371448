package processors

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/omnibus-go/omnibus/bus"
)

// runStandalone is Run for every processor: a router of its own with the
// processor's handler (addTo), run until ctx ends, then close (the
// processor's own resources: its subscriber, its pending batches). what
// names the processor in errors.
func runStandalone(ctx context.Context, what string, closeTimeout time.Duration, log *slog.Logger,
	addTo func(*message.Router) *message.Handler, closeFn func() error) error {
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: closeTimeout}, bus.WatermillLogger(log))
	if err != nil {
		return fmt.Errorf("%s router: %w", what, err)
	}
	addTo(router)
	err = router.Run(ctx)
	if cerr := closeFn(); err == nil {
		err = cerr
	}
	return err
}
