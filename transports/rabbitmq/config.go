package rabbitmq

import (
	"crypto/tls"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"time"

	"github.com/omnibus-go/omnibus/bus"
)

// Defaults of PublisherConfig and SubscriberConfig.
const (
	DefaultURL       = "amqp://guest:guest@127.0.0.1:5672/"
	DefaultShards    = 1
	DefaultHeartbeat = 10 * time.Second
	DefaultPrefetch  = 100
	DefaultNackDelay = time.Second
	DefaultChannels  = 4
	// DefaultDeadLetterSuffix names a group's dead-letter queue: the
	// group's queue prefix followed by it.
	DefaultDeadLetterSuffix = ".dead-letter"
)

// ConnectionConfig is how a Publisher or Subscriber reaches RabbitMQ.
type ConnectionConfig struct {
	// URL is the AMQP URL (amqp:// or amqps://, with credentials and vhost).
	// Default DefaultURL.
	URL string
	// TLS is used for amqps:// URLs; nil uses the system roots.
	TLS *tls.Config
	// Heartbeat is the AMQP heartbeat interval. RabbitMQ closes a connection
	// that misses two; a Subscriber hands nothing out while it has heard
	// nothing from the server for longer than Heartbeat (see the package
	// documentation, Fencing). Default DefaultHeartbeat.
	Heartbeat time.Duration
	// ExchangePrefix is prepended to a topic to name its exchange (and the
	// queues of its groups). Default "".
	ExchangePrefix string
	// Shards is the number of queues a topic's messages are spread over per
	// consumer group, by partition key (bus.ShardOf). Every publisher and
	// subscriber of a topic must use the same count; it is recorded on the
	// topic's exchange. Default DefaultShards.
	Shards int
	// QueueExpires, when set, makes RabbitMQ delete a group's queues that
	// have had no consumer for this long (x-expires), messages included.
	// For test and short-lived groups; default 0: queues stay.
	QueueExpires time.Duration
}

func (c *ConnectionConfig) setDefaults() {
	if c.URL == "" {
		c.URL = DefaultURL
	}
	if c.Heartbeat == 0 {
		c.Heartbeat = DefaultHeartbeat
	}
	if c.Shards == 0 {
		c.Shards = DefaultShards
	}
}

func (c ConnectionConfig) validate() error {
	switch {
	case c.Shards < 1 || c.Shards > bus.MaxShards:
		return invalid("Shards", "%d is not between 1 and %d", c.Shards, bus.MaxShards)
	case c.Heartbeat < time.Second:
		return invalid("Heartbeat", "%s is under 1s", c.Heartbeat)
	case c.QueueExpires < 0 || c.QueueExpires > 0 && c.QueueExpires < time.Second:
		return invalid("QueueExpires", "%s is negative or under 1s", c.QueueExpires)
	}
	return nil
}

// PublisherConfig configures a Publisher.
type PublisherConfig struct {
	ConnectionConfig
	// Groups are the consumer groups whose queues the Publisher declares
	// (and binds) when it first publishes to a topic, so that messages
	// published before a group's first subscriber are kept for it. A message
	// that reaches no queue at all is refused (mandatory publishing), never
	// dropped.
	Groups []string
	// Channels is how many AMQP channels publish at once. Default
	// DefaultChannels.
	Channels int
}

func (c *PublisherConfig) setDefaults() {
	c.ConnectionConfig.setDefaults()
	if c.Channels == 0 {
		c.Channels = DefaultChannels
	}
}

// Validate reports the first invalid field as a *bus.ConfigError.
func (c PublisherConfig) Validate() error {
	if err := c.ConnectionConfig.validate(); err != nil {
		return err
	}
	if c.Channels < 1 {
		return invalid("Channels", "%d is under 1", c.Channels)
	}
	for i, g := range c.Groups {
		if err := checkName(g); err != nil {
			return invalid(fmt.Sprintf("Groups[%d]", i), "%v", err)
		}
	}
	return nil
}

// SubscriberConfig configures a Subscriber.
type SubscriberConfig struct {
	ConnectionConfig
	// ConsumerGroup is the group the Subscriber receives as: each group has
	// its queues, and within a group each shard's queue has one active
	// consumer at a time (single-active-consumer). Required.
	ConsumerGroup string
	// Consumer names this Subscriber's consumers. Default: the host name and
	// a random suffix.
	Consumer string
	// Prefetch bounds the unacknowledged messages per shard queue (AMQP
	// basic.qos). Default DefaultPrefetch.
	Prefetch int
	// NackDelay is how long a nacked message waits before it is handed out
	// again when its settlement names no retry time. Default
	// DefaultNackDelay.
	NackDelay time.Duration
}

func (c *SubscriberConfig) setDefaults() {
	c.ConnectionConfig.setDefaults()
	if c.Consumer == "" {
		host, _ := os.Hostname()
		c.Consumer = host + "-" + strconv.FormatUint(rand.Uint64()%1e8, 36)
	}
	if c.Prefetch == 0 {
		c.Prefetch = DefaultPrefetch
	}
	if c.NackDelay == 0 {
		c.NackDelay = DefaultNackDelay
	}
}

// Validate reports the first invalid field as a *bus.ConfigError.
func (c SubscriberConfig) Validate() error {
	if err := c.ConnectionConfig.validate(); err != nil {
		return err
	}
	if err := checkName(c.ConsumerGroup); err != nil {
		return invalid("ConsumerGroup", "%v", err)
	}
	switch {
	case c.Prefetch < 1 || c.Prefetch > 65535:
		return invalid("Prefetch", "%d is not between 1 and 65535", c.Prefetch)
	case c.NackDelay < 0:
		return invalid("NackDelay", "negative (%s)", c.NackDelay)
	}
	return nil
}

// checkName checks a consumer group, which becomes part of queue names.
func checkName(s string) error {
	switch {
	case s == "":
		return errors.New("empty")
	case len(s) > 100:
		return fmt.Errorf("%d bytes, over 100", len(s))
	}
	for _, r := range s {
		if r < 0x21 || r == 0x7f {
			return fmt.Errorf("%q contains a space or control character", s)
		}
	}
	return nil
}

func invalid(field, format string, args ...any) error {
	return &bus.ConfigError{Field: field, Reason: fmt.Sprintf(format, args...)}
}
