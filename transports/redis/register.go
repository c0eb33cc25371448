package redis

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	goredis "github.com/redis/go-redis/v9"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/internal/tlsconf"
)

func init() {
	bus.Register(bus.Transport{
		Name:       Name,
		Open:       openBroker,
		Key:        SectionKey,
		EnvPrefix:  "OMNIBUS_REDIS_",
		NewSection: func() any { return new(Config) },
		Defaults:   func(s any) { s.(*Config).setDefaults() },
		Validate:   func(s any, _ bool) error { return s.(*Config).validate() },
		Endpoints: func(s any) []string {
			if c := s.(*Config); len(c.ClusterAddrs) == 0 {
				return []string{c.Addr}
			}
			return s.(*Config).ClusterAddrs
		},
	})
	// go-redis prints connection trouble to stderr; the first bus.OpenBroker
	// given a logger sends it to that logger instead, at Info: omnibus
	// reports the failures themselves (a Warn per connection attempt, a line
	// per failed delivery), go-redis's lines are the details.
	bus.NewLibraryLogger("go-redis", slog.LevelInfo, func(l *bus.LibraryLogger) { goredis.SetLogger(l.Context()) })
}

// Name is the broker's name: Config.Broker = "redis" selects this transport.
const Name = "redis"

// SectionKey is the YAML key of the redis section of a bus.Config; its
// environment variables start with OMNIBUS_REDIS_.
const SectionKey = Name

// Defaults of Config.
const (
	// DefaultAddr is the Redis server of the redis section.
	DefaultAddr = "127.0.0.1:6379"
	// DefaultOrdering is the redis section's ordering: by partition key.
	DefaultOrdering = OrderingKey
)

// The values of Config.Ordering.
const (
	// OrderingKey hands out the entries of one partition key one at a time
	// (SubscriberConfig.OrderByKey).
	OrderingKey = "key"
	// OrderingNone hands out entries as they come.
	OrderingNone = "none"
)

// Config is the redis section of the omnibus configuration (redis: in the
// YAML file, OMNIBUS_REDIS_* variables; docs/configuration.md lists the
// keys): the connection of the redis broker and how it uses streams. Read
// it from a bus.Config with Section and set it with SetSection.
type Config struct {
	// Addr is host:port of a single server. Default DefaultAddr, unless
	// ClusterAddrs is set; the two exclude each other.
	Addr string `yaml:"addr"`
	// ClusterAddrs are host:port of Redis Cluster nodes (some or all): the
	// broker then opens a cluster client.
	ClusterAddrs []string `yaml:"cluster_addrs"`
	// Username and Password authenticate (Redis ACL); the password is
	// redacted when printed.
	Username string `yaml:"username"`
	Password string `yaml:"password" secret:"true"`
	// DB selects the database. Default 0.
	DB int `yaml:"db"`
	// TLS turns TLS on; setting TLSCAFile or TLSServerName turns it on too.
	TLS bool `yaml:"tls"`
	// TLSCAFile is a PEM file of the certificate authorities that verify the
	// server; empty means the system roots.
	TLSCAFile string `yaml:"tls_ca_file"`
	// TLSServerName is checked against the server's certificate instead of
	// the host of Addr.
	TLSServerName string `yaml:"tls_server_name"`
	// StreamPrefix is prepended to a topic to name its stream. Default none.
	StreamPrefix string `yaml:"stream_prefix"`
	// MaxLen trims streams to about this many entries (MAXLEN ~); 0 (the
	// default) never trims. Trimming ignores consumer groups: see the package
	// documentation before turning it on.
	MaxLen int64 `yaml:"max_len"`
	// Ordering is OrderingKey (entries of one partition key are handed out
	// one at a time, in stream order, within a subscription) or
	// OrderingNone. Default DefaultOrdering.
	Ordering string `yaml:"ordering"`
	// Shards spreads every topic over this many streams by partition key,
	// read by the consumers of a group one consumer per shard at a time, so
	// a key's messages keep their order however many consumers run (see
	// the package documentation). From 1 to bus.MaxShards; all publishers
	// and subscribers of a topic must agree with the count recorded for it.
	// Default DefaultShards.
	Shards int `yaml:"shards"`
	// ShardLease is how long a consumer owns a shard without renewing its
	// lease. Default DefaultShardLease; at least MinShardLease.
	ShardLease time.Duration `yaml:"shard_lease"`
}

// Section returns the redis section of cfg (a copy: change it with
// SetSection).
func Section(cfg bus.Config) Config { return *cfg.Section(SectionKey).(*Config) }

// SetSection sets the redis section of cfg to s.
func SetSection(cfg *bus.Config, s Config) { cfg.SetSection(SectionKey, &s) }

func (c *Config) setDefaults() {
	if c.Addr == "" && len(c.ClusterAddrs) == 0 {
		c.Addr = DefaultAddr
	}
	if c.Shards == 0 {
		c.Shards = DefaultShards
	}
	if c.ShardLease == 0 {
		c.ShardLease = DefaultShardLease
	}
	if c.Ordering == "" {
		c.Ordering = DefaultOrdering
	}
}

