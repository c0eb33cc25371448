package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/internal/testenv"
	"github.com/omnibus-go/omnibus/middleware"
	"github.com/omnibus-go/omnibus/transports/kafka"
	"github.com/omnibus-go/omnibus/transports/postgres"
	"github.com/omnibus-go/omnibus/transports/redis"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

type result struct {
	stdout, stderr string
	code           int
}

// cli runs the command in process with no OMNIBUS_* environment, so the
// output depends on the arguments and the config file only.
func cli(t *testing.T, ctx context.Context, args ...string) result {
	t.Helper()
	return cliWith(t, ctx, &app{}, args...)
}

func cliWith(t *testing.T, ctx context.Context, a *app, args ...string) result {
	t.Helper()
	var stdout, stderr testenv.LogBuffer
	a.stdout, a.stderr = &stdout, &stderr
	if a.lookupEnv == nil {
		a.lookupEnv = func(string) (string, bool) { return "", false }
	}
	code := a.run(ctx, args)
	return result{stdout.String(), stderr.String(), code}
}

// writeConfig writes a config file and returns its path.
func writeConfig(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "omnibus.yaml")
	require.NoError(t, os.WriteFile(path, []byte(content), 0o600))
	return path
}

// tablesConfig is a config whose outbox and inbox tables belong to the test.
func tablesConfig(t *testing.T, extra string) (path, outbox, inbox string) {
	t.Helper()
	name := "cli_" + randomHex(6) // testenv.Name would leave no room for the suffixes
	testenv.DropPostgresPrefix(t, name)
	outbox, inbox = name+"_out", name+"_in"
	path = writeConfig(t, fmt.Sprintf("postgres:\n  url: %q\n  max_conns: 4\noutbox:\n  table: %s\ninbox:\n  table: %s\nobservability:\n  metrics_addr: 127.0.0.1:0\n  log_level: warn\n%s",
		testenv.PostgresURL(), outbox, inbox, extra))
	return path, outbox, inbox
}

func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if *update {
		require.NoError(t, os.MkdirAll("testdata", 0o755))
		require.NoError(t, os.WriteFile(path, []byte(got), 0o644))
		return
	}
	want, err := os.ReadFile(path)
	require.NoError(t, err, "missing golden file; run go test ./cmd/omnibus -update")
	assert.Equal(t, string(want), got, "output differs from %s (go test ./cmd/omnibus -update rewrites it)", path)
}

func ok(t *testing.T, r result) {
	t.Helper()
	require.Equal(t, exitOK, r.code, "exit status; stderr:\n%s\nstdout:\n%s", r.stderr, r.stdout)
}

func TestMigratePrint_Golden(t *testing.T) {
	t.Parallel()
	cfg := writeConfig(t, "outbox:\n  table: app_outbox\ninbox:\n  table: events.app_inbox\n")
	r := cli(t, context.Background(), "--config", cfg, "migrate", "--print")
	ok(t, r)
	golden(t, "migrate_print", r.stdout)
	want, err := postgres.MigrationSQL(postgres.OutboxTable("app_outbox"), postgres.InboxTable("events.app_inbox"))
	require.NoError(t, err)
	assert.Equal(t, want, r.stdout, "migrate --print is exactly what Migrate applies")

	r = cli(t, context.Background(), "--config", writeConfig(t, "broker: postgres\npostgres:\n  queue_table: q\n"), "migrate", "--print")
	ok(t, r)
	assert.Contains(t, r.stdout, `CREATE TABLE IF NOT EXISTS "q"`, "with broker postgres the queue table is migrated too")
}

