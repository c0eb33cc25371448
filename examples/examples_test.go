// Package examples_test runs every example program the way a user would
// (`go run ./examples/<name>`: built once here, then executed) against the
// real services, with a timeout, and checks what it prints.
package examples_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pgx/v5"
	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omnibus-go/omnibus/internal/testenv"
)

// binDir holds the example binaries, built once by TestMain.
var binDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "omnibus-examples-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	build := exec.Command(goBin, "build", "-o", dir+string(filepath.Separator), "./...")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build the examples:", err)
		os.Exit(1)
	}
	binDir = dir
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// runExample runs the example name with the test services' addresses and
// extra environment, and returns its output; it fails the test when the
// program fails or runs for more than 90 s.
func runExample(t *testing.T, name string, env ...string) string {
	t.Helper()
	return runExampleArgs(t, name, nil, env...)
}

// runExampleArgs is runExample with command-line arguments.
func runExampleArgs(t *testing.T, name string, args []string, env ...string) string {
	t.Helper()
	testenv.Postgres(t) // a clear failure when PostgreSQL is down
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, name), args...)
	cmd.Env = append(filteredEnv(),
		"OMNIBUS_POSTGRES_URL="+testenv.PostgresURL(),
		"OMNIBUS_REDIS_ADDR="+testenv.RedisAddr(),
	)
	cmd.Env = append(cmd.Env, env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	require.NoError(t, err, "%s %v failed (context: %v)\nstdout:\n%s\nstderr:\n%s", name, env, ctx.Err(), stdout.String(), stderr.String())
	return stdout.String()
}

// filteredEnv is the environment without OMNIBUS_* variables, so a
// developer's settings do not change what the examples do.
func filteredEnv() []string {
	var out []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "OMNIBUS_") {
			out = append(out, kv)
		}
	}
	return out
}

// leftInPostgres lists what is left in PostgreSQL whose name starts with one
// of prefixes: tables, functions, schemas and migration records.
func leftInPostgres(t *testing.T, prefixes ...string) []string {
	t.Helper()
	rows, err := testenv.Postgres(t).Query(context.Background(), `
		WITH p AS (SELECT unnest($1::text[]) AS prefix)
		SELECT 'table ' || schemaname || '.' || tablename FROM pg_tables, p WHERE starts_with(tablename, p.prefix)
		UNION ALL
		SELECT 'function ' || proname FROM pg_proc, p WHERE starts_with(proname, p.prefix)
		UNION ALL
		SELECT 'schema ' || nspname FROM pg_namespace, p WHERE starts_with(nspname, p.prefix)
		UNION ALL
		SELECT 'migration record ' || table_name FROM public.omnibus_schema_migrations, p WHERE starts_with(table_name, p.prefix)`,
		prefixes)
	require.NoError(t, err)
	left, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return left
}

// leftInRedis lists the keys that start with prefix.
func leftInRedis(t *testing.T, prefix string) []string {
	t.Helper()
	keys, err := testenv.Redis(t).Keys(context.Background(), prefix+"*").Result()
	require.NoError(t, err)
	return keys
}

func TestOutboxBasic(t *testing.T) {
	t.Parallel()
	out := runExample(t, "outbox-basic")
	assert.Contains(t, out, "wrote 3 orders and 9 events in 9 transactions")
	assert.Contains(t, out, "all 9 events delivered in order per order id; 0 left pending")
	assert.Empty(t, leftInPostgres(t, "omnibus_example_outbox", "example_orders"), "the example drops what it created")

	out = runExampleArgs(t, "outbox-basic", []string{"-keep"})
	assert.Contains(t, out, "kept the example's tables")
	assert.NotEmpty(t, leftInPostgres(t, "omnibus_example_outbox", "example_orders"), "-keep keeps them")
	runExample(t, "outbox-basic") // drops them again
	assert.Empty(t, leftInPostgres(t, "omnibus_example_outbox", "example_orders"))
}

func TestOutboxRabbitMQ(t *testing.T) {
	t.Parallel()
	out := runExample(t, "outbox-rabbitmq", "OMNIBUS_RABBITMQ_URL="+testenv.RabbitMQ(t))
	assert.Contains(t, out, "wrote 8 orders and 24 events")
	assert.Contains(t, out, "all 24 events delivered through 4 shard queues in order per order id")
	assert.Empty(t, leftInPostgres(t, "omnibus_example_rabbitmq_outbox", "example_rabbitmq_orders"), "the example drops what it created")
}

func TestOutboxNATS(t *testing.T) {
	t.Parallel()
	out := runExample(t, "outbox-nats", "OMNIBUS_NATS_URL="+testenv.NATS(t))
	assert.Contains(t, out, "wrote 8 orders and 24 events")
	assert.Contains(t, out, "all 24 events delivered through 4 shard subjects in order per order id")
	assert.Empty(t, leftInPostgres(t, "omnibus_example_nats_outbox", "example_nats_orders"), "the example drops what it created")
	assert.False(t, natsStreamExists(t, "omnibus_example_orders"), "the example deletes its stream")
}

