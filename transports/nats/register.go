package nats

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/internal/tlsconf"
)

func init() {
	bus.Register(bus.Transport{
		Name:       Name,
		Open:       openBroker,
		Key:        SectionKey,
		EnvPrefix:  "OMNIBUS_NATS_",
		NewSection: func() any { return new(Config) },
		Defaults:   func(s any) { s.(*Config).setDefaults() },
		Validate:   func(s any, _ bool) error { return s.(*Config).validate() },
		Words:      []string{"jetstream"},
		Endpoints:  func(s any) []string { return s.(*Config).endpoints() },
	})
}

// Name is the broker's name: Config.Broker = "nats" selects this transport
// (NATS JetStream).
const Name = "nats"

// SectionKey is the YAML key of the nats section of a bus.Config; its
// environment variables start with OMNIBUS_NATS_.
const SectionKey = Name

// Config is the nats section of the omnibus configuration (nats: in the
// YAML file, OMNIBUS_NATS_* variables; docs/configuration.md lists the
// keys). Read it from a bus.Config with Section and set it with SetSection.
type Config struct {
	// URL is the server's URL (nats:// or tls://), or several,
	// comma-separated; a user:password in it is redacted when printed.
	// Default DefaultURL.
	URL string `yaml:"url" secret:"dsn"`
	// Token authenticates with a server that wants a token (not in the URL,
	// where it would not be redacted).
	Token string `yaml:"token" secret:"true"`
	// CredsFile is a NATS credentials file (user JWT and NKey seed).
	CredsFile string `yaml:"creds_file"`
	// TLSCAFile is a PEM file of the certificate authorities that verify the
	// server; empty means the system roots.
	TLSCAFile string `yaml:"tls_ca_file"`
	// TLSServerName is checked against the server's certificate instead of
	// the URL's host.
	TLSServerName string `yaml:"tls_server_name"`
	// SubjectPrefix is prepended to a topic to name its subjects and stream.
	SubjectPrefix string `yaml:"subject_prefix"`
	// Shards is the number of subjects a topic is spread over by partition
	// key. 1–1024; default 1.
	Shards int `yaml:"shards"`
	// DuplicateWindow is how long the stream remembers a message ID: a
	// relay retry inside it is stored once. Default 2m.
	DuplicateWindow time.Duration `yaml:"duplicate_window"`
	// MaxAge is how long the stream keeps a message; 0 (the default) keeps
	// it for ever.
	MaxAge time.Duration `yaml:"max_age"`
	// Bucket is the key-value bucket of the shard leases and group
	// positions. Default DefaultBucket.
	Bucket string `yaml:"bucket"`
	// ShardLease is how long a consumer holds a shard without renewing.
	// Default 10s; at least 1s.
	ShardLease time.Duration `yaml:"shard_lease"`
	// Prefetch bounds a consumer's unsettled messages per shard. Default
	// DefaultPrefetch.
	Prefetch int `yaml:"prefetch"`
}

// Section returns the nats section of cfg (a copy: change it with
// SetSection).
func Section(cfg bus.Config) Config { return *cfg.Section(SectionKey).(*Config) }

// SetSection sets the nats section of cfg to s.
func SetSection(cfg *bus.Config, s Config) { cfg.SetSection(SectionKey, &s) }

func (c *Config) setDefaults() {
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
	if c.ShardLease == 0 {
		c.ShardLease = DefaultShardLease
	}
	if c.Prefetch == 0 {
		c.Prefetch = DefaultPrefetch
	}
}

