package kafka

import (
	"context"
	"fmt"
	"log/slog"
	"regexp"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/omnibus-go/omnibus/bus"
)

func init() {
	bus.Register(bus.Transport{
		Name:       Name,
		Open:       openBroker,
		Key:        SectionKey,
		EnvPrefix:  "OMNIBUS_KAFKA_",
		NewSection: func() any { return new(Config) },
		Defaults:   func(s any) { s.(*Config).setDefaults() },
		Validate:   func(s any, selected bool) error { return s.(*Config).validate(selected) },
		Words:      []string{SASLPlain, SASLScramSHA256, SASLScramSHA512},
		Endpoints:  func(s any) []string { return s.(*Config).Brokers },
	})
	// sarama prints nothing unless told; from here on it prints to slog (its
	// notices at Info, its chatter at Debug) once a bus.OpenBroker is given a
	// logger. Set at init, before any client runs: sarama reads these
	// variables without synchronization.
	sarama.Logger = bus.NewLibraryLogger("sarama", slog.LevelInfo, nil)
	sarama.DebugLogger = bus.NewLibraryLogger("sarama", slog.LevelDebug, nil)
}

// Name is the broker's name: Config.Broker = "kafka" selects this transport.
const Name = "kafka"

// SectionKey is the YAML key of the kafka section of a bus.Config; its
// environment variables start with OMNIBUS_KAFKA_.
const SectionKey = Name

// Config is the kafka section of the omnibus configuration (kafka: in the
// YAML file, OMNIBUS_KAFKA_* variables; docs/configuration.md lists the
// keys): the connection (ConnectionConfig, whose DialTimeout is not a key)
// and the subscriber settings a service tunes. Read it from a bus.Config
// with Section and set it with SetSection; the broker maps it to a
// PublisherConfig and SubscriberConfigs (PublisherConfigFrom,
// SubscriberConfigFrom).
type Config struct {
	ConnectionConfig `yaml:",inline"`
	// InitialOffset is where a new consumer group starts: oldest or newest.
	// Default DefaultInitialOffset.
	InitialOffset InitialOffset `yaml:"initial_offset"`
	// DeadLetterTopic receives the records a consumer gives up on; {topic}
	// stands for the source topic, NoDeadLetters ("-") turns dead letters
	// off. Default DefaultDeadLetterTopic.
	DeadLetterTopic string `yaml:"dead_letter_topic"`
	// MaxInFlight is how many records of one partition are handled at once
	// (records of one key always one after another). Default
	// DefaultMaxInFlight.
	MaxInFlight int `yaml:"max_in_flight"`
	// MaxReadAheadBytes bounds the records of one partition read ahead of
	// their handling; fetching that partition pauses above it. Default
	// DefaultMaxReadAheadBytes.
	MaxReadAheadBytes int `yaml:"max_read_ahead_bytes"`
	// FetchMaxWait is how long a broker may hold a fetch that finds nothing
	// new. Default DefaultFetchMaxWait, at least MinFetchMaxWait.
	FetchMaxWait time.Duration `yaml:"fetch_max_wait"`
}

// Section returns the kafka section of cfg (a copy: change it with
// SetSection). It panics when the kafka transport is not linked, which
// cannot happen in a program that calls it.
func Section(cfg bus.Config) Config { return *cfg.Section(SectionKey).(*Config) }

// SetSection sets the kafka section of cfg to s.
func SetSection(cfg *bus.Config, s Config) { cfg.SetSection(SectionKey, &s) }

// setDefaults fills in the subscriber's defaults (the section's keys are a
// SubscriberConfig's): each default is set in one place,
// SubscriberConfig.setDefaults.
func (c *Config) setDefaults() {
	s := c.subscriberConfig()
	s.setDefaults()
	c.ClientID, c.KafkaVersion = s.ClientID, s.KafkaVersion
	c.InitialOffset, c.DeadLetterTopic, c.MaxInFlight = s.InitialOffset, s.DeadLetterTopic, s.MaxInFlight
	c.MaxReadAheadBytes, c.FetchMaxWait = s.MaxReadAheadBytes, s.FetchMaxWait
}

