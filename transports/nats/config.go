package nats

import (
	"crypto/tls"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/omnibus-go/omnibus/bus"
)

// Defaults of the configurations.
const (
	DefaultURL             = "nats://127.0.0.1:4222"
	DefaultShards          = 1
	DefaultDuplicateWindow = 2 * time.Minute
	DefaultBucket          = "omnibus_shards"
	DefaultTimeout         = 10 * time.Second
	DefaultShardLease      = 10 * time.Second
	DefaultPrefetch        = 256
	DefaultNackDelay       = time.Second
	// DefaultMaxPending bounds a Publisher's messages awaiting their
	// acknowledgement from JetStream.
	DefaultMaxPending = 4096
	// DefaultPublishConnections is how many connections a Publisher
	// spreads concurrent calls over.
	DefaultPublishConnections = 2
)

// ConnectionConfig is how a Publisher or Subscriber reaches NATS and lays a
// topic out in JetStream.
type ConnectionConfig struct {
	// URL is the server's URL (nats:// or tls://, with user:password or a
	// token when the server wants them); several, comma-separated, name a
	// cluster. Default DefaultURL.
	URL string
	// TLS is used for tls:// URLs (and servers that require TLS); nil uses
	// the system roots.
	TLS *tls.Config
	// Token authenticates with a server that wants a token.
	Token string
	// CredsFile is a NATS credentials file (a user JWT and its NKey seed).
	CredsFile string
	// SubjectPrefix is prepended to a topic to name its subjects and its
	// stream. Default "".
	SubjectPrefix string
	// Shards is the number of subjects a topic's messages are spread over by
	// partition key (bus.ShardOf). Every publisher and subscriber of a topic
	// must use the same count; it is recorded on the topic's stream. Default
	// DefaultShards.
	Shards int
	// DuplicateWindow is the stream's duplicate window: a message published
	// again with the same ID (a relay retry) within it is stored once.
	// Default DefaultDuplicateWindow.
	DuplicateWindow time.Duration
	// MaxAge is how long the stream keeps a message. Default 0: for ever
	// (set it, with the slowest consumer group's catch-up time in mind: a
	// message older than MaxAge is gone for a group that has not read it).
	MaxAge time.Duration
	// Bucket is the key-value bucket that holds the consumer groups' shard
	// leases and positions. Default DefaultBucket.
	Bucket string
	// Timeout bounds each request to JetStream. Default DefaultTimeout.
	Timeout time.Duration
}