// A service that only writes events configures only an outbox: migrate must
// not create a default inbox table it does not use.
func TestMigrate_OnlyAnOutboxConfiguredCreatesNoInbox(t *testing.T) {
	t.Parallel()
	r := cli(t, context.Background(), "--config", writeConfig(t, "outbox:\n  table: app_outbox\n"), "migrate", "--print")
	ok(t, r)
	assert.Contains(t, r.stdout, `CREATE TABLE IF NOT EXISTS "app_outbox"`)
	assert.NotContains(t, r.stdout, `omnibus_inbox`, "no inbox is configured, so none is created")

	r = cli(t, context.Background(), "--config", writeConfig(t, "inbox:\n  topics: [orders]\n"), "migrate", "--print")
	ok(t, r)
	assert.Contains(t, r.stdout, `CREATE TABLE IF NOT EXISTS "omnibus_inbox"`, "inbox topics configure the default inbox")
}

func TestConfigCheck_GoldenWithSecretsRedacted(t *testing.T) {
	t.Parallel()
	path := writeConfig(t, `broker: kafka
postgres:
  url: postgres://app:pg-secret@db.internal:5432/app?sslmode=require
kafka:
  brokers: [k1:9092, k2:9092]
  sasl:
    mechanism: SCRAM-SHA-512
    user: app
    password: kafka-secret
redis:
  password: redis-secret
inbox:
  topics: [orders, payments]
outbox:
  retention: 72h
`)
	r := cli(t, context.Background(), "--config", path, "config", "check")
	ok(t, r)
	out := strings.ReplaceAll(r.stdout, path, "CONFIG")
	golden(t, "config_check", out)
	for _, secret := range []string{"pg-secret", "kafka-secret", "redis-secret"} {
		assert.NotContains(t, r.stdout+r.stderr, secret)
	}

	// The environment wins over the file.
	a := &app{lookupEnv: func(k string) (string, bool) {
		v, ok := map[string]string{"OMNIBUS_KAFKA_BROKERS": "env:9092", "OMNIBUS_OUTBOX_RETENTION": "1h"}[k]
		return v, ok
	}}
	r = cliWith(t, context.Background(), a, "--config", path, "config", "check")
	ok(t, r)
	assert.Contains(t, r.stdout, "    - env:9092\n")
	assert.NotContains(t, r.stdout, "k1:9092")
	assert.Contains(t, r.stdout, "retention: 1h0m0s")
}

// A typo'd environment variable fails `config check` and every start, as a
// typo'd YAML key does; on main `OMNIBUS_BROKR=redis` printed "configuration
// OK … broker: memory".
func TestConfigCheck_UnknownEnvironmentVariableExits2(t *testing.T) {
	t.Parallel()
	env := map[string]string{"OMNIBUS_BROKR": "redis", "OMNIBUS_CONFIG": ""}
	a := &app{
		lookupEnv: func(k string) (string, bool) { v, ok := env[k]; return v, ok },
		environ:   func() []string { return []string{"OMNIBUS_BROKR=redis", "OMNIBUS_CONFIG=", "HOME=/root"} },
	}
	r := cliWith(t, context.Background(), a, "config", "check")
	assert.Equal(t, 2, r.code, "stdout: %s\nstderr: %s", r.stdout, r.stderr)
	assert.Contains(t, r.stderr, "environment variable OMNIBUS_BROKR sets no configuration key (did you mean OMNIBUS_BROKER?)")
	assert.NotContains(t, r.stdout, "configuration OK")
}