// subscriberConfig maps the section to a SubscriberConfig without a
// consumer group.
func (c Config) subscriberConfig() SubscriberConfig {
	return SubscriberConfig{
		ConnectionConfig:  c.ConnectionConfig,
		InitialOffset:     c.InitialOffset,
		DeadLetterTopic:   c.DeadLetterTopic,
		MaxInFlight:       c.MaxInFlight,
		MaxReadAheadBytes: c.MaxReadAheadBytes,
		FetchMaxWait:      c.FetchMaxWait,
	}
}

var versionRE = regexp.MustCompile(`^[0-9]+\.[0-9]+\.[0-9]+$`)

// validate checks the section (defaults applied) with the keys as field
// names; selected is whether kafka is the configured broker.
func (c *Config) validate(selected bool) error {
	ck := &bus.Check{}
	if selected && len(c.Brokers) == 0 {
		ck.Fail("brokers", "required when broker is kafka (host:port list; env %s=host1:9092,host2:9092)", bus.EnvName(SectionKey+".brokers"))
	}
	for i, b := range c.Brokers {
		ck.HostPort(fmt.Sprintf("brokers[%d]", i), b)
	}
	if !versionRE.MatchString(c.KafkaVersion) {
		ck.Fail("version", "%s is not major.minor.patch (for example 2.8.0)", bus.Quote(c.KafkaVersion))
	}
	var offsets []string
	for _, o := range initialOffsets {
		offsets = append(offsets, string(o))
	}
	ck.OneOf("initial_offset", string(c.InitialOffset), offsets...)
	ck.NotNegative("max_in_flight", int64(c.MaxInFlight))
	ck.NotNegative("max_read_ahead_bytes", int64(c.MaxReadAheadBytes))
	if c.FetchMaxWait < MinFetchMaxWait {
		ck.Fail("fetch_max_wait", "must be at least %s (brokers wait in whole milliseconds), got %s", MinFetchMaxWait, c.FetchMaxWait)
	}
	if c.TLS.missingPairFile() != "" {
		ck.Fail("tls.cert_file", "cert_file and key_file go together: set both or neither")
	}
	ck.OneOf("sasl.mechanism", c.SASL.Mechanism, append([]string{""}, SASLMechanisms...)...)
	if c.SASL.Mechanism != "" {
		if c.SASL.User == "" {
			ck.Fail("sasl.user", "required when kafka.sasl.mechanism is set")
		}
		if c.SASL.Password == "" {
			ck.Fail("sasl.password", "required when kafka.sasl.mechanism is set")
		}
	}
	return ck.Err()
}

// kafkaBroker is the kafka broker of bus.OpenBroker: one shared Publisher (it
// connects when the broker opens; an unreachable cluster is a transient
// error, which bus.OpenBroker retries in the background) and a consumer-group
// Subscriber per call.
type kafkaBroker struct {
	cfg    bus.Config
	pub    *Publisher
	logger *slog.Logger
}

func openBroker(_ context.Context, cfg bus.Config, logger *slog.Logger) (bus.Broker, error) {
	pub, err := NewPublisher(PublisherConfigFrom(cfg), logger)
	if err != nil {
		return nil, err
	}
	return &kafkaBroker{cfg: cfg, pub: pub, logger: logger}, nil
}

func (b *kafkaBroker) Publisher() message.Publisher { return b.pub }

func (b *kafkaBroker) Subscriber(group string) (message.Subscriber, error) {
	sc := SubscriberConfigFrom(b.cfg)
	sc.ConsumerGroup = group
	return NewSubscriber(sc, b.logger)
}

func (b *kafkaBroker) Close() error { return b.pub.Close() }

// PublisherConfigFrom maps the kafka section of a bus.Config to a
// PublisherConfig (the settings it does not name keep their defaults).
func PublisherConfigFrom(cfg bus.Config) PublisherConfig {
	return PublisherConfig{ConnectionConfig: section(cfg).ConnectionConfig}
}

// SubscriberConfigFrom maps the kafka section of a bus.Config to a
// SubscriberConfig without a consumer group (set ConsumerGroup).
func SubscriberConfigFrom(cfg bus.Config) SubscriberConfig {
	return section(cfg).subscriberConfig()
}

// section is the kafka section of cfg with its defaults.
func section(cfg bus.Config) Config {
	k := Section(cfg)
	k.setDefaults()
	return k
}