func (c *ConnectionConfig) setDefaults() {
	if c.URL == "" {
		c.URL = DefaultURL
	}
	if c.Shards == 0 {
		c.Shards = DefaultShards
	}
	if c.DuplicateWindow == 0 {
		c.DuplicateWindow = DefaultDuplicateWindow
	}
	if c.Bucket == "" {
		c.Bucket = DefaultBucket
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
}

func (c ConnectionConfig) validate() error {
	switch {
	case c.Shards < 1 || c.Shards > bus.MaxShards:
		return invalid("Shards", "%d is not between 1 and %d", c.Shards, bus.MaxShards)
	case c.DuplicateWindow < time.Second:
		return invalid("DuplicateWindow", "%s is under 1s", c.DuplicateWindow)
	case c.MaxAge < 0 || c.MaxAge > 0 && c.MaxAge < c.DuplicateWindow:
		return invalid("MaxAge", "%s is negative or under the duplicate window (%s)", c.MaxAge, c.DuplicateWindow)
	case c.Timeout < 100*time.Millisecond:
		return invalid("Timeout", "%s is under 100ms", c.Timeout)
	}
	if err := checkPrefix(c.SubjectPrefix); err != nil {
		return invalid("SubjectPrefix", "%v", err)
	}
	if err := checkToken(c.Bucket); err != nil {
		return invalid("Bucket", "%v", err)
	}
	return nil
}

// PublisherConfig configures a Publisher.
type PublisherConfig struct {
	ConnectionConfig
	// MaxPending bounds the messages published and not yet acknowledged by
	// JetStream, per connection. Default DefaultMaxPending.
	MaxPending int
	// Connections is how many connections concurrent Publish calls share,
	// round robin by call. Default DefaultPublishConnections.
	Connections int
}

func (c *PublisherConfig) setDefaults() {
	c.ConnectionConfig.setDefaults()
	if c.MaxPending == 0 {
		c.MaxPending = DefaultMaxPending
	}
	if c.Connections == 0 {
		c.Connections = DefaultPublishConnections
	}
}

// Validate reports the first invalid field as a *bus.ConfigError.
func (c PublisherConfig) Validate() error {
	if err := c.ConnectionConfig.validate(); err != nil {
		return err
	}
	if c.MaxPending < 1 {
		return invalid("MaxPending", "%d is under 1", c.MaxPending)
	}
	if c.Connections < 1 || c.Connections > 64 {
		return invalid("Connections", "%d is not between 1 and 64", c.Connections)
	}
	return nil
}

// SubscriberConfig configures a Subscriber.
type SubscriberConfig struct {
	ConnectionConfig
	// ConsumerGroup is the group the Subscriber receives as: each group reads
	// the whole topic, and within a group each shard is read by one consumer
	// at a time, the holder of its lease. Required; letters, digits, '-' and
	// '_'.
	ConsumerGroup string
	// Consumer names this Subscriber in its group. Default: the host name
	// and a random suffix.
	Consumer string
	// ShardLease is how long a consumer holds a shard without renewing its
	// lease. A consumer that cannot renew for this long hands nothing more
	// out; another consumer takes the shard once the lease has gone
	// unrenewed for this long on its own clock. Default DefaultShardLease.
	ShardLease time.Duration
	// Prefetch bounds the messages per shard that are read and not yet
	// settled. Default DefaultPrefetch.
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
		c.Consumer = tokenOf(host) + "-" + strconv.FormatUint(rand.Uint64()%1e8, 36)
	}
	if c.ShardLease == 0 {
		c.ShardLease = DefaultShardLease
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
	if err := checkToken(c.ConsumerGroup); err != nil {
		return invalid("ConsumerGroup", "%v", err)
	}
	if err := checkToken(c.Consumer); err != nil {
		return invalid("Consumer", "%v", err)
	}
	switch {
	case c.ShardLease < time.Second:
		return invalid("ShardLease", "%s is under 1s", c.ShardLease)
	case c.Prefetch < 1 || c.Prefetch > 1<<16:
		return invalid("Prefetch", "%d is not between 1 and 65536", c.Prefetch)
	case c.NackDelay < 0:
		return invalid("NackDelay", "negative (%s)", c.NackDelay)
	}
	return nil
}

// checkToken checks a name that becomes one token of a subject, a key of
// the lease bucket and part of a stream name: 1–64 of letters, digits, '-'
// and '_'.
func checkToken(s string) error {
	switch {
	case s == "":
		return errors.New("empty")
	case len(s) > 64:
		return fmt.Errorf("%d bytes, over 64", len(s))
	}
	for _, r := range s {
		if !tokenRune(r) {
			return fmt.Errorf("%q has %q: only letters, digits, '-' and '_' are allowed", s, r)
		}
	}
	return nil
}

// checkPrefix checks a subject prefix: empty, or dot-separated tokens of
// letters, digits, '-' and '_', usually ending in '.'.
func checkPrefix(p string) error {
	if p == "" {
		return nil
	}
	if err := checkSubject(strings.TrimSuffix(p, ".")); err != nil {
		return fmt.Errorf("%q: %w", p, err)
	}
	return nil
}

// checkSubject checks dot-separated tokens of letters, digits, '-' and '_'.
func checkSubject(s string) error {
	for tok := range strings.SplitSeq(s, ".") {
		if tok == "" {
			return errors.New("has an empty token (a leading, trailing or double '.')")
		}
		for _, r := range tok {
			if !tokenRune(r) {
				return fmt.Errorf("has %q: only letters, digits, '-', '_' and '.' between tokens are allowed", r)
			}
		}
	}
	return nil
}

func tokenRune(r rune) bool {
	return r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_'
}

// tokenOf replaces what checkToken refuses with '_'.
func tokenOf(s string) string {
	b := []byte(s)
	for i, c := range b {
		if !tokenRune(rune(c)) {
			b[i] = '_'
		}
	}
	if len(b) > 48 {
		b = b[:48]
	}
	if len(b) == 0 {
		return "consumer"
	}
	return string(b)
}

func invalid(field, format string, args ...any) error {
	return &bus.ConfigError{Field: field, Reason: fmt.Sprintf(format, args...)}
}