// natsStreamExists tells whether the NATS server has stream name.
func natsStreamExists(t *testing.T, name string) bool {
	t.Helper()
	nc, err := natsgo.Connect(testenv.NATS(t))
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	_, err = js.Stream(context.Background(), name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return false
	}
	require.NoError(t, err)
	return true
}

func TestBrokerSwap_SameCodeOnEveryBroker(t *testing.T) {
	t.Parallel()
	for _, broker := range []string{"memory", "postgres", "redis", "kafka", "rabbitmq", "nats"} {
		t.Run(broker, func(t *testing.T) {
			t.Parallel()
			env := []string{"OMNIBUS_BROKER=" + broker}
			switch broker {
			case "kafka":
				env = append(env, "OMNIBUS_KAFKA_BROKERS="+strings.Join(testenv.Kafka(t), ","))
			case "rabbitmq":
				env = append(env, "OMNIBUS_RABBITMQ_URL="+testenv.RabbitMQ(t), "OMNIBUS_RABBITMQ_EXCHANGE_PREFIX="+testenv.RabbitMQPrefix(t))
			case "nats":
				env = append(env, "OMNIBUS_NATS_URL="+testenv.NATS(t), "OMNIBUS_NATS_SUBJECT_PREFIX="+testenv.NATSPrefix(t))
			}
			// Its own stream prefix and queue table, to see what it leaves.
			prefix := testenv.RedisPrefix(t)
			queue := "broker_swap_q_" + strings.ToLower(watermill.NewShortUUID())
			env = append(env, "OMNIBUS_REDIS_STREAM_PREFIX="+prefix, "OMNIBUS_POSTGRES_QUEUE_TABLE="+queue)
			testenv.DropPostgresPrefix(t, queue)
			out := runExample(t, "broker-swap", env...)
			assert.Contains(t, out, "broker: "+broker+"\n")
			for _, id := range []string{"order-1", "order-2", "order-3"} {
				assert.Contains(t, out, id+": created, paid, shipped\n")
			}
			assert.Contains(t, out, "9 messages published and received through "+broker+", in order per key")
			switch broker {
			case "redis":
				assert.Empty(t, leftInRedis(t, prefix), "the example deletes its stream")
			case "postgres":
				var n int
				require.NoError(t, testenv.Postgres(t).QueryRow(context.Background(), `SELECT count(*) FROM `+queue).Scan(&n))
				assert.Zero(t, n, "the example deletes its rows from the queue table")
			}
		})
	}
}

// TestCompleteWorker runs the worker over two brokers, one after the other:
// it recreates its own tables on start.
func TestCompleteWorker(t *testing.T) {
	t.Parallel()
	for _, broker := range []string{"memory", "redis"} {
		prefix := testenv.RedisPrefix(t)
		out := runExample(t, "complete-worker", "OMNIBUS_BROKER="+broker, "OMNIBUS_REDIS_STREAM_PREFIX="+prefix)
		assert.Empty(t, leftInPostgres(t, "complete_worker_"), "the example drops what it created")
		assert.Empty(t, leftInRedis(t, prefix), "the example deletes its streams")
		assert.Equal(t, fmt.Sprintf(`complete-worker: broker %s, topic orders
placed 3 orders
confirmed by the dispatcher: order-1, order-2, order-3
seen by the audit log: order-1, order-2, order-3
shut down gracefully
`, broker), out)
	}
}

// The examples of the transport and inbox work: they must run and say that
// they delivered everything.
func TestTransportAndInboxExamples(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		want     *regexp.Regexp
		postgres []string // what it creates in PostgreSQL, by name prefix
		redis    string   // what it creates in Redis, by key prefix
	}{
		"outbox-redis": {regexp.MustCompile(`all \d+ events delivered through stream .* in order per order id; 0 outbox rows left pending`),
			[]string{"omnibus_example_redis_outbox", "example_redis_orders"}, "omnibus:example:orders"},
		"outbox-kafka": {regexp.MustCompile(`all \d+ events delivered through Kafka topic .* in order per order id; 0 outbox rows left pending`),
			[]string{"omnibus_example_kafka_outbox", "example_kafka_orders"}, ""},
		"inbox-dispatcher": {regexp.MustCompile(`ledger: \d+ entries, exactly one per handled event`), []string{"omnibus_example_inbox"}, ""},
		"saga":             {regexp.MustCompile(`saga `), []string{"omnibus_example_saga"}, ""},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			env := []string{}
			var brokers []string
			if name == "outbox-kafka" {
				brokers = testenv.Kafka(t)
				env = append(env, "OMNIBUS_KAFKA_BROKERS="+strings.Join(brokers, ","))
			}
			assert.Regexp(t, tc.want, runExample(t, name, env...))
			assert.Empty(t, leftInPostgres(t, tc.postgres...), "the example drops what it created")
			if tc.redis != "" {
				assert.Empty(t, leftInRedis(t, tc.redis), "the example deletes its streams")
			}
			if brokers != nil {
				admin, err := sarama.NewClusterAdmin(brokers, sarama.NewConfig())
				require.NoError(t, err)
				defer admin.Close()
				topics, err := admin.ListTopics()
				require.NoError(t, err)
				assert.NotContains(t, topics, "omnibus.example.orders", "the example deletes its topic")
			}
		})
	}
}
