package nats

import (
	"context"
	"errors"
	"io"
	"net"
	"syscall"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/omnibus-go/omnibus/bus"
)

// ErrClosed is returned by a closed Publisher or Subscriber.
var ErrClosed = errors.New("nats: closed")

// classify marks err transient when it is an outage rather than a refusal of
// this message: NATS unreachable or reconnecting, JetStream not answering
// (no stream responded, a timeout), the connection closed. An attempt is not
// spent on those.
func classify(err error) error {
	if err == nil || !isTransient(err) {
		return err
	}
	return bus.Transient(err)
}

func isTransient(err error) bool {
	var netErr net.Error
	switch {
	case errors.As(err, &netErr), errors.Is(err, io.EOF), errors.Is(err, syscall.ECONNREFUSED),
		errors.Is(err, syscall.ECONNRESET), errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, natsgo.ErrConnectionClosed), errors.Is(err, natsgo.ErrNoServers),
		errors.Is(err, natsgo.ErrTimeout), errors.Is(err, natsgo.ErrNoResponders),
		errors.Is(err, natsgo.ErrConnectionReconnecting), errors.Is(err, natsgo.ErrDisconnected),
		errors.Is(err, jetstream.ErrNoStreamResponse), errors.Is(err, jetstream.ErrAsyncPublishTimeout),
		errors.Is(err, jetstream.ErrJetStreamNotEnabled), errors.Is(err, ErrClosed):
		return true
	}
	var apiErr *jetstream.APIError
	// 503: JetStream temporarily unavailable (no quorum, restarting).
	return errors.As(err, &apiErr) && apiErr.Code == 503
}