// validate checks the section (defaults applied) with the keys as field
// names. Errors never show a credential.
func (c *Config) validate() error {
	ck := &bus.Check{}
	for _, raw := range strings.Split(c.URL, ",") {
		u, err := url.Parse(strings.TrimSpace(raw))
		switch {
		case err != nil:
			ck.Fail("url", "does not parse as a URL")
		case u.Scheme != "nats" && u.Scheme != "tls":
			ck.Fail("url", "scheme %q is not nats or tls (%s)", u.Scheme, redactURL(raw))
		case u.Host == "":
			ck.Fail("url", "has no host (%s)", redactURL(raw))
		case u.User != nil && !hasPassword(u):
			ck.Fail("url", "has a token or user without a password before the host (%s): set the token in nats.token, where it is kept secret", redactURL(raw))
		}
	}
	if c.Shards < 1 || c.Shards > bus.MaxShards {
		ck.Fail("shards", "%d is not between 1 and %d", c.Shards, bus.MaxShards)
	}
	if c.DuplicateWindow < time.Second {
		ck.Fail("duplicate_window", "%s is under 1s", c.DuplicateWindow)
	}
	if c.MaxAge < 0 || c.MaxAge > 0 && c.MaxAge < c.DuplicateWindow {
		ck.Fail("max_age", "%s is negative or under duplicate_window (%s)", c.MaxAge, c.DuplicateWindow)
	}
	if err := checkToken(c.Bucket); err != nil {
		ck.Fail("bucket", "%v", err)
	}
	if err := checkPrefix(c.SubjectPrefix); err != nil {
		ck.Fail("subject_prefix", "%v", err)
	}
	if c.ShardLease < time.Second {
		ck.Fail("shard_lease", "%s is under 1s", c.ShardLease)
	}
	if c.Prefetch < 1 || c.Prefetch > 1<<16 {
		ck.Fail("prefetch", "%d is not between 1 and 65536", c.Prefetch)
	}
	if c.CredsFile != "" {
		if _, err := os.Stat(c.CredsFile); err != nil {
			ck.Fail("creds_file", "%v", err)
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

func hasPassword(u *url.URL) bool {
	_, ok := u.User.Password()
	return ok
}

// endpoints is the host:port of each URL (port 4222 when none is given).
func (c *Config) endpoints() []string {
	var out []string
	for _, raw := range strings.Split(c.URL, ",") {
		u, err := url.Parse(strings.TrimSpace(raw))
		if err != nil || u.Hostname() == "" {
			continue
		}
		port := u.Port()
		if port == "" {
			port = "4222"
		}
		out = append(out, net.JoinHostPort(u.Hostname(), port))
	}
	return out
}

// connection is the section as a ConnectionConfig.
func (c Config) connection() (ConnectionConfig, error) {
	tlsCfg, err := tlsconf.FromFiles(nil, c.TLSCAFile, c.TLSServerName)
	if err != nil {
		return ConnectionConfig{}, &bus.ConfigError{Field: "nats.tls_ca_file", Reason: err.Error()}
	}
	return ConnectionConfig{
		URL: c.URL, TLS: tlsCfg, Token: c.Token, CredsFile: c.CredsFile, SubjectPrefix: c.SubjectPrefix,
		Shards: c.Shards, DuplicateWindow: c.DuplicateWindow, MaxAge: c.MaxAge, Bucket: c.Bucket,
	}, nil
}

// natsBroker is the nats broker of bus.OpenBroker: a Publisher with its
// connection, and a Subscriber (with a connection of its own) per call.
type natsBroker struct {
	cfg    Config
	conn   ConnectionConfig
	pub    *Publisher
	logger *slog.Logger
}

func openBroker(ctx context.Context, cfg bus.Config, logger *slog.Logger) (bus.Broker, error) {
	n := Section(cfg)
	conn, err := n.connection()
	if err != nil {
		return nil, err
	}
	// Reach the server once: unreachable is transient (OpenBroker keeps
	// trying in the background); refused credentials or a server without
	// JetStream are configuration errors at start.
	conn.setDefaults()
	probe, err := dial(conn, "omnibus probe")
	if err != nil {
		if strings.Contains(strings.ToLower(err.Error()), "authorization") {
			return nil, fmt.Errorf("nats.url: %s refused the credentials: %w", redactURL(n.URL), err)
		}
		return nil, err
	}
	defer probe.Close()
	if _, err := probe.RequestWithContext(ctx, "$JS.API.INFO", nil); err != nil {
		return nil, classify(fmt.Errorf("nats.url: JetStream does not answer at %s (start nats-server with -js): %w", redactURL(n.URL), err))
	}
	pub, err := NewPublisher(PublisherConfig{ConnectionConfig: conn}, logger)
	if err != nil {
		return nil, err
	}
	return &natsBroker{cfg: n, conn: conn, pub: pub, logger: logger}, nil
}

func (b *natsBroker) Publisher() message.Publisher { return b.pub }

func (b *natsBroker) Subscriber(group string) (message.Subscriber, error) {
	return NewSubscriber(SubscriberConfig{ConnectionConfig: b.conn, ConsumerGroup: group, ShardLease: b.cfg.ShardLease, Prefetch: b.cfg.Prefetch}, b.logger)
}

func (b *natsBroker) Close() error { return b.pub.Close() }

// DeduplicatesPublishes implements bus.PublishDeduplicator: a message
// published again with the same UUID within nats.duplicate_window is stored
// once.
func (b *natsBroker) DeduplicatesPublishes() bool { return true }