func TestBadUsageAndBadConfigExit2(t *testing.T) {
	t.Parallel()
	bad := writeConfig(t, "broker: pigeon\n")
	unknownKey := writeConfig(t, "outbox:\n  tabel: x\n")
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no command", nil, "missing command"},
		{"unknown command", []string{"bogus"}, `unknown command "bogus" for "omnibus"`},
		{"group without subcommand", []string{"outbox"}, "omnibus outbox needs a subcommand: cleanup, failed, release-leases, requeue, show, stats, sweep-lanes"},
		{"unknown subcommand", []string{"inbox", "purge"}, `unknown command "purge" for "omnibus inbox"`},
		{"unknown flag", []string{"outbox", "stats", "--nope"}, "unknown flag: --nope"},
		{"bad flag value", []string{"outbox", "cleanup", "--older-than", "soon"}, `invalid argument "soon" for "--older-than"`},
		{"requeue nothing", []string{"outbox", "requeue"}, "requeue takes row ids or --all"},
		{"requeue both", []string{"outbox", "requeue", "--all", "3"}, "requeue takes row ids or --all"},
		{"requeue bad id", []string{"outbox", "requeue", "x7"}, `"x7" is not a row id`},
		{"failed limit", []string{"outbox", "failed", "--limit", "0"}, "--limit must be at least 1"},
		{"cleanup batch", []string{"inbox", "cleanup", "--batch", "0"}, "--batch must be at least 1"},
		{"extra argument", []string{"migrate", "now"}, `unknown command "now" for "omnibus migrate"`},
		{"demo orders", []string{"demo", "--orders", "0"}, "--orders must be at least 1"},
		{"missing config file", []string{"--config", "/nonexistent/omnibus.yaml", "config", "check"}, "invalid config: read config file"},
		{"invalid config", []string{"--config", bad, "config", "check"}, `invalid config: broker: "pigeon" is not one of the brokers linked into this program (memory, postgres, kafka, nats, rabbitmq, redis); to link another, import its transport package`},
		{"unknown config key", []string{"--config", unknownKey, "migrate", "--print"}, "outbox.tabel (line 2): field tabel not found"},
		{"bad log format", []string{"--log-format", "xml", "config", "check"}, `observability.log_format: "xml" is not one of text, json`},
		{"bad log level", []string{"--log-level", "loud", "relay"}, `observability.log_level: "loud" is not one of debug, info, warn, error`},
		{"ingest without topics", []string{"--config", writeConfig(t, "broker: memory\nobservability:\n  metrics_addr: \"-\"\n"), "ingest", "--allow-memory-broker"}, "inbox.topics: required by ingest"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := cli(t, context.Background(), tc.args...)
			assert.Equal(t, exitUsage, r.code, "stderr:\n%s", r.stderr)
			assert.Contains(t, r.stderr, tc.want)
			assert.Empty(t, r.stdout)
		})
	}
}

func TestBadEnvironmentExits2NamingTheVariable(t *testing.T) {
	t.Parallel()
	a := &app{lookupEnv: func(k string) (string, bool) {
		if k == "OMNIBUS_RELAY_BATCH_SIZE" {
			return "many", true
		}
		return "", false
	}}
	r := cliWith(t, context.Background(), a, "config", "check")
	assert.Equal(t, exitUsage, r.code)
	assert.Contains(t, r.stderr, `relay.batch_size: OMNIBUS_RELAY_BATCH_SIZE="many": not an integer`)
}

func TestHelpExits0(t *testing.T) {
	t.Parallel()
	r := cli(t, context.Background(), "--help")
	ok(t, r)
	assert.Contains(t, r.stdout, "outbox")
	r = cli(t, context.Background(), "outbox", "cleanup", "--help")
	ok(t, r)
	assert.Contains(t, r.stdout, "--older-than")
}

func TestUnreachableDatabaseExits1(t *testing.T) {
	t.Parallel()
	cfg := writeConfig(t, "postgres:\n  url: postgres://u:topsecret@127.0.0.1:1/db?connect_timeout=2\n")
	r := cli(t, context.Background(), "--config", cfg, "outbox", "stats")
	assert.Equal(t, exitFailure, r.code, r.stderr)
	assert.Contains(t, r.stderr, "connect to PostgreSQL at postgres://u:REDACTED@127.0.0.1:1/db")
	assert.NotContains(t, r.stderr, "topsecret")
}

var ageRE = regexp.MustCompile(`(oldest pending age\s+|"oldest_pending_age_seconds": )[^\s,]+`)

