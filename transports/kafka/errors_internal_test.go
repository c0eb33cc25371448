package kafka

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"

	"github.com/IBM/sarama"
	"github.com/stretchr/testify/assert"

	"github.com/omnibus-go/omnibus/bus"
)

const (
	counted   = bus.ClassCounted
	transient = bus.ClassTransient
	permanent = bus.ClassPermanent
)

// kerrorClasses is the class of every KError sarama defines, as
// classifyProduceError decides it. Transient: the state of the cluster, the
// connection or the producer session, the same for any record (Kafka's
// retriable errors, authorization). Permanent: the destination itself is
// invalid. Counted: the broker rejected the batch for what it carries, or
// answered with something a produce request never gets.
var kerrorClasses = map[sarama.KError]bus.Class{
	sarama.ErrUnknown:                            counted,
	sarama.ErrNoError:                            counted, // never returned as an error
	sarama.ErrOffsetOutOfRange:                   counted,
	sarama.ErrInvalidMessage:                     counted, // CORRUPT_MESSAGE after the producer's own retries
	sarama.ErrUnknownTopicOrPartition:            transient,
	sarama.ErrInvalidMessageSize:                 counted,
	sarama.ErrLeaderNotAvailable:                 transient,
	sarama.ErrNotLeaderForPartition:              transient,
	sarama.ErrRequestTimedOut:                    transient,
	sarama.ErrBrokerNotAvailable:                 transient,
	sarama.ErrReplicaNotAvailable:                transient,
	sarama.ErrMessageSizeTooLarge:                counted,
	sarama.ErrStaleControllerEpochCode:           transient,
	sarama.ErrOffsetMetadataTooLarge:             counted,
	sarama.ErrNetworkException:                   transient,
	sarama.ErrOffsetsLoadInProgress:              transient,
	sarama.ErrConsumerCoordinatorNotAvailable:    transient,
	sarama.ErrNotCoordinatorForConsumer:          transient,
	sarama.ErrInvalidTopic:                       permanent,
	sarama.ErrMessageSetSizeTooLarge:             counted,
	sarama.ErrNotEnoughReplicas:                  transient,
	sarama.ErrNotEnoughReplicasAfterAppend:       transient,
	sarama.ErrInvalidRequiredAcks:                counted,
	sarama.ErrIllegalGeneration:                  counted,
	sarama.ErrInconsistentGroupProtocol:          counted,
	sarama.ErrInvalidGroupId:                     counted,
	sarama.ErrUnknownMemberId:                    counted,
	sarama.ErrInvalidSessionTimeout:              counted,
	sarama.ErrRebalanceInProgress:                transient,
	sarama.ErrInvalidCommitOffsetSize:            counted,
	sarama.ErrTopicAuthorizationFailed:           transient,
	sarama.ErrGroupAuthorizationFailed:           transient,
	sarama.ErrClusterAuthorizationFailed:         transient,
	sarama.ErrInvalidTimestamp:                   counted,
	sarama.ErrUnsupportedSASLMechanism:           transient,
	sarama.ErrIllegalSASLState:                   transient,
	sarama.ErrUnsupportedVersion:                 counted,
	sarama.ErrTopicAlreadyExists:                 counted,
	sarama.ErrInvalidPartitions:                  counted,
	sarama.ErrInvalidReplicationFactor:           counted,
	sarama.ErrInvalidReplicaAssignment:           counted,
	sarama.ErrInvalidConfig:                      counted,
	sarama.ErrNotController:                      transient,
	sarama.ErrInvalidRequest:                     counted,
	sarama.ErrUnsupportedForMessageFormat:        counted,
	sarama.ErrPolicyViolation:                    counted,
	sarama.ErrOutOfOrderSequenceNumber:           transient,
	sarama.ErrDuplicateSequenceNumber:            transient,
	sarama.ErrInvalidProducerEpoch:               transient,
	sarama.ErrInvalidTxnState:                    transient,
	sarama.ErrInvalidProducerIDMapping:           transient,
	sarama.ErrInvalidTransactionTimeout:          counted,
	sarama.ErrConcurrentTransactions:             transient,
	sarama.ErrTransactionCoordinatorFenced:       transient,
	sarama.ErrTransactionalIDAuthorizationFailed: transient,
	sarama.ErrSecurityDisabled:                   counted,
	sarama.ErrOperationNotAttempted:              transient,
	sarama.ErrKafkaStorageError:                  transient,
	sarama.ErrLogDirNotFound:                     counted,
	sarama.ErrSASLAuthenticationFailed:           transient,
	sarama.ErrUnknownProducerID:                  transient,
	sarama.ErrReassignmentInProgress:             transient,
	sarama.ErrDelegationTokenAuthDisabled:        counted,
	sarama.ErrDelegationTokenNotFound:            counted,
	sarama.ErrDelegationTokenOwnerMismatch:       counted,
	sarama.ErrDelegationTokenRequestNotAllowed:   counted,
	sarama.ErrDelegationTokenAuthorizationFailed: transient,
	sarama.ErrDelegationTokenExpired:             transient,
	sarama.ErrInvalidPrincipalType:               counted,
	sarama.ErrNonEmptyGroup:                      counted,
	sarama.ErrGroupIDNotFound:                    counted,
	sarama.ErrFetchSessionIDNotFound:             transient,
	sarama.ErrInvalidFetchSessionEpoch:           transient,
	sarama.ErrListenerNotFound:                   transient,
	sarama.ErrTopicDeletionDisabled:              counted,
	sarama.ErrFencedLeaderEpoch:                  transient,
	sarama.ErrUnknownLeaderEpoch:                 transient,
	sarama.ErrUnsupportedCompressionType:         counted,
	sarama.ErrStaleBrokerEpoch:                   transient,
	sarama.ErrOffsetNotAvailable:                 transient,
	sarama.ErrMemberIdRequired:                   counted,
	sarama.ErrPreferredLeaderNotAvailable:        transient,
	sarama.ErrGroupMaxSizeReached:                counted,
	sarama.ErrFencedInstancedId:                  counted,
	sarama.ErrEligibleLeadersNotAvailable:        transient,
	sarama.ErrElectionNotNeeded:                  counted,
	sarama.ErrNoReassignmentInProgress:           counted,
	sarama.ErrGroupSubscribedToTopic:             counted,
	sarama.ErrInvalidRecord:                      counted,
	sarama.ErrUnstableOffsetCommit:               transient,
	sarama.ErrThrottlingQuotaExceeded:            transient,
	sarama.ErrProducerFenced:                     transient,
	sarama.ErrInvalidUpdateVersion:               counted,
}

