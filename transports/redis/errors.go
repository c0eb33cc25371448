package redis

import (
	"context"
	"errors"
	"io"
	"net"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/redis/go-redis/v9"
)

// ErrClosed is returned by Publish and Subscribe after Close.
var ErrClosed = errors.New("redis transport: closed")

// classify marks err transient when it says Redis could not be reached or
// could not serve the command for now (connection refused or reset,
// timeouts, an exhausted pool, a server loading its data set or failing
// over). Any other error keeps its class.
func classify(err error) error {
	if err == nil || !isTransient(err) {
		return err
	}
	return bus.Transient(err)
}

func isTransient(err error) bool {
	var netErr net.Error
	switch {
	case errors.As(err, &netErr),
		errors.Is(err, io.EOF),
		errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, redis.ErrPoolTimeout),
		errors.Is(err, redis.ErrPoolExhausted),
		redis.IsLoadingError(err),
		redis.IsReadOnlyError(err),
		redis.IsClusterDownError(err),
		redis.IsTryAgainError(err),
		redis.IsMasterDownError(err),
		redis.IsMaxClientsError(err),
		redis.IsNoReplicasError(err):
		return true
	}
	return false
}
