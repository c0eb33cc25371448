package kafka

import (
	"context"
	"log/slog"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/omnibus-go/omnibus/bus"
)

func init() {
	bus.RegisterBroker(bus.BrokerKafka, openBroker)
	// sarama prints nothing unless told; from here on it prints to slog (its
	// notices at Info, its chatter at Debug) once a bus.Open is given a
	// logger. Set at init, before any client runs: sarama reads these
	// variables without synchronization.
	sarama.Logger = bus.NewLibraryLogger("sarama", slog.LevelInfo, nil)
	sarama.DebugLogger = bus.NewLibraryLogger("sarama", slog.LevelDebug, nil)
}

// kafkaBroker is the kafka broker of bus.Open: one shared Publisher (it
// connects when the broker opens; an unreachable cluster is a transient
// error, which bus.Open retries in the background) and a consumer-group
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
	return PublisherConfig{ConnectionConfig: connectionFrom(cfg.WithDefaults().Kafka)}
}

// SubscriberConfigFrom maps the kafka section of a bus.Config to a
// SubscriberConfig without a consumer group (set ConsumerGroup).
func SubscriberConfigFrom(cfg bus.Config) SubscriberConfig {
	cfg = cfg.WithDefaults()
	k := cfg.Kafka
	return SubscriberConfig{
		ConnectionConfig:  connectionFrom(k),
		InitialOffset:     InitialOffset(k.InitialOffset),
		DeadLetterTopic:   k.DeadLetterTopic,
		MaxInFlight:       k.MaxInFlight,
		MaxReadAheadBytes: k.MaxReadAheadBytes,
		FetchMaxWait:      k.FetchMaxWait,
	}
}

func connectionFrom(k bus.KafkaConfig) ConnectionConfig {
	return ConnectionConfig{
		Brokers:      k.Brokers,
		ClientID:     k.ClientID,
		KafkaVersion: k.Version,
		TLS:          tlsFrom(k.TLS),
		SASL:         SASLConfig{Mechanism: k.SASL.Mechanism, User: k.SASL.User, Password: k.SASL.Password},
	}
}

func tlsFrom(t bus.KafkaTLSConfig) TLSConfig {
	return TLSConfig{
		Enable: t.Enable, CAFile: t.CAFile, CertFile: t.CertFile, KeyFile: t.KeyFile,
		ServerName: t.ServerName, InsecureSkipVerify: t.InsecureSkipVerify,
	}
}