// TestClassifyProduceError_EveryKError checks the class of every KError
// sarama defines, bare and as the producer and the client wrap them.
func TestClassifyProduceError_EveryKError(t *testing.T) {
	t.Parallel()
	for kerr, want := range kerrorClasses {
		t.Run(fmt.Sprintf("%d", int16(kerr)), func(t *testing.T) {
			t.Parallel()
			got := classifyProduceError("orders", kerr)
			assert.Equal(t, want, bus.ClassOf(got), "class of KError %d (%v)", int16(kerr), kerr)
			assert.ErrorIs(t, got, kerr, "the broker's error is kept in the chain")
			wrapped := classifyProduceError("orders", fmt.Errorf("produce: %w", kerr))
			assert.Equal(t, want, bus.ClassOf(wrapped), "class of wrapped KError %d", int16(kerr))
		})
	}
}

// TestClassifyProduceError_TableCoversEverySaramaKError fails when sarama
// defines a KError the table above does not classify: a new sarama version
// must be audited, not defaulted silently.
func TestClassifyProduceError_TableCoversEverySaramaKError(t *testing.T) {
	t.Parallel()
	// sarama v1.61 defines the codes -1..90 and 95.
	for code := int16(-1); code <= 95; code++ {
		if code > 90 && code < 95 {
			continue
		}
		_, ok := kerrorClasses[sarama.KError(code)]
		assert.True(t, ok, "KError %d (%v) has no class in the table", code, sarama.KError(code))
	}
}

type timeoutErr struct{}

func (timeoutErr) Error() string   { return "i/o timeout" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }

var _ net.Error = timeoutErr{}

// TestClassifyProduceError_ClientErrors checks the errors that are not a
// broker's answer: sarama's own, the network's, the context's, and the
// defaults for an unknown KError and an unknown error.
func TestClassifyProduceError_ClientErrors(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		err  error
		want bus.Class
	}{
		{"out of brokers", sarama.ErrOutOfBrokers, transient},
		{"out of brokers wrapping a broker error", sarama.Wrap(sarama.ErrOutOfBrokers, sarama.ErrInvalidRecord), transient},
		{"not connected", sarama.ErrNotConnected, transient},
		{"shutting down", sarama.ErrShuttingDown, transient},
		{"closed client", sarama.ErrClosedClient, transient},
		{"broker not found", sarama.ErrBrokerNotFound, transient},
		{"incomplete response", sarama.ErrIncompleteResponse, transient},
		{"controller not available", sarama.ErrControllerNotAvailable, transient},
		{"retry buffer overflow", sarama.ErrProducerRetryBufferOverflow, transient},
		{"insufficient data", sarama.ErrInsufficientData, transient},
		{"response not decodable", sarama.PacketDecodingError{Info: "bad CRC"}, transient},
		{"connection refused", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, transient},
		{"connection reset", &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}, transient},
		{"network timeout", timeoutErr{}, transient},
		{"EOF", io.EOF, transient},
		{"unexpected EOF", io.ErrUnexpectedEOF, transient},
		{"deadline exceeded", context.DeadlineExceeded, transient},
		{"cancelled", context.Canceled, transient},
		{"closed publisher", ErrClosed, transient},
		{"record larger than MaxMessageBytes", sarama.ConfigurationError("Attempt to produce message larger than configured Producer.MaxMessageBytes: 2 > 1"), permanent},
		{"request not encodable", sarama.PacketEncodingError{Info: "invalid array length"}, counted},
		{"partitioner out of range", sarama.ErrInvalidPartition, counted},
		{"default: a KError sarama does not define", sarama.KError(9999), counted},
		{"default: any other error", errors.New("something else"), transient},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := classifyProduceError("orders", tc.err)
			assert.Equal(t, tc.want, bus.ClassOf(got), "class of %v", tc.err)
			assert.ErrorIs(t, got, tc.err, "the original error is kept in the chain")
			assert.Contains(t, got.Error(), `kafka topic "orders"`, "the error names the topic")
		})
	}
}
