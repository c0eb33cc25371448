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

// classifyProduceError marks a produce error with its failure class
// (DESIGN §3), per error:
//
//   - transient (no attempt spent) when the error is the state of the
//     cluster, the connection or the producer session, the same whatever the
//     record: no broker reachable, the client or producer closing, leadership
//     moving, not enough in-sync replicas, request timed out, throttled, a
//     topic not created yet, producer ids and epochs being reset, and
//     authentication or authorization failures (an ACL is fixed for every
//     record at once; counting would fail the whole backlog of the topic, and
//     requeueing it would deliver its keys out of order). Errors that are not
//     a broker's answer (network errors, sarama's breaker) are transient too,
//     except the few below that sarama raises for the record itself.
//   - permanent (no retry) when the record can never be written: larger than
//     MaxMessageBytes (sarama checks each record on its own before batching)
//     or a topic name the broker calls invalid.
//   - counted (one attempt) when the broker rejected the batch for what it
//     carries (too large for the broker, invalid or corrupt record, timestamp
//     out of range, policy violation, a format or compression the topic does
//     not support) or the batch could not be encoded. The broker rejects a
//     whole partition batch, and the producer batches the records of
//     concurrent Publish calls together, so the record at fault cannot be
//     told from its neighbours: counted lets a neighbour through on its next
//     try while the record at fault spends its budget. Any KError not named
//     here is counted too, so that an unexpected rejection reaches the
//     attempt budget instead of holding its key back forever.
func classifyProduceError(topic string, err error) error {
	wrapped := fmt.Errorf("publish to kafka topic %q: %w", topic, err)
	switch produceErrorClass(err) {
	case bus.ClassPermanent:
		return bus.Permanent(wrapped)
	case bus.ClassTransient:
		return bus.Transient(wrapped)
	default:
		return wrapped
	}
}

// clientErrors are sarama's errors for a request that got no answer (or a
// client that is going away): transient, whatever they wrap.
var clientErrors = []error{
	sarama.ErrOutOfBrokers,
	sarama.ErrNotConnected,
	sarama.ErrShuttingDown,
	sarama.ErrClosedClient,
	sarama.ErrBrokerNotFound,
	sarama.ErrIncompleteResponse,
	sarama.ErrControllerNotAvailable,
	sarama.ErrProducerRetryBufferOverflow,
	sarama.ErrInsufficientData,
	ErrClosed,
}

// transientKErrors are the broker answers that describe the cluster, the
// connection or the producer session rather than the record. They are
// Kafka's retriable errors plus authorization and producer-state errors.
var transientKErrors = map[sarama.KError]bool{
	sarama.ErrUnknownTopicOrPartition:            true, // not created yet, or metadata behind
	sarama.ErrLeaderNotAvailable:                 true,
	sarama.ErrNotLeaderForPartition:              true,
	sarama.ErrRequestTimedOut:                    true,
	sarama.ErrBrokerNotAvailable:                 true,
	sarama.ErrReplicaNotAvailable:                true,
	sarama.ErrStaleControllerEpochCode:           true,
	sarama.ErrNetworkException:                   true,
	sarama.ErrOffsetsLoadInProgress:              true,
	sarama.ErrConsumerCoordinatorNotAvailable:    true,
	sarama.ErrNotCoordinatorForConsumer:          true,
	sarama.ErrNotEnoughReplicas:                  true,
	sarama.ErrNotEnoughReplicasAfterAppend:       true,
	sarama.ErrRebalanceInProgress:                true,
	sarama.ErrTopicAuthorizationFailed:           true,
	sarama.ErrGroupAuthorizationFailed:           true,
	sarama.ErrClusterAuthorizationFailed:         true,
	sarama.ErrUnsupportedSASLMechanism:           true,
	sarama.ErrIllegalSASLState:                   true,
	sarama.ErrNotController:                      true,
	sarama.ErrOutOfOrderSequenceNumber:           true, // the producer bumps its epoch and goes on
	sarama.ErrDuplicateSequenceNumber:            true,
	sarama.ErrInvalidProducerEpoch:               true,
	sarama.ErrInvalidTxnState:                    true,
	sarama.ErrInvalidProducerIDMapping:           true,
	sarama.ErrConcurrentTransactions:             true,
	sarama.ErrTransactionCoordinatorFenced:       true,
	sarama.ErrTransactionalIDAuthorizationFailed: true,
	sarama.ErrOperationNotAttempted:              true,
	sarama.ErrKafkaStorageError:                  true,
	sarama.ErrSASLAuthenticationFailed:           true,
	sarama.ErrUnknownProducerID:                  true,
	sarama.ErrReassignmentInProgress:             true,
	sarama.ErrDelegationTokenAuthorizationFailed: true,
	sarama.ErrDelegationTokenExpired:             true,
	sarama.ErrFetchSessionIDNotFound:             true,
	sarama.ErrInvalidFetchSessionEpoch:           true,
	sarama.ErrListenerNotFound:                   true,
	sarama.ErrFencedLeaderEpoch:                  true,
	sarama.ErrUnknownLeaderEpoch:                 true,
	sarama.ErrStaleBrokerEpoch:                   true,
	sarama.ErrOffsetNotAvailable:                 true,
	sarama.ErrPreferredLeaderNotAvailable:        true,
	sarama.ErrEligibleLeadersNotAvailable:        true,
	sarama.ErrUnstableOffsetCommit:               true,
	sarama.ErrThrottlingQuotaExceeded:            true,
	sarama.ErrProducerFenced:                     true,
}

func produceErrorClass(err error) bus.Class {
	for _, ce := range clientErrors {
		if errors.Is(err, ce) {
			return bus.ClassTransient
		}
	}
	var (
		kerr   sarama.KError
		cfgErr sarama.ConfigurationError
		encErr sarama.PacketEncodingError
	)
	switch {
	case errors.As(err, &kerr):
		switch {
		case transientKErrors[kerr]:
			return bus.ClassTransient
		case kerr == sarama.ErrInvalidTopic:
			return bus.ClassPermanent
		default:
			return bus.ClassCounted
		}
	case errors.As(err, &cfgErr):
		// On the produce path sarama raises it for one record only: larger
		// than Producer.MaxMessageBytes (headers on brokers older than 0.11,
		// the other case, are refused by Validate).
		return bus.ClassPermanent
	case errors.As(err, &encErr), errors.Is(err, sarama.ErrInvalidPartition):
		return bus.ClassCounted
	default:
		return bus.ClassTransient
	}
}
