package rabbitmq

import (
	"context"
	"errors"
	"io"
	"net"
	"syscall"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/omnibus-go/omnibus/bus"
)

// ErrClosed is returned by a closed Publisher or Subscriber.
var ErrClosed = errors.New("rabbitmq: closed")

// classify marks err transient when it is an outage rather than a refusal of
// this message: RabbitMQ unreachable, the connection or channel lost, the
// server closing it for a while (connection-forced, resource alarms), a
// confirm it never sent. An attempt is not spent on those.
func classify(err error) error {
	if err == nil || !isTransient(err) {
		return err
	}
	return bus.Transient(err)
}

func isTransient(err error) bool {
	var netErr net.Error
	var amqpErr *amqp.Error
	switch {
	case errors.As(err, &netErr), errors.Is(err, io.EOF), errors.Is(err, syscall.ECONNREFUSED),
		errors.Is(err, syscall.ECONNRESET), errors.Is(err, amqp.ErrClosed),
		errors.Is(err, context.DeadlineExceeded), errors.Is(err, ErrClosed), errors.Is(err, errNotConfirmed):
		return true
	case errors.As(err, &amqpErr):
		switch amqpErr.Code {
		case amqp.ConnectionForced, amqp.ResourceError, amqp.InternalError, amqp.ChannelError,
			amqp.AccessRefused, amqp.FrameError, amqp.UnexpectedFrame:
			return true
		}
	}
	return false
}

// errNotConfirmed is a publish the broker nacked: it did not take the
// message (an internal error of the queue); it may take it again.
var errNotConfirmed = errors.New("rabbitmq: the broker did not confirm the message")