// TestOutboxAdmin_Golden walks the admin commands over a table in a known
// state: stats, failed, requeue (one, missing, all), cleanup, stats again.
func TestOutboxAdmin_Golden(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path, outbox, _ := tablesConfig(t, "")
	ok(t, cli(t, ctx, "--config", path, "migrate"))
	ok(t, cli(t, ctx, "--config", path, "migrate")) // idempotent

	pool := testenv.Postgres(t)
	ob, err := postgres.NewOutbox(postgres.OutboxConfig{Table: outbox})
	require.NoError(t, err)
	for i := 1; i <= 6; i++ {
		msg := message.NewMessage(fmt.Sprintf("00000000-0000-4000-8000-%012d", i), []byte("{}"))
		if i <= 4 {
			bus.SetPartitionKey(msg, fmt.Sprintf("order-%d", i%2))
		}
		bus.SetEventType(msg, "order.paid")
		require.NoError(t, ob.Enqueue(ctx, pool, "orders", msg))
	}
	// Events 1-2 completed a month ago, 3-4 failed, 5-6 pending; fixed times.
	// Keyed rows get their ids after their lane is locked, so ids are not
	// 1..6: the rows are addressed by event id, and the ids the commands
	// take are read back (they are the same on every fresh table).
	ev := func(i int) string { return fmt.Sprintf("00000000-0000-4000-8000-%012d", i) }
	_, err = pool.Exec(ctx, `
		UPDATE `+outbox+` SET created_at = '2026-01-02T03:04:05Z';
		UPDATE `+outbox+` SET status = 'completed', completed_at = now() - interval '30 days' WHERE event_id IN ('`+ev(1)+`', '`+ev(2)+`');
		UPDATE `+outbox+` SET status = 'failed', attempts = 6, last_error = 'kafka: broker rejected the record:
			message too large' WHERE event_id IN ('`+ev(3)+`', '`+ev(4)+`');
		UPDATE `+outbox+` SET attempts = 6, max_attempts = 6 WHERE event_id = '`+ev(4)+`';`)
	require.NoError(t, err)
	idOf := func(i int) string {
		var id int64
		require.NoError(t, pool.QueryRow(ctx, `SELECT id FROM `+outbox+` WHERE event_id = $1`, ev(i)).Scan(&id))
		return fmt.Sprint(id)
	}
	id3 := idOf(3)

	var transcript strings.Builder
	step := func(args ...string) result {
		r := cli(t, ctx, append([]string{"--config", path}, args...)...)
		out := ageRE.ReplaceAllString(r.stdout, "${1}<age>")
		fmt.Fprintf(&transcript, "$ omnibus %s\n%s", strings.Join(args, " "), out)
		if r.code != exitOK {
			fmt.Fprintf(&transcript, "[exit %d] %s", r.code, strings.ReplaceAll(r.stderr, outbox, "TABLE"))
		}
		return r
	}
	step("outbox", "stats")
	step("outbox", "failed")
	step("outbox", "failed", "--limit", "1")
	step("outbox", "failed", "--after", id3)
	step("outbox", "failed", "--json")
	r := step("outbox", "failed", "--json", "--limit", "1")
	assert.Equal(t, "more may follow: --after "+id3+"\n", r.stderr, "the paging hint goes to stderr, the JSON alone to stdout")
	step("outbox", "requeue", id3)
	step("outbox", "requeue", id3, "999")
	r = step("outbox", "requeue", "--all")
	assert.Equal(t, "requeue: 1/1 rows\n", r.stderr, "plain progress lines when not on a terminal")
	r = step("outbox", "cleanup")
	assert.Equal(t, "cleanup: 2/2 rows\n", r.stderr)
	step("outbox", "cleanup", "--older-than", "0s")
	step("outbox", "failed")
	// Row 5's relay stopped without settling and its lease expired; the lane
	// of order-0 was deleted by hand, and its writers' notes with it (a key
	// with a note waiting is not missing its lane: the next fetch makes it).
	_, err = pool.Exec(ctx, `
		UPDATE `+outbox+` SET locked_by = 'gone', locked_until = now() - interval '1 minute' WHERE event_id = '`+ev(5)+`';
		DELETE FROM `+outbox+`_lanes WHERE partition_key = 'order-0';
		DELETE FROM `+outbox+`_notes WHERE partition_key = 'order-0';`)
	require.NoError(t, err)
	step("outbox", "stats")
	step("outbox", "release-leases")
	step("outbox", "release-leases")
	step("outbox", "sweep-lanes")
	step("outbox", "sweep-lanes")
	step("outbox", "stats")
	step("outbox", "stats", "--json")
	golden(t, "outbox_admin", strings.ReplaceAll(transcript.String(), outbox, "TABLE"))
}

