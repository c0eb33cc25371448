package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/internal/tlsconf"
)

func init() {
	bus.Register(bus.Transport{
		Name:       Name,
		Open:       openBroker,
		Key:        SectionKey,
		EnvPrefix:  "OMNIBUS_RABBITMQ_",
		NewSection: func() any { return new(Config) },
		Defaults:   func(s any) { s.(*Config).setDefaults() },
		Validate:   func(s any, _ bool) error { return s.(*Config).validate() },
		Endpoints:  func(s any) []string { return s.(*Config).endpoints() },
	})
}

// Name is the broker's name: Config.Broker = "rabbitmq" selects this
// transport.
const Name = "rabbitmq"

// SectionKey is the YAML key of the rabbitmq section of a bus.Config; its
// environment variables start with OMNIBUS_RABBITMQ_.
const SectionKey = Name

// Config is the rabbitmq section of the omnibus configuration (rabbitmq: in
// the YAML file, OMNIBUS_RABBITMQ_* variables; docs/configuration.md lists
// the keys). Read it from a bus.Config with Section and set it with
// SetSection.
type Config struct {
	// URL is the AMQP URL, credentials and vhost included (amqp:// or
	// amqps://); its password is redacted when printed. Default DefaultURL.
	URL string `yaml:"url" secret:"dsn"`
	// TLSCAFile is a PEM file of the certificate authorities that verify the
	// server of an amqps:// URL; empty means the system roots.
	TLSCAFile string `yaml:"tls_ca_file"`
	// TLSServerName is checked against the server's certificate instead of
	// the URL's host.
	TLSServerName string `yaml:"tls_server_name"`
	// Heartbeat is the AMQP heartbeat, and a subscriber's lease on its
	// queues (see the package documentation, Fencing). Default
	// DefaultHeartbeat; at least 1s.
	Heartbeat time.Duration `yaml:"heartbeat"`
	// ExchangePrefix is prepended to a topic to name its exchange and the
	// queues of its groups.
	ExchangePrefix string `yaml:"exchange_prefix"`
	// Shards is the number of queues per consumer group a topic is spread
	// over by partition key. 1–1024; default 1.
	Shards int `yaml:"shards"`
	// Prefetch bounds a subscriber's unacknowledged messages per shard queue.
	// Default DefaultPrefetch.
	Prefetch int `yaml:"prefetch"`
	// Groups are the consumer groups whose queues the publisher declares on
	// a topic's first publish, so that what is published before a group
	// first subscribes is kept for it. Default: inbox.consumer_group.
	Groups []string `yaml:"groups"`
	// QueueExpires, when set, makes RabbitMQ delete a group's queues (and
	// what they hold) once they have had no consumer for this long. For
	// short-lived groups and tests; 0 (the default) keeps them.
	QueueExpires time.Duration `yaml:"queue_expires"`
}

// Section returns the rabbitmq section of cfg (a copy: change it with
// SetSection).
func Section(cfg bus.Config) Config { return *cfg.Section(SectionKey).(*Config) }

// SetSection sets the rabbitmq section of cfg to s.
func SetSection(cfg *bus.Config, s Config) { cfg.SetSection(SectionKey, &s) }

func (c *Config) setDefaults() {
	if c.URL == "" {
		c.URL = DefaultURL
	}
	if c.Heartbeat == 0 {
		c.Heartbeat = DefaultHeartbeat
	}
	if c.Shards == 0 {
		c.Shards = DefaultShards
	}
	if c.Prefetch == 0 {
		c.Prefetch = DefaultPrefetch
	}
}

