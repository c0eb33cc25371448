package kafka

import (
	"errors"
	"fmt"

	"github.com/IBM/sarama"

	"github.com/omnibus-go/omnibus/bus"
)

// ErrClosed is returned by a Publisher or Subscriber used after Close. A
// Publish refused for it is classified transient: it spends no attempt of
// the message being relayed.
var ErrClosed = errors.New("kafka: closed")

// classifyProduceError marks a produce error with its failure class: records
// the broker can never accept (too large, invalid) are permanent; everything
// else (unreachable or restarting brokers, leadership changes, timeouts,
// authorization being fixed) is transient, so a relay spends no attempts
// while Kafka is unavailable.
func classifyProduceError(topic string, err error) error {
	wrapped := fmt.Errorf("publish to kafka topic %q: %w", topic, err)
	var cfgErr sarama.ConfigurationError
	switch {
	case errors.As(err, &cfgErr),
		errors.Is(err, sarama.ErrMessageSizeTooLarge),
		errors.Is(err, sarama.ErrInvalidMessage),
		errors.Is(err, sarama.ErrInvalidMessageSize),
		errors.Is(err, sarama.ErrInvalidTopic),
		errors.Is(err, sarama.ErrMessageSetSizeTooLarge),
		errors.Is(err, sarama.ErrInvalidRecord):
		return bus.Permanent(wrapped)
	default:
		return bus.Transient(wrapped)
	}
}
