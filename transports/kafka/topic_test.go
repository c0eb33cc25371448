package kafka_test

import (
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/internal/testenv"
	"github.com/omnibus-go/omnibus/transports/kafka"
)

// Issue 25: Kafka refuses such topics only at publish time, after the row
// was written; the Publisher now refuses them first, as a permanent error
// naming the topic, so a relay fails the row at once with that reason.
func TestValidateTopic_KafkasOwnRule(t *testing.T) {
	t.Parallel()
	for topic, why := range map[string]string{
		"orders":                 "",
		"orders.v1_eu-2":         "",
		strings.Repeat("o", 249): "",
		"orders *?[x] ü/..":      "kafka topics may hold only ASCII letters, digits",
		"ord\x01ers":             "U+0001",
		"..":                     `kafka topics cannot be "." or ".."`,
		"commandes payées":       "kafka topics may hold only",
		strings.Repeat("o", 250): "over the limit of 249",
		"":                       "must not be empty",
	} {
		err := kafka.ValidateTopic(topic)
		if why == "" {
			assert.NoError(t, err, "%+q", topic)
			continue
		}
		if assert.Error(t, err, "%+q", topic) {
			assert.ErrorIs(t, err, bus.ErrInvalidTopic)
			assert.Contains(t, err.Error(), why)
		}
	}
}

func TestPublisher_InvalidTopicIsPermanentAndSendsNothing(t *testing.T) {
	t.Parallel()
	brokers := testenv.Kafka(t)
	pub := newPublisher(t, testPublisherConfig(brokers))
	err := pub.Publish("orders *?[x]", message.NewMessage(watermill.NewUUID(), []byte("x")))
	require.Error(t, err)
	assert.Equal(t, bus.ClassPermanent, bus.ClassOf(err), "class of %v", err)
	assert.ErrorIs(t, err, bus.ErrInvalidTopic)
	assert.Contains(t, err.Error(), `"orders *?[x]"`)
}
