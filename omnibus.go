// Package omnibus is the one-import face of omnibus for a service: Open reads
// a bus.Config and gives a Bus with the broker it names (Publisher,
// Subscriber), the PostgreSQL outbox and inbox, their admin, and the
// ready-made processors (relay, ingest, dispatcher) configured from the same
// config. The code of a service does not change when its broker does: that
// is one line of configuration (broker: kafka).
//
//	import (
//		"github.com/omnibus-go/omnibus"
//		"github.com/omnibus-go/omnibus/bus"
//		_ "github.com/omnibus-go/omnibus/transports/all" // or just the broker you use
//	)
//
//	cfg, err := bus.LoadConfig("omnibus.yaml") // + OMNIBUS_* environment
//	b, err := omnibus.Open(ctx, cfg, omnibus.WithLogger(logger))
//	defer b.Close()
//	err = b.Migrate(ctx)
//
//	// in a business transaction:
//	err = b.Outbox().Enqueue(ctx, tx, "orders", msg)
//
//	relay, err := b.NewRelay()      // outbox → broker
//	ingest, err := b.NewIngest("orders") // broker → inbox
//	disp, err := b.NewDispatcher()  // inbox → handlers
//	processors.Handle(disp, "order.paid", onPaid)
//	relay.AddTo(router); ingest.AddTo(router); disp.AddTo(router)
//
// Open is the one Open of omnibus. Package bus holds the Config and the
// broker step of Open (bus.OpenBroker: broker only, no PostgreSQL): bus
// cannot import PostgreSQL, so the outbox and inbox helpers live here, one
// level up. Brokers are linked by importing their transport (or
// transports/all); this package links the memory broker (the default), so
// that a zero bus.Config is an in-memory bus.
package omnibus

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/middleware"
	"github.com/omnibus-go/omnibus/processors"
	"github.com/omnibus-go/omnibus/transports/postgres"
	// The default broker: Config{} is an in-memory bus.
	_ "github.com/omnibus-go/omnibus/transports/memory"
)

// Option tunes Open.
type Option func(*options)

type options struct {
	logger *slog.Logger
	pool   *pgxpool.Pool
}

// WithLogger makes the bus, its broker and its processors log to l. Without
// it nothing is logged. The first Open given a logger also receives what
// the broker client libraries print (go-redis, sarama: their loggers are
// global to the process; see bus.LibraryLogger).
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.logger = l } }

// WithPool makes the Bus use the caller's pool instead of opening one from
// postgres.url. The Bus never closes it.
func WithPool(p *pgxpool.Pool) Option { return func(o *options) { o.pool = p } }

// Bus is an open broker (the embedded *bus.Conn: Publisher, Subscriber) plus
// the PostgreSQL side of omnibus: the outbox and inbox of the configured
// tables, their admin and the processors.
type Bus struct {
	*bus.Conn
	cfg     bus.Config
	logger  *slog.Logger
	pool    *pgxpool.Pool
	ownPool bool
	outbox  *postgres.Outbox
	inbox   *postgres.Inbox
}

// Open validates cfg, connects to PostgreSQL (postgres.url, unless WithPool)
// and opens the broker cfg.Broker names. It does not create tables: run
// Migrate (or `omnibus migrate`) first. Close the Bus when done.
//
// PostgreSQL must answer: an unreachable one fails Open with a bus.Transient
// error (Connect). The broker need not: writing to the outbox never needs
// it, so with the broker down Open still returns, Outbox().Enqueue works,
// and the Bus connects to the broker in the background (bus.OpenBroker says how);
// meanwhile the relay's publishes fail as transient and spend no attempt.
func Open(ctx context.Context, cfg bus.Config, opts ...Option) (*Bus, error) {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	b := &Bus{cfg: cfg, logger: bus.LoggerOrNop(o.logger), pool: o.pool}
	var err error
	if b.outbox, err = postgres.NewOutbox(postgres.OutboxConfig{Table: cfg.Outbox.Table, MaxAttempts: cfg.Outbox.MaxAttempts, MaxPayloadBytes: cfg.Outbox.MaxPayloadBytes}); err != nil {
		return nil, &bus.ConfigError{Field: "outbox", Reason: err.Error()}
	}
	if b.inbox, err = postgres.NewInbox(postgres.InboxConfig{Table: cfg.Inbox.Table, MaxAttempts: cfg.Inbox.MaxAttempts, MaxPayloadBytes: cfg.Inbox.MaxPayloadBytes}); err != nil {
		return nil, &bus.ConfigError{Field: "inbox", Reason: err.Error()}
	}
	if b.pool == nil {
		if b.pool, err = Connect(ctx, cfg); err != nil {
			return nil, err
		}
		b.ownPool = true
	}
	if b.Conn, err = bus.OpenBroker(ctx, cfg, bus.WithLogger(o.logger)); err != nil {
		if b.ownPool {
			b.pool.Close()
		}
		return nil, err
	}
	return b, nil
}