func TestInboxAdmin_GoldenPerGroup(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path, _, inbox := tablesConfig(t, "")
	ok(t, cli(t, ctx, "--config", path, "migrate"))
	pool := testenv.Postgres(t)
	in, err := postgres.NewInbox(postgres.InboxConfig{Table: inbox})
	require.NoError(t, err)
	for i := 1; i <= 3; i++ {
		msg := message.NewMessage(fmt.Sprintf("00000000-0000-4000-8000-%012d", i), []byte("{}"))
		bus.SetPartitionKey(msg, "order-1")
		bus.SetEventType(msg, "order.created")
		for _, g := range []string{"billing", "shipping"} {
			_, err := in.StoreWith(ctx, pool, postgres.StoreOptions{Group: g, Topic: "orders"}, msg)
			require.NoError(t, err)
		}
	}
	_, err = pool.Exec(ctx, `
		UPDATE `+inbox+` SET created_at = '2026-01-02T03:04:05Z';
		UPDATE `+inbox+` SET status = 'failed', attempts = 1, last_error = 'no handler for event type "order.created"'
			WHERE message_id = '00000000-0000-4000-8000-000000000001';
		UPDATE `+inbox+` SET status = 'completed', completed_at = now() - interval '10 days'
			WHERE message_id = '00000000-0000-4000-8000-000000000002' AND consumer_group = 'billing';`)
	require.NoError(t, err)

	var transcript strings.Builder
	for _, args := range [][]string{
		{"inbox", "stats"},
		{"inbox", "stats", "--group", "billing"},
		{"inbox", "failed"},
		{"inbox", "failed", "--group", "shipping"},
		{"inbox", "failed", "--json"},
		{"inbox", "requeue", "--group", "billing", "--all"},
		{"inbox", "cleanup", "--group", "shipping"},
		{"inbox", "cleanup", "--group", "billing"},
		{"inbox", "stats", "--group", "billing"},
	} {
		r := cli(t, ctx, append([]string{"--config", path}, args...)...)
		ok(t, r)
		fmt.Fprintf(&transcript, "$ omnibus %s\n%s", strings.Join(args, " "), ageRE.ReplaceAllString(r.stdout, "${1}<age>"))
	}
	golden(t, "inbox_admin", strings.ReplaceAll(transcript.String(), inbox, "TABLE"))
}

// runServing starts a serving command (relay, ingest) and returns the address
// of its metrics endpoint and a function that stops it (as SIGTERM would)
// and returns its result.
func runServing(t *testing.T, args ...string) (addr string, stop func() result) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	listening := make(chan string, 1)
	a := &app{onListen: func(addr string) { listening <- addr }}
	done := make(chan result, 1)
	go func() { done <- cliWith(t, ctx, a, args...) }()
	select {
	case addr = <-listening:
	case r := <-done:
		cancel()
		t.Fatalf("%v exited early with %d: %s", args, r.code, r.stderr)
	case <-time.After(30 * time.Second):
		cancel()
		t.Fatalf("%v did not start serving metrics", args)
	}
	var once sync.Once
	var r result
	stop = func() result {
		once.Do(func() { cancel(); r = <-done })
		return r
	}
	t.Cleanup(func() { stop() })
	return addr, stop
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

func count(t *testing.T, sql string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, testenv.Postgres(t).QueryRow(context.Background(), sql, args...).Scan(&n))
	return n
}

