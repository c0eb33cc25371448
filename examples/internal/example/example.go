// Package example is the frame every example program runs in, so that each
// example's main.go shows only its point: the flags (-keep), a context that
// ends on SIGINT, SIGTERM or a timeout, the connections to the services (with
// their OMNIBUS_* addresses and local defaults), the configuration, and
// removing what the example created when it is done.
//
//	func main() { example.Main("outbox-basic", time.Minute, run) }
//
//	func run(ctx context.Context) error {
//		pool, err := example.Postgres(ctx)
//		…
//		done, err := example.Tidy(ctx, "the example's tables t", func(ctx context.Context) error {
//			return example.DropTables(ctx, pool, []string{"t"})
//		})
//		if err != nil {
//			return err
//		}
//		defer done()
//		…
//	}
package example

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/transports/kafka"
)

const (
	// DefaultPostgresURL is the PostgreSQL an example uses when
	// OMNIBUS_POSTGRES_URL is not set: the one `make services` starts.
	DefaultPostgresURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
	// DefaultRedisAddr is the Redis an example uses when OMNIBUS_REDIS_ADDR
	// is not set: the one `make services` starts.
	DefaultRedisAddr = "127.0.0.1:6379"
)

// program is the example's name, set by Main, that prefixes what it prints
// to stderr.
var program = "example"

// Main is an example's main function: it parses the flags, runs run with a
// context that ends on SIGINT or SIGTERM or after timeout, and when run
// fails prints "name: error" to stderr and exits with status 1.
func Main(name string, timeout time.Duration, run func(ctx context.Context) error) {
	program = name
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	err := run(ctx)
	cancel()
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		os.Exit(1)
	}
}

// Logger returns a logger for the processors that writes their warnings and
// errors to stderr, so that the example's own output stays readable.
func Logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// Postgres connects to OMNIBUS_POSTGRES_URL (default DefaultPostgresURL) and
// checks that it answers. The caller closes the pool.
func Postgres(ctx context.Context) (*pgxpool.Pool, error) {
	url := env("OMNIBUS_POSTGRES_URL", DefaultPostgresURL)
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return nil, err
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("PostgreSQL at %s: %w (start it with `make services`)", url, err)
	}
	return pool, nil
}

// Redis connects to OMNIBUS_REDIS_ADDR (default DefaultRedisAddr) and checks
// that it answers. The caller closes the client: a transport never closes a
// client it is given.
func Redis(ctx context.Context) (*goredis.Client, error) {
	addr := env("OMNIBUS_REDIS_ADDR", DefaultRedisAddr)
	client := goredis.NewClient(&goredis.Options{Addr: addr})
	if err := client.Ping(ctx).Err(); err != nil {
		_ = client.Close()
		return nil, fmt.Errorf("Redis at %s: %w (start it with `make services`)", addr, err)
	}
	return client, nil
}

// Kafka returns the brokers of OMNIBUS_KAFKA_BROKERS (comma-separated
// host:port) or, when it is not set, starts an in-process Kafka (kfake) with
// opts and says so. Call stop when done: it stops the in-process cluster.
func Kafka(opts ...kfake.Opt) (brokers []string, stop func(), err error) {
	if list := os.Getenv("OMNIBUS_KAFKA_BROKERS"); list != "" {
		for b := range strings.SplitSeq(list, ",") {
			if b = strings.TrimSpace(b); b != "" {
				brokers = append(brokers, b)
			}
		}
		fmt.Printf("using Kafka at %s\n", strings.Join(brokers, ","))
		return brokers, func() {}, nil
	}
	cluster, err := kfake.NewCluster(append([]kfake.Opt{kfake.NumBrokers(1), kfake.AllowAutoTopicCreation()}, opts...)...)
	if err != nil {
		return nil, nil, fmt.Errorf("start in-process Kafka: %w", err)
	}
	brokers = cluster.ListenAddrs()
	fmt.Printf("OMNIBUS_KAFKA_BROKERS is not set: started an in-process Kafka (kfake) at %s\n", strings.Join(brokers, ","))
	return brokers, cluster.Close, nil
}

// Config loads the configuration the way the omnibus CLI does — the YAML
// file OMNIBUS_CONFIG names (optional), then the OMNIBUS_* environment —,
// lets edit change it (nil: no change), and validates it. Broker kafka
// without brokers gets an in-process Kafka cluster that lives as long as the
// program, so the example runs anywhere.
func Config(edit func(*bus.Config)) (bus.Config, error) {
	var cfg bus.Config
	if path := os.Getenv("OMNIBUS_CONFIG"); path != "" {
		data, err := os.ReadFile(path)
		if err != nil {
			return cfg, err
		}
		if cfg, err = bus.ParseConfig(data); err != nil {
			return cfg, err
		}
	}
	bus.ReserveEnv("OMNIBUS_CONFIG")
	if err := bus.CheckEnv(os.Environ()); err != nil {
		return cfg, err
	}
	if err := cfg.ApplyEnv(os.LookupEnv); err != nil {
		return cfg, err
	}
	if edit != nil {
		edit(&cfg)
	}
	if k := kafka.Section(cfg); cfg.Broker == kafka.Name && len(k.Brokers) == 0 {
		cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.AllowAutoTopicCreation(), kfake.DefaultNumPartitions(3))
		if err != nil {
			return cfg, fmt.Errorf("start in-process Kafka: %w", err)
		}
		k.Brokers = cluster.ListenAddrs()
		kafka.SetSection(&cfg, k)
		fmt.Printf("OMNIBUS_KAFKA_BROKERS is not set: started an in-process Kafka (kfake)\n")
	}
	return cfg, cfg.Validate()
}

// Unique returns prefix followed by eight random hex digits: a name of this
// run's own, for a topic or stream prefix on a broker that keeps messages
// between runs.
func Unique(prefix string) string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