// Connect opens a pool to cfg's PostgreSQL (postgres.url, postgres.max_conns)
// and checks that it answers. Errors never show the password. A server that
// cannot be reached (refused, timed out) is a bus.Transient error, which a
// caller may wait out; a server that answers and refuses (bad credentials,
// no such database, a connection without TLS its pg_hba.conf rejects) is
// not, nor is a server whose TLS certificate the sslmode and sslrootcert of
// postgres.url refuse.
func Connect(ctx context.Context, cfg bus.Config) (*pgxpool.Pool, error) {
	cfg = cfg.WithDefaults()
	pcfg, err := pgxpool.ParseConfig(cfg.Postgres.URL)
	if err != nil {
		return nil, &bus.ConfigError{Field: "postgres.url", Reason: bus.RedactDSN(err.Error())}
	}
	pcfg.MaxConns = int32(cfg.Postgres.MaxConns)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err == nil {
		err = pool.Ping(ctx)
	}
	if err != nil {
		if pool != nil {
			pool.Close()
		}
		// The error text is redacted, so the error chain is not kept: its
		// class is decided here.
		cerr := fmt.Errorf("connect to PostgreSQL at %s: %s", bus.RedactDSN(cfg.Postgres.URL), bus.RedactDSN(err.Error()))
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) || isCertificateError(err) {
			return nil, cerr // the server answered, or its certificate is refused: waiting will not help
		}
		return nil, bus.Transient(cerr)
	}
	return pool, nil
}

// isCertificateError reports whether err is the refusal of the server's TLS
// certificate (unknown authority, another host name, expired, …): wrong
// settings or a wrong server, not an outage.
func isCertificateError(err error) bool {
	var (
		verifyErr    *tls.CertificateVerificationError
		authorityErr x509.UnknownAuthorityError
		hostErr      x509.HostnameError
		invalidErr   x509.CertificateInvalidError
	)
	return errors.As(err, &verifyErr) || errors.As(err, &authorityErr) ||
		errors.As(err, &hostErr) || errors.As(err, &invalidErr)
}

// Config returns the configuration in effect, defaults applied.
func (b *Bus) Config() bus.Config { return b.cfg }

// Pool returns the PostgreSQL pool of the outbox and inbox.
func (b *Bus) Pool() *pgxpool.Pool { return b.pool }

// Outbox returns the outbox writer: Enqueue events in the business transaction.
func (b *Bus) Outbox() *postgres.Outbox { return b.outbox }

// Inbox returns the inbox store.
func (b *Bus) Inbox() *postgres.Inbox { return b.inbox }

// Tables returns the outbox and inbox tables of the config.
func (b *Bus) Tables() []postgres.Table { return Tables(b.cfg) }

// Tables returns the tables `omnibus migrate` creates for cfg: the outbox and
// the inbox (the postgres broker creates its queue table itself when it opens).
func Tables(cfg bus.Config) []postgres.Table {
	cfg = cfg.WithDefaults()
	out, in := postgres.OutboxTable(cfg.Outbox.Table), postgres.InboxTable(cfg.Inbox.Table)
	out.PartitionInterval, in.PartitionInterval = cfg.Outbox.PartitionInterval, cfg.Inbox.PartitionInterval
	return []postgres.Table{out, in}
}

// Migrate creates or upgrades the outbox and inbox tables (idempotent).
func (b *Bus) Migrate(ctx context.Context) error {
	return postgres.Migrate(ctx, b.pool, b.Tables()...)
}

// OutboxAdmin returns the admin of the outbox table.
func (b *Bus) OutboxAdmin() (*postgres.Admin, error) {
	return postgres.NewAdmin(b.pool, postgres.OutboxTable(b.cfg.Outbox.Table))
}

// InboxAdmin returns the admin of the inbox table, restricted to group unless
// group is "".
func (b *Bus) InboxAdmin(group string) (*postgres.Admin, error) {
	a, err := postgres.NewAdmin(b.pool, postgres.InboxTable(b.cfg.Inbox.Table))
	if err != nil || group == "" {
		return a, err
	}
	return a.WithConsumerGroup(group)
}