func TestRelay_DeliversServesMetricsAndStopsGracefully(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	prefix := testenv.RedisPrefix(t)
	path, outbox, _ := tablesConfig(t, fmt.Sprintf("broker: redis\nredis:\n  addr: %s\n  stream_prefix: %q\n", testenv.RedisAddr(), prefix))
	ok(t, cli(t, ctx, "--config", path, "migrate"))

	ob, err := postgres.NewOutbox(postgres.OutboxConfig{Table: outbox})
	require.NoError(t, err)
	pool := testenv.Postgres(t)
	for i := range 10 {
		msg := message.NewMessage(fmt.Sprintf("00000000-0000-4000-8000-%012d", i+1), []byte("{}"))
		bus.SetPartitionKey(msg, fmt.Sprint("k", i%3))
		require.NoError(t, ob.Enqueue(ctx, pool, "orders", msg))
	}
	addr, stop := runServing(t, "--config", path, "relay")
	testenv.Eventually(t, 30*time.Second, func() bool {
		return count(t, `SELECT count(*) FROM `+outbox+` WHERE status = 'completed'`) == 10
	}, "outbox relayed")
	code, body := get(t, "http://"+addr+"/healthz")
	assert.Equal(t, http.StatusOK, code)
	assert.Equal(t, "ok\n", body)
	code, body = get(t, "http://"+addr+"/metrics")
	require.Equal(t, http.StatusOK, code)
	for _, want := range []string{
		`omnibus_handler_messages_total{handler="omnibus_outbox_relay",result="ok",topic="orders"} 10`,
		`omnibus_publisher_messages_total{result="ok",topic="orders",transport="redis"} 10`,
		fmt.Sprintf(`omnibus_outbox_completed_rows{table=%q} 10`, outbox),
		fmt.Sprintf(`omnibus_outbox_oldest_pending_age_seconds{table=%q} 0`, outbox),
		fmt.Sprintf(`omnibus_postgres_fetch_duration_seconds_count{consumer_group="",table=%q}`, outbox),
		"go_goroutines",
	} {
		assert.Contains(t, body, want)
	}

	r := stop()
	ok(t, r)
	assert.Equal(t, 0, count(t, `SELECT count(*) FROM `+outbox+` WHERE locked_by IS NOT NULL AND status = 'pending'`), "no lease left behind")

	// The events reached the stream, in order per key.
	sub, err := redis.NewSubscriber(redis.SubscriberConfig{Client: testenv.Redis(t), StreamPrefix: prefix, ConsumerGroup: "check", OrderByKey: true}, nil)
	require.NoError(t, err)
	defer sub.Close()
	rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	ch, err := sub.Subscribe(rctx, "orders")
	require.NoError(t, err)
	last := map[string]string{}
	for range 10 {
		select {
		case m := <-ch:
			k := bus.PartitionKey(m)
			assert.Less(t, last[k], m.UUID, "key %s in order", k)
			last[k] = m.UUID
			m.Ack()
		case <-rctx.Done():
			t.Fatal("not every relayed event is on the stream")
		}
	}
}

