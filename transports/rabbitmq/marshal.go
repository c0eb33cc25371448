package rabbitmq

import (
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
)

// publishing is msg as an AMQP message: the UUID as message-id, the
// metadata as string headers, the payload as body, persistent.
func publishing(msg *message.Message) (amqp.Publishing, error) {
	if msg.UUID == "" {
		return amqp.Publishing{}, fmt.Errorf("message has no UUID (it becomes the AMQP message-id)")
	}
	headers := make(amqp.Table, len(msg.Metadata))
	for k, v := range msg.Metadata {
		if isBrokerHeader(k) {
			return amqp.Publishing{}, fmt.Errorf("message %s: metadata key %q is a header RabbitMQ sets itself", msg.UUID, k)
		}
		headers[k] = v
	}
	return amqp.Publishing{
		MessageId:    msg.UUID,
		Headers:      headers,
		Body:         msg.Payload,
		DeliveryMode: amqp.Persistent,
		Timestamp:    time.Now(),
	}, nil
}

// decode turns a delivery back into a message. A delivery without a
// message-id, or with a header that is not a string (not written by this
// transport), does not decode.
func decode(d amqp.Delivery) (*message.Message, error) {
	if d.MessageId == "" {
		return nil, fmt.Errorf("no message-id property")
	}
	msg := message.NewMessage(d.MessageId, d.Body)
	for k, v := range d.Headers {
		if isBrokerHeader(k) {
			continue
		}
		s, ok := v.(string)
		if !ok {
			return nil, fmt.Errorf("header %q is a %T, not a string", k, v)
		}
		msg.Metadata.Set(k, s)
	}
	return msg, nil
}

// brokerHeaders are the headers RabbitMQ sets on deliveries. They are not
// metadata, and a message whose metadata uses one of them is refused on
// publish.
var brokerHeaders = map[string]bool{
	"x-delivery-count": true, "x-death": true, "x-received-from": true,
	"x-first-death-exchange": true, "x-first-death-queue": true, "x-first-death-reason": true,
	"x-last-death-exchange": true, "x-last-death-queue": true, "x-last-death-reason": true,
}

func isBrokerHeader(k string) bool { return brokerHeaders[k] }

// deliveryCount is how many times RabbitMQ delivered d before (a quorum
// queue's x-delivery-count: the deliveries returned to the queue by a
// consumer that went away without settling them).
func deliveryCount(d amqp.Delivery) int {
	switch n := d.Headers["x-delivery-count"].(type) {
	case int64:
		return int(n)
	case int32:
		return int(n)
	case int:
		return n
	}
	return 0
}