// tlsConfig returns the TLS settings of the section: nil when TLS is off.
func (c Config) tlsConfig() (*tls.Config, error) {
	var base *tls.Config
	if c.TLS {
		base = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	return tlsConfigFrom(base, c.TLSCAFile, c.TLSServerName)
}

// validate checks the section (defaults applied) with the keys as field
// names.
func (c *Config) validate() error {
	ck := &bus.Check{}
	if len(c.ClusterAddrs) > 0 {
		if c.Addr != "" {
			ck.Fail("cluster_addrs", "set together with redis.addr (%s): give a single server's addr or the cluster's nodes, not both", bus.Quote(c.Addr))
		}
		for i, a := range c.ClusterAddrs {
			ck.HostPort(fmt.Sprintf("cluster_addrs[%d]", i), a)
		}
	} else {
		ck.HostPort("addr", c.Addr)
	}
	if c.Shards < 1 || c.Shards > bus.MaxShards {
		ck.Fail("shards", "%d is not between 1 and %d", c.Shards, bus.MaxShards)
	}
	if c.ShardLease < MinShardLease {
		ck.Fail("shard_lease", "%s is shorter than %s", c.ShardLease, MinShardLease)
	}
	ck.NotNegative("db", int64(c.DB))
	ck.NotNegative("max_len", c.MaxLen)
	ck.OneOf("ordering", c.Ordering, OrderingKey, OrderingNone)
	if ce := (*bus.ConfigError)(nil); errors.As(c.checkCAFile(), &ce) {
		ck.Fail("tls_ca_file", "%s", ce.Reason)
	}
	if err := tlsconf.CheckServerName(c.TLSServerName); err != nil {
		ck.Fail("tls_server_name", "%v", err)
	}
	return ck.Err()
}

// checkCAFile reads TLSCAFile as the connection will.
func (c Config) checkCAFile() error {
	_, err := tlsConfigFrom(nil, c.TLSCAFile, "")
	return err
}

// redisBroker is the redis broker of bus.OpenBroker: one client shared by the
// Publisher and every Subscriber (opened, pinged and closed by the broker).
// TLS is on when redis.tls, redis.tls_ca_file or redis.tls_server_name is
// set.
// With redis.ordering "key" (the default) subscribers hand out the entries of
// one partition key one at a time, in stream order.
type redisBroker struct {
	cfg    Config
	client goredis.UniversalClient
	pub    *Publisher
	logger *slog.Logger
}

func openBroker(ctx context.Context, cfg bus.Config, logger *slog.Logger) (bus.Broker, error) {
	r := Section(cfg)
	tlsCfg, err := r.tlsConfig()
	if ce := (*bus.ConfigError)(nil); errors.As(err, &ce) {
		return nil, &bus.ConfigError{Field: "redis.tls_ca_file", Reason: ce.Reason}
	} else if err != nil {
		return nil, err
	}
	var client goredis.UniversalClient
	where := r.Addr
	if len(r.ClusterAddrs) > 0 {
		where = strings.Join(r.ClusterAddrs, ",")
		client = goredis.NewClusterClient(&goredis.ClusterOptions{
			Addrs: r.ClusterAddrs, Username: r.Username, Password: r.Password, TLSConfig: tlsCfg,
		})
	} else {
		client = goredis.NewClient(&goredis.Options{
			Addr: r.Addr, Username: r.Username, Password: r.Password, DB: r.DB, TLSConfig: tlsCfg,
		})
	}
	if err := client.Ping(ctx).Err(); err != nil {
		_ = client.Close()
		// Transient when Redis cannot be reached: bus.OpenBroker then keeps
		// connecting in the background. Credentials or a certificate Redis
		// or we refuse are a configuration error at start: OpenBroker fails at
		// once (as for PostgreSQL), instead of retrying what only an
		// operator can fix. While running, the same errors are an outage
		// (transient), see isTransient.
		err = fmt.Errorf("connect to Redis at %s: %w", where, err)
		if refusedCredentials(err) {
			return nil, err
		}
		return nil, classify(err)
	}
	pub, err := NewPublisher(PublisherConfig{Client: client, StreamPrefix: r.StreamPrefix, MaxLen: r.MaxLen, Shards: r.Shards}, logger)
	if err != nil {
		_ = client.Close()
		return nil, err
	}
	return &redisBroker{cfg: r, client: client, pub: pub, logger: logger}, nil
}

func (b *redisBroker) Publisher() message.Publisher { return b.pub }

func (b *redisBroker) Subscriber(group string) (message.Subscriber, error) {
	return NewSubscriber(SubscriberConfig{
		Client:        b.client,
		StreamPrefix:  b.cfg.StreamPrefix,
		ConsumerGroup: group,
		OrderByKey:    b.cfg.Ordering != OrderingNone,
		Shards:        b.cfg.Shards,
		ShardLease:    b.cfg.ShardLease,
	}, b.logger)
}

func (b *redisBroker) Close() error {
	err := b.pub.Close()
	if cerr := b.client.Close(); err == nil {
		err = cerr
	}
	return err
}

// ShardStatus implements bus.ShardReporter: the shards of topic for group,
// nil when the topic is not sharded.
func (b *redisBroker) ShardStatus(ctx context.Context, topic, group string) ([]bus.ShardStatus, error) {
	return ShardStatus(ctx, b.client, b.cfg.StreamPrefix+topic, group)
}