func TestIngest_StoresTheBrokersMessagesIntoTheInbox(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	brokers := testenv.Kafka(t)
	topic := testenv.KafkaTopic(t, brokers, 2)
	path, _, inbox := tablesConfig(t, fmt.Sprintf("broker: kafka\nkafka:\n  brokers: [%s]\n", strings.Join(brokers, ", ")))
	group := testenv.Name(t)
	require.NoError(t, os.WriteFile(path, []byte(strings.Replace(readFile(t, path), "  table: "+inbox+"\n",
		fmt.Sprintf("  table: %s\n  consumer_group: %s\n  topics: [%s]\n", inbox, group, topic), 1)), 0o600))
	ok(t, cli(t, ctx, "--config", path, "migrate"))

	pub, err := kafka.NewPublisher(kafka.PublisherConfig{ConnectionConfig: kafka.ConnectionConfig{Brokers: brokers}}, nil)
	require.NoError(t, err)
	defer pub.Close()
	for i := range 5 {
		msg := message.NewMessage(fmt.Sprintf("00000000-0000-4000-8000-%012d", i+1), []byte("{}"))
		bus.SetPartitionKey(msg, "order-1")
		require.NoError(t, pub.Publish(topic, msg))
	}
	require.NoError(t, pub.Publish(topic, message.NewMessage("00000000-0000-4000-8000-000000000001", []byte("{}"))), "a duplicate")

	addr, stop := runServing(t, "--config", path, "ingest")
	testenv.Eventually(t, 30*time.Second, func() bool {
		return count(t, `SELECT count(*) FROM `+inbox) == 5
	}, "messages stored")
	testenv.Eventually(t, 30*time.Second, func() bool {
		_, body := get(t, "http://"+addr+"/metrics")
		return strings.Contains(body, fmt.Sprintf(`omnibus_handler_messages_total{handler="omnibus_inbox_ingest_%s",result="ok",topic=%q} 6`, topic, topic))
	}, "duplicate seen")
	_, body := get(t, "http://"+addr+"/metrics")
	assert.Contains(t, body, fmt.Sprintf(`omnibus_inbox_stored_messages_total{consumer_group=%q,result="duplicate",table=%q} 1`, group, inbox))
	assert.Contains(t, body, fmt.Sprintf(`omnibus_inbox_stored_messages_total{consumer_group=%q,result="new",table=%q} 5`, group, inbox))
	ok(t, stop())
	assert.Equal(t, 5, count(t, `SELECT count(*) FROM `+inbox+` WHERE topic = $1 AND status = 'pending'`, topic))
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return string(b)
}

// demoTopicRE finds the topic in the demo's first line.
var demoTopicRE = regexp.MustCompile(`\(topic (\S+)\)`)

// tablesWithPrefix counts the tables, functions and migration records whose
// name starts with prefix.
func tablesWithPrefix(t *testing.T, prefix string) int {
	t.Helper()
	return count(t, `SELECT (SELECT count(*) FROM pg_tables WHERE schemaname = 'public' AND starts_with(tablename, $1))
		+ (SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'public' AND starts_with(p.proname, $1))
		+ (SELECT count(*) FROM omnibus_schema_migrations WHERE starts_with(table_name, $1))`, prefix)
}

func TestDemo_EveryBrokerDeliversInOrderExactlyOnce(t *testing.T) {
	t.Parallel()
	for _, broker := range []string{bus.BrokerMemory, bus.BrokerPostgres, kafka.Name, redis.Name} {
		t.Run(broker, func(t *testing.T) {
			t.Parallel()
			extra := ""
			var streamPrefix string
			if broker == redis.Name {
				streamPrefix = testenv.RedisPrefix(t)
				extra = fmt.Sprintf("redis:\n  addr: %s\n  stream_prefix: %q\n", testenv.RedisAddr(), streamPrefix)
			}
			path, _, _ := tablesConfig(t, extra)
			prefix := "demo_" + broker + "_" + randomHex(4)
			testenv.DropPostgresPrefix(t, prefix)
			r := cli(t, context.Background(), "--config", path, "demo", "--broker", broker, "--orders", "6",
				"--duplicates", "3", "--flaky-every", "3", "--table-prefix", prefix)
			ok(t, r)
			assert.Contains(t, r.stdout, "through the "+broker+" broker")
			assert.Regexp(t, `written to the outbox\s+18\n`, r.stdout)
			assert.Regexp(t, `handled \(effects applied once\)\s+18\n`, r.stdout)
			assert.Regexp(t, `retried after a failure\s+2\n`, r.stdout)
			assert.Regexp(t, `failed\s+0\n`, r.stdout)
			if broker != bus.BrokerPostgres {
				assert.Regexp(t, `deduplicated by the inbox\s+[3-9]\n`, r.stdout)
			}
			assert.Contains(t, r.stdout, "verified: 6 of 6 orders saw created → paid → shipped in order")

			// It leaves nothing behind: tables, trigger functions, migration
			// records, streams.
			assert.Zero(t, tablesWithPrefix(t, prefix), "the demo dropped what it created in PostgreSQL (stderr: %s)", r.stderr)
			if broker == redis.Name {
				m := demoTopicRE.FindStringSubmatch(r.stdout)
				require.NotNil(t, m, "the demo names its topic")
				stream := streamPrefix + m[1]
				n, err := testenv.Redis(t).Exists(context.Background(), stream, stream+redis.DefaultDeadLetterSuffix).Result()
				require.NoError(t, err)
				assert.Zero(t, n, "the demo deleted its streams %s*", stream)
			}
		})
	}
}