// validate checks the section (defaults applied) with the keys as field
// names. Errors never show the URL's password.
func (c *Config) validate() error {
	ck := &bus.Check{}
	if u, err := url.Parse(c.URL); err != nil {
		ck.Fail("url", "does not parse as a URL")
	} else if u.Scheme != "amqp" && u.Scheme != "amqps" {
		ck.Fail("url", "scheme %q is not amqp or amqps (%s)", u.Scheme, redactURL(c.URL))
	} else if u.Host == "" {
		ck.Fail("url", "has no host (%s)", redactURL(c.URL))
	}
	if c.Heartbeat < time.Second {
		ck.Fail("heartbeat", "%s is under 1s", c.Heartbeat)
	}
	if c.Shards < 1 || c.Shards > bus.MaxShards {
		ck.Fail("shards", "%d is not between 1 and %d", c.Shards, bus.MaxShards)
	}
	if c.QueueExpires < 0 || c.QueueExpires > 0 && c.QueueExpires < time.Second {
		ck.Fail("queue_expires", "%s is negative or under 1s", c.QueueExpires)
	}
	if c.Prefetch < 1 || c.Prefetch > 65535 {
		ck.Fail("prefetch", "%d is not between 1 and 65535", c.Prefetch)
	}
	for i, g := range c.Groups {
		if err := checkName(g); err != nil {
			ck.Fail(fmt.Sprintf("groups[%d]", i), "%v", err)
		}
	}
	if _, err := tlsconf.FromFiles(nil, c.TLSCAFile, ""); err != nil {
		ck.Fail("tls_ca_file", "%v", err)
	}
	if err := tlsconf.CheckServerName(c.TLSServerName); err != nil {
		ck.Fail("tls_server_name", "%v", err)
	}
	return ck.Err()
}

// endpoints is the host:port of the URL (port 5672, or 5671 for amqps).
func (c *Config) endpoints() []string {
	u, err := url.Parse(c.URL)
	if err != nil || u.Hostname() == "" {
		return nil
	}
	port := u.Port()
	if port == "" {
		port = "5672"
		if u.Scheme == "amqps" {
			port = "5671"
		}
	}
	return []string{net.JoinHostPort(u.Hostname(), port)}
}

// connection is the section as a ConnectionConfig.
func (c Config) connection() (ConnectionConfig, error) {
	tlsCfg, err := tlsconf.FromFiles(nil, c.TLSCAFile, c.TLSServerName)
	if err != nil {
		return ConnectionConfig{}, &bus.ConfigError{Field: "rabbitmq.tls_ca_file", Reason: err.Error()}
	}
	return ConnectionConfig{URL: c.URL, TLS: tlsCfg, Heartbeat: c.Heartbeat, ExchangePrefix: c.ExchangePrefix, Shards: c.Shards, QueueExpires: c.QueueExpires}, nil
}

// rabbitBroker is the rabbitmq broker of bus.OpenBroker: a Publisher with
// its connection, and a Subscriber (with connections of its own) per call.
type rabbitBroker struct {
	cfg    Config
	conn   ConnectionConfig
	pub    *Publisher
	logger *slog.Logger
}

func openBroker(ctx context.Context, cfg bus.Config, logger *slog.Logger) (bus.Broker, error) {
	r := Section(cfg)
	conn, err := r.connection()
	if err != nil {
		return nil, err
	}
	// Reach the server once: unreachable is transient (OpenBroker keeps
	// trying in the background); credentials it refuses are a
	// configuration error at start.
	probe, err := dial(conn)
	if err != nil {
		var amqpErr *amqp.Error
		if errors.As(err, &amqpErr) && amqpErr.Code == amqp.AccessRefused {
			return nil, fmt.Errorf("rabbitmq.url: %s refused the credentials: %s", redactURL(r.URL), amqpErr.Reason)
		}
		return nil, err
	}
	_ = probe.Close()
	groups := r.Groups
	if len(groups) == 0 {
		groups = []string{cfg.Inbox.ConsumerGroup}
	}
	pub, err := NewPublisher(PublisherConfig{ConnectionConfig: conn, Groups: groups}, logger)
	if err != nil {
		return nil, err
	}
	return &rabbitBroker{cfg: r, conn: conn, pub: pub, logger: logger}, nil
}

func (b *rabbitBroker) Publisher() message.Publisher { return b.pub }

func (b *rabbitBroker) Subscriber(group string) (message.Subscriber, error) {
	return NewSubscriber(SubscriberConfig{ConnectionConfig: b.conn, ConsumerGroup: group, Prefetch: b.cfg.Prefetch}, b.logger)
}

func (b *rabbitBroker) Close() error { return b.pub.Close() }
