package redis

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"

	"github.com/ThreeDotsLabs/watermill/message"
	goredis "github.com/redis/go-redis/v9"

	"github.com/omnibus-go/omnibus/bus"
)

func init() {
	bus.RegisterBroker(bus.BrokerRedis, openBroker)
	// go-redis prints connection trouble to stderr; the first bus.Open given
	// a logger sends it to that logger instead, at Info: omnibus reports the
	// failures themselves (a Warn per connection attempt, a line per failed
	// delivery), go-redis's lines are the details.
	bus.NewLibraryLogger("go-redis", slog.LevelInfo, func(l *bus.LibraryLogger) { goredis.SetLogger(l.Context()) })
}

// redisBroker is the redis broker of bus.Open: one client shared by the
// Publisher and every Subscriber (opened, pinged and closed by the broker).
// TLS is on when redis.tls, redis.tls_ca_file or redis.tls_server_name is
// set.
// With redis.ordering "key" (the default) subscribers hand out the entries of
// one partition key one at a time, in stream order.
type redisBroker struct {
	cfg    bus.Config
	client *goredis.Client
	pub    *Publisher
	logger *slog.Logger
}

func openBroker(ctx context.Context, cfg bus.Config, logger *slog.Logger) (bus.Broker, error) {
	r := cfg.Redis
	opts := &goredis.Options{Addr: r.Addr, Username: r.Username, Password: r.Password, DB: r.DB}
	var base *tls.Config
	if r.TLS {
		base = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	tlsCfg, err := tlsConfigFrom(base, r.TLSCAFile, r.TLSServerName)
	if ce := (*ConfigError)(nil); errors.As(err, &ce) {
		return nil, &bus.ConfigError{Field: "redis.tls_ca_file", Reason: ce.Reason}
	} else if err != nil {
		return nil, err
	}
	opts.TLSConfig = tlsCfg
	client := goredis.NewClient(opts)
	if err := client.Ping(ctx).Err(); err != nil {
		_ = client.Close()
		// Transient when Redis cannot be reached: bus.Open then keeps
		// connecting in the background. Credentials or a certificate Redis
		// or we refuse are a configuration error at start: Open fails at
		// once (as for PostgreSQL), instead of retrying what only an
		// operator can fix. While running, the same errors are an outage
		// (transient), see isTransient.
		err = fmt.Errorf("connect to Redis at %s: %w", r.Addr, err)
		if refusedCredentials(err) {
			return nil, err
		}
		return nil, classify(err)
	}
	pub, err := NewPublisher(PublisherConfig{Client: client, StreamPrefix: r.StreamPrefix, MaxLen: r.MaxLen}, logger)
	if err != nil {
		_ = client.Close()
		return nil, err
	}
	return &redisBroker{cfg: cfg, client: client, pub: pub, logger: logger}, nil
}

func (b *redisBroker) Publisher() message.Publisher { return b.pub }

func (b *redisBroker) Subscriber(group string) (message.Subscriber, error) {
	return NewSubscriber(SubscriberConfig{
		Client:        b.client,
		StreamPrefix:  b.cfg.Redis.StreamPrefix,
		ConsumerGroup: group,
		OrderByKey:    b.cfg.Redis.Ordering != "none",
	}, b.logger)
}

func (b *redisBroker) Close() error {
	err := b.pub.Close()
	if cerr := b.client.Close(); err == nil {
		err = cerr
	}
	return err
}