func TestDemo_KeepLeavesTheTablesForInspection(t *testing.T) {
	t.Parallel()
	path, _, _ := tablesConfig(t, "")
	prefix := "demo_keep_" + randomHex(4)
	testenv.DropPostgresPrefix(t, prefix)
	r := cli(t, context.Background(), "--config", path, "demo", "--orders", "2", "--table-prefix", prefix, "--keep")
	ok(t, r)
	assert.Contains(t, r.stdout, fmt.Sprintf("kept the demo's tables %s_*", prefix))
	assert.Equal(t, 6, count(t, `SELECT count(*) FROM `+prefix+`_outbox WHERE status = 'completed'`))
	assert.Equal(t, 6, count(t, `SELECT count(*) FROM `+prefix+`_inbox WHERE status = 'completed'`))
}

// TestConfigDefaultsMatchTheTransports keeps bus's mirrored defaults equal to
// the constants of the packages that apply them.
func TestConfigDefaultsMatchTheTransports(t *testing.T) {
	t.Parallel()
	assert.Equal(t, postgres.DefaultOutboxTable, bus.DefaultOutboxTable)
	assert.Equal(t, postgres.DefaultInboxTable, bus.DefaultInboxTable)
	assert.Equal(t, postgres.DefaultMaxAttempts, bus.DefaultMaxAttempts)
	assert.Equal(t, postgres.DefaultBatchSize, bus.DefaultRelayBatchSize)
	assert.Equal(t, postgres.DefaultRunLength, bus.DefaultRelayRunLength)
	assert.Equal(t, postgres.DefaultLease, bus.DefaultRelayLease)
	assert.Equal(t, postgres.DefaultPollInterval, bus.DefaultRelayPollInterval)
	assert.Equal(t, postgres.DefaultSweepInterval, bus.DefaultRelaySweepInterval)
	assert.Equal(t, postgres.DefaultVacuumInterval, bus.DefaultRelayVacuumInterval)
	assert.Equal(t, postgres.DefaultCloseTimeout, bus.DefaultRelayCloseTimeout)
	assert.Equal(t, postgres.DefaultTransientDelay, bus.DefaultTransientDelay)
	assert.Equal(t, middleware.DefaultBase, bus.DefaultRetryBase)
	assert.Equal(t, middleware.DefaultCap, bus.DefaultRetryCap)
	assert.Equal(t, middleware.DefaultTimeout, bus.DefaultRelayTimeout)
	assert.Equal(t, middleware.DefaultFailureThreshold, bus.DefaultBreakerThreshold)
	assert.Equal(t, middleware.DefaultOpenTimeout, bus.DefaultBreakerOpenTimeout)
}

func TestProgressBar(t *testing.T) {
	t.Parallel()
	p := &progress{label: "cleanup", unit: "rows", total: 200}
	assert.Equal(t, "cleanup [===============>              ]  50% 100/200 rows", p.bar(100, 30))
	assert.Equal(t, "cleanup [==============================] 100% 200/200 rows", p.bar(200, 30))
	assert.Equal(t, "cleanup [>                             ]   0% 0/200 rows", p.bar(0, 30))
	p.total = 0
	assert.Equal(t, "cleanup 7 rows", p.bar(7, 30))
	var buf bytes.Buffer
	p = &progress{w: &buf, label: "requeue", unit: "rows", total: 3, terminal: true}
	p.update(1)
	p.update(3)
	p.finish()
	assert.Equal(t, "\rrequeue [==========>                   ]  33% 1/3 rows\rrequeue [==============================] 100% 3/3 rows\n", buf.String())
}