// RelayConfig returns the outbox relay's configuration from the Bus's config:
// outbox table, fetch settings, retry, timeout and breaker, publishing to the
// Bus's broker. Change it and build the relay with processors.NewOutboxRelay
// when NewRelay's does not fit.
func (b *Bus) RelayConfig() processors.OutboxRelayConfig {
	return processors.OutboxRelayConfig{
		Publisher: b.Publisher(),
		Subscriber: postgres.SubscriberFromConfig(b.cfg, postgres.SubscriberConfig{
			Table: b.cfg.Outbox.Table, Kind: postgres.KindOutbox,
		}),
		Retry:   RetryConfig(b.cfg),
		Timeout: b.cfg.Relay.Timeout,
		Breaker: BreakerConfig(b.cfg),
	}
}

// NewRelay builds the outbox relay (outbox table → broker).
func (b *Bus) NewRelay() (*processors.OutboxRelay, error) {
	return processors.NewOutboxRelay(b.pool, b.RelayConfig(), b.logger)
}

// IngestConfig returns the configuration of an ingest of topic into the inbox
// as inbox.consumer_group, receiving from a new subscriber of the Bus's
// broker (the router that runs the ingest closes it).
func (b *Bus) IngestConfig(topic string) (processors.InboxIngestConfig, error) {
	if topic == "" {
		return processors.InboxIngestConfig{}, errors.New("ingest: empty topic")
	}
	sub, err := b.Subscriber(b.cfg.Inbox.ConsumerGroup)
	if err != nil {
		return processors.InboxIngestConfig{}, err
	}
	retry := RetryConfig(b.cfg)
	retry.MaxAttempts = b.cfg.Inbox.MaxAttempts
	return processors.InboxIngestConfig{
		Subscriber:    sub,
		Topic:         topic,
		ConsumerGroup: b.cfg.Inbox.ConsumerGroup,
		Inbox:         postgres.InboxConfig{Table: b.cfg.Inbox.Table, MaxAttempts: b.cfg.Inbox.MaxAttempts},
		Retry:         retry,
		Timeout:       b.cfg.Relay.Timeout,
		Breaker:       BreakerConfig(b.cfg),
		HandlerName:   processors.DefaultIngestHandlerName + "_" + topic,
	}, nil
}

// NewIngest builds the ingest of topic (broker → inbox).
func (b *Bus) NewIngest(topic string) (*processors.InboxIngest, error) {
	cfg, err := b.IngestConfig(topic)
	if err != nil {
		return nil, err
	}
	return processors.NewInboxIngest(b.pool, cfg, b.logger)
}

// DispatcherConfig returns the dispatcher's configuration: the inbox rows of
// inbox.consumer_group, fetch settings, retry, timeout and breaker.
func (b *Bus) DispatcherConfig() processors.DispatcherConfig {
	return processors.DispatcherConfig{
		Subscriber: postgres.SubscriberFromConfig(b.cfg, postgres.SubscriberConfig{
			Table: b.cfg.Inbox.Table, Kind: postgres.KindInbox, ConsumerGroup: b.cfg.Inbox.ConsumerGroup,
		}),
		Retry:   RetryConfig(b.cfg),
		Timeout: b.cfg.Relay.Timeout,
		Breaker: BreakerConfig(b.cfg),
	}
}

// NewDispatcher builds the dispatcher (inbox → handlers registered with
// processors.Handle).
func (b *Bus) NewDispatcher() (*processors.Dispatcher, error) {
	return processors.NewDispatcher(b.pool, b.DispatcherConfig(), b.logger)
}

// Close closes the broker (and the subscribers made from it), then the pool
// if the Bus opened it. It is idempotent.
func (b *Bus) Close() error {
	err := b.Conn.Close()
	if b.ownPool {
		b.pool.Close()
	}
	return err
}

// RetryConfig maps the retry section of cfg to the Retry middleware's config.
func RetryConfig(cfg bus.Config) middleware.RetryConfig {
	cfg = cfg.WithDefaults()
	rc := middleware.RetryConfig{Base: cfg.Retry.Base, Cap: cfg.Retry.Cap, TransientDelay: cfg.Retry.TransientDelay}
	if cfg.Retry.Base < 0 {
		rc.Base = middleware.NoDelay
	}
	return rc
}

// BreakerConfig maps the relay section's breaker keys to a CircuitBreakerConfig.
func BreakerConfig(cfg bus.Config) middleware.CircuitBreakerConfig {
	cfg = cfg.WithDefaults()
	return middleware.CircuitBreakerConfig{FailureThreshold: cfg.Relay.BreakerThreshold, OpenTimeout: cfg.Relay.BreakerOpenTimeout}
}
