package postgres

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/omnibus-go/omnibus/bus"
)

// The postgres broker has no section of its own: it uses the top-level
// postgres keys (postgres.queue_table, postgres.queue_groups), which the
// outbox and inbox share.
func init() { bus.Register(bus.Transport{Name: bus.BrokerPostgres, Open: openBroker}) }

// The postgres broker (bus.Config.Broker = "postgres") uses a table of the
// database as the message queue, for services that want no other
// infrastructure. The table (postgres.queue_table, default
// "omnibus_queue") is an inbox table: publishing a message inserts one row
// per consumer group named in postgres.queue_groups (default: the
// inbox.consumer_group), and a group's subscriber is a head-of-key
// Subscriber over that group's rows. So every configured group receives every
// message, in order per (topic, partition key), with durable retries; a
// message published twice (same event id) is stored once per group. A group
// that is not configured cannot subscribe: its rows would not exist. The
// broker creates its table (Migrate) when it opens.
type queueBroker struct {
	cfg    bus.Config
	pool   *pgxpool.Pool
	inbox  *Inbox
	groups []string
	logger *slog.Logger
}

func openBroker(ctx context.Context, cfg bus.Config, logger *slog.Logger) (bus.Broker, error) {
	pcfg, err := pgxpool.ParseConfig(cfg.Postgres.URL)
	if err != nil {
		return nil, fmt.Errorf("postgres.url: %s", bus.RedactDSN(err.Error()))
	}
	pcfg.MaxConns = int32(cfg.Postgres.MaxConns)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("connect to PostgreSQL at %s: %w", bus.RedactDSN(cfg.Postgres.URL), err)
	}
	if err := Migrate(ctx, pool, InboxTable(cfg.Postgres.QueueTable)); err != nil {
		pool.Close()
		return nil, fmt.Errorf("create queue table %q: %w", cfg.Postgres.QueueTable, err)
	}
	in, err := NewInbox(InboxConfig{Table: cfg.Postgres.QueueTable, MaxAttempts: cfg.Inbox.MaxAttempts, MaxPayloadBytes: cfg.Inbox.MaxPayloadBytes})
	if err != nil {
		pool.Close()
		return nil, err
	}
	return &queueBroker{cfg: cfg, pool: pool, inbox: in, groups: cfg.Postgres.QueueGroups, logger: logger}, nil
}

func (b *queueBroker) Publisher() message.Publisher { return queuePublisher{b} }

func (b *queueBroker) Subscriber(group string) (message.Subscriber, error) {
	if !slices.Contains(b.groups, group) {
		return nil, fmt.Errorf("consumer group %q is not in postgres.queue_groups [%s]: messages are stored for those groups only",
			group, strings.Join(b.groups, ", "))
	}
	return NewSubscriber(b.pool, SubscriberFromConfig(b.cfg, SubscriberConfig{
		Table: b.cfg.Postgres.QueueTable, Kind: KindInbox, ConsumerGroup: group,
	}), b.logger)
}

func (b *queueBroker) Close() error {
	b.pool.Close()
	return nil
}

type queuePublisher struct{ b *queueBroker }

// Publish stores msgs for every configured group in one transaction, with the
// context of the first message.
func (p queuePublisher) Publish(topic string, msgs ...*message.Message) error {
	if len(msgs) == 0 {
		return nil
	}
	if topic == "" {
		return bus.Permanent(errors.New("postgres broker: publish: empty topic"))
	}
	ctx := msgs[0].Context()
	err := pgx.BeginFunc(ctx, p.b.pool, func(tx pgx.Tx) error {
		for _, g := range p.b.groups {
			if _, err := p.b.inbox.StoreWith(ctx, tx, StoreOptions{Group: g, Topic: topic, DedupPerTopic: true}, msgs...); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return ClassifyError(fmt.Errorf("postgres broker: publish to %q: %w", topic, err))
	}
	return nil
}

func (queuePublisher) Close() error { return nil }

// SubscriberFromConfig returns base with the fetch settings of cfg.Relay and
// cfg.Retry applied (batch size, run length, lease, poll interval, sweep and vacuum intervals, failed
// policy, close timeout, transient delay): how the omnibus package and the
// omnibus command configure the relay's and the dispatcher's subscribers.
func SubscriberFromConfig(cfg bus.Config, base SubscriberConfig) SubscriberConfig {
	cfg = cfg.WithDefaults()
	base.BatchSize = cfg.Relay.BatchSize
	base.RunLength = cfg.Relay.RunLength
	base.Lease = cfg.Relay.Lease
	base.PollInterval = cfg.Relay.PollInterval
	base.SweepInterval = cfg.Relay.SweepInterval
	base.VacuumInterval = cfg.Relay.VacuumInterval
	base.CloseTimeout = cfg.Relay.CloseTimeout
	base.TransientDelay = cfg.Retry.TransientDelay
	base.PartitionRetention = cfg.Outbox.Retention
	if base.Kind == KindInbox {
		base.PartitionRetention = cfg.Inbox.Retention
	}
	if cfg.Relay.FailedPolicy == "block" {
		base.FailedPolicy = FailedBlock
	}
	return base
}
