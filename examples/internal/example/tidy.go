package example

// Removing what an example created in PostgreSQL and on its broker, so that
// running an example leaves them as it found them: every example does it
// when it is done, unless it was run with -keep (to look at the tables
// afterwards).

import (
	"context"
	"crypto/tls"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/transports/nats"
	"github.com/omnibus-go/omnibus/transports/postgres"
	"github.com/omnibus-go/omnibus/transports/rabbitmq"
	"github.com/omnibus-go/omnibus/transports/redis"
)

// keep is the -keep flag every example takes: keep the tables, streams and
// topics it created instead of removing them when done. Main parses it.
var keep = flag.Bool("keep", false, "keep the tables, streams and topics the example created (default: remove them when done)")

// Tidy removes what the example creates, with drop: at once, so that every
// run starts from a clean slate, and again when the returned function is
// called (deferred: when the example is done), unless -keep, when it says
// that it kept what (a phrase such as "the example's tables t1 and t2").
func Tidy(ctx context.Context, what string, drop func(context.Context) error) (done func(), err error) {
	if err := drop(ctx); err != nil {
		return nil, err
	}
	return TidyWhenDone(what, drop), nil
}

// TidyWhenDone is Tidy without the clean slate, for what a run creates under
// names of its own: the returned function (to defer) removes it with drop,
// unless -keep.
func TidyWhenDone(what string, drop func(context.Context) error) (done func()) {
	return func() {
		if *keep {
			fmt.Printf("kept %s (-keep)\n", what)
			return
		}
		// The example's context may have ended (a signal, its timeout);
		// removing what it created must still happen.
		if err := drop(context.Background()); err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", program, err)
		}
	}
}

// DropTables drops omnibus outbox and inbox tables (unqualified names in the
// search path) together with their lanes tables, trigger functions and
// migration records (postgres.Drop), and the example's own plain tables.
func DropTables(ctx context.Context, pool *pgxpool.Pool, omnibusTables []string, plainTables ...string) error {
	if len(omnibusTables) > 0 {
		tables := make([]postgres.Table, len(omnibusTables))
		for i, t := range omnibusTables {
			tables[i] = postgres.OutboxTable(t) // Drop treats both kinds alike
		}
		if err := postgres.Drop(ctx, pool, tables...); err != nil {
			return fmt.Errorf("drop the example's tables: %w", err)
		}
	}
	if len(plainTables) == 0 {
		return nil
	}
	var drop []string
	for _, t := range plainTables {
		drop = append(drop, pgx.Identifier{t}.Sanitize())
	}
	if _, err := pool.Exec(ctx, `DROP TABLE IF EXISTS `+strings.Join(drop, ", ")+` CASCADE`); err != nil {
		return fmt.Errorf("drop the example's tables: %w", err)
	}
	return nil
}

// DropSchema drops schema with everything in it (tables, functions and the
// schema's migration records).
func DropSchema(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	if _, err := pool.Exec(ctx, `DROP SCHEMA IF EXISTS `+pgx.Identifier{schema}.Sanitize()+` CASCADE`); err != nil {
		return fmt.Errorf("drop the example's schema %s: %w", schema, err)
	}
	return nil
}

// BrokerTopic removes what publishing to topic left on the broker cfg names:
// the stream and its dead-letter stream on Redis, the exchange and queues on
// RabbitMQ, the streams and leases on NATS, the topic's rows in the
// postgres broker's queue table. It leaves Kafka topics alone: an
// in-process cluster goes away with the program, and a topic on a real
// cluster may be someone else's too.
func BrokerTopic(ctx context.Context, cfg bus.Config, topic string) error {
	cfg = cfg.WithDefaults()
	switch cfg.Broker {
	case redis.Name:
		r := redis.Section(cfg)
		opts := &goredis.Options{Addr: r.Addr, Username: r.Username, Password: r.Password, DB: r.DB}
		if r.TLS {
			opts.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12}
		}
		client := goredis.NewClient(opts)
		defer client.Close()
		if err := DropStreams(ctx, client, r.StreamPrefix+topic); err != nil {
			return err
		}
	case rabbitmq.Name:
		r := rabbitmq.Section(cfg)
		groups := append([]string{cfg.Inbox.ConsumerGroup}, r.Groups...)
		if err := rabbitmq.DeleteTopic(ctx, r.URL, r.ExchangePrefix, topic, r.Shards, groups...); err != nil {
			return fmt.Errorf("delete the example's exchange and queues of topic %s: %w", topic, err)
		}
	case nats.Name:
		n := nats.Section(cfg)
		conn := nats.ConnectionConfig{URL: n.URL, Token: n.Token, CredsFile: n.CredsFile, SubjectPrefix: n.SubjectPrefix, Bucket: n.Bucket}
		if err := nats.DeleteTopic(ctx, conn, topic, cfg.Inbox.ConsumerGroup); err != nil {
			return fmt.Errorf("delete the example's streams of topic %s: %w", topic, err)
		}
	case bus.BrokerPostgres:
		pool, err := pgxpool.New(ctx, cfg.Postgres.URL)
		if err != nil {
			return fmt.Errorf("connect to PostgreSQL: %s", bus.RedactDSN(err.Error()))
		}
		defer pool.Close()
		table := pgx.Identifier(strings.Split(cfg.Postgres.QueueTable, ".")).Sanitize()
		if _, err := pool.Exec(ctx, `DELETE FROM `+table+` WHERE topic = $1`, topic); err != nil {
			return fmt.Errorf("delete the example's rows of topic %s from %s: %w", topic, cfg.Postgres.QueueTable, err)
		}
	}
	return nil
}

// DropStreams deletes streams, their dead-letter streams, shards and shard
// counts from Redis (redis.DeleteTopic).
func DropStreams(ctx context.Context, client *goredis.Client, streams ...string) error {
	for _, s := range streams {
		if err := redis.DeleteTopic(ctx, client, s); err != nil {
			return fmt.Errorf("delete the example's streams %s: %w", strings.Join(streams, ", "), err)
		}
	}
	return nil
}
