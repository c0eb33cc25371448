package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/internal/testenv"
	"github.com/omnibus-go/omnibus/transports/kafka"
	"github.com/omnibus-go/omnibus/transports/postgres"
	"github.com/omnibus-go/omnibus/transports/redis"
)

// envOf is a lookupEnv over vars only.
func envOf(vars map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) {
		v, ok := vars[k]
		return v, ok
	}
}

// enqueue writes n keyed events to the outbox table.
func enqueue(t *testing.T, table string, n int) {
	t.Helper()
	ob, err := postgres.NewOutbox(postgres.OutboxConfig{Table: table})
	require.NoError(t, err)
	for i := range n {
		msg := message.NewMessage(fmt.Sprintf("00000000-0000-4000-8000-%012d", i+1), []byte("{}"))
		bus.SetPartitionKey(msg, fmt.Sprint("k", i%2))
		require.NoError(t, ob.Enqueue(context.Background(), testenv.Postgres(t), "orders", msg))
	}
}

// runUntilServing runs a serving command and returns its result if it exits
// by itself; if it starts serving instead (it did not refuse), it is stopped
// and started is true.
func runUntilServing(t *testing.T, a *app, args ...string) (r result, started bool) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	listening := make(chan struct{}, 1)
	a.onListen = func(string) { listening <- struct{}{} }
	done := make(chan result, 1)
	go func() { done <- cliWith(t, ctx, a, args...) }()
	select {
	case r = <-done:
		return r, false
	case <-listening:
		cancel()
		return <-done, true
	}
}

// With nothing but the database configured the broker defaults to memory: a
// relay would mark every row delivered into a broker nobody reads. relay and
// ingest refuse it unless it is chosen explicitly and acknowledged.
func TestRelayAndIngest_RefuseTheMemoryBrokerUnlessChosenAndAcknowledged(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	name := "cli_" + randomHex(6)
	testenv.DropPostgresPrefix(t, name)
	outbox := name + "_out"
	base := map[string]string{
		"OMNIBUS_POSTGRES_URL":               testenv.PostgresURL(),
		"OMNIBUS_OUTBOX_TABLE":               outbox,
		"OMNIBUS_OBSERVABILITY_METRICS_ADDR": "127.0.0.1:0",
		"OMNIBUS_OBSERVABILITY_LOG_LEVEL":    "warn",
	}
	ok(t, cliWith(t, ctx, &app{lookupEnv: envOf(base)}, "migrate"))
	enqueue(t, outbox, 3)

	with := func(extra map[string]string) map[string]string {
		m := map[string]string{}
		for k, v := range base {
			m[k] = v
		}
		for k, v := range extra {
			m[k] = v
		}
		return m
	}
	hint := map[string]string{
		"relay": "set broker: kafka|redis|postgres in the config or OMNIBUS_BROKER; " +
			"to relay into the in-process memory broker on purpose (tests, demos) set broker: memory and pass --allow-memory-broker",
		"ingest": "set broker: kafka|redis|postgres in the config or OMNIBUS_BROKER; " +
			"to ingest from the in-process memory broker on purpose (tests, demos) set broker: memory and pass --allow-memory-broker",
	}
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
	}{
		{"relay, broker not set", base, []string{"relay"}},
		{"relay, broker not set, acknowledged", base, []string{"relay", "--allow-memory-broker"}},
		{"relay, memory chosen, not acknowledged", with(map[string]string{"OMNIBUS_BROKER": "memory"}), []string{"relay"}},
		{"ingest, broker not set", with(map[string]string{"OMNIBUS_INBOX_TOPICS": "orders"}), []string{"ingest"}},
		{"ingest, memory chosen, not acknowledged", with(map[string]string{"OMNIBUS_BROKER": "memory", "OMNIBUS_INBOX_TOPICS": "orders"}), []string{"ingest"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, started := runUntilServing(t, &app{lookupEnv: envOf(tc.env)}, tc.args...)
			require.False(t, started, "%v started on the memory broker instead of refusing; stderr:\n%s", tc.args, r.stderr)
			assert.Equal(t, exitUsage, r.code, "stderr:\n%s", r.stderr)
			assert.Contains(t, r.stderr, "invalid config: broker: ")
			assert.Contains(t, r.stderr, hint[tc.args[0]])
			assert.Empty(t, r.stdout)
		})
	}
	assert.Equal(t, 3, count(t, `SELECT count(*) FROM `+outbox+` WHERE status = 'pending'`),
		"the refused relays left the outbox rows pending")

	// Chosen and acknowledged: the relay runs (tests, demos).
	r, started := runUntilServing(t, &app{lookupEnv: envOf(with(map[string]string{"OMNIBUS_BROKER": "memory"}))},
		"relay", "--allow-memory-broker")
	assert.True(t, started, "relay with broker memory and --allow-memory-broker should run; stderr:\n%s", r.stderr)
	ok(t, r)
}

// On a database without omnibus's tables a relay keeps running (and picks
// the table up once it exists); /healthz says it is alive, /readyz that it
// cannot work yet and why, until `omnibus migrate` has run.
func TestRelay_ReadyzIs503UntilTheSchemaIsMigratedThen200WithoutARestart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path, outbox, _ := tablesConfig(t, fmt.Sprintf("broker: redis\nredis:\n  addr: %s\n  stream_prefix: %q\nrelay:\n  poll_interval: 100ms\n",
		testenv.RedisAddr(), testenv.RedisPrefix(t)))
	addr, stop := runServing(t, "--config", path, "relay")

	var code int
	var body string
	testenv.Eventually(t, 30*time.Second, func() bool {
		code, _ = get(t, "http://"+addr+"/healthz")
		return code == http.StatusOK
	}, "/healthz says the relay is alive")
	testenv.Eventually(t, 30*time.Second, func() bool {
		code, body = get(t, "http://"+addr+"/readyz")
		return code == http.StatusServiceUnavailable && strings.Contains(body, "\nschema: ") && strings.Contains(body, "\nfetch: ")
	}, "/readyz reports the missing table and the failing fetches")
	assert.Contains(t, body, fmt.Sprintf("\nschema: outbox table %q does not exist: run `omnibus migrate`", outbox))
	assert.Contains(t, body, "\nfetch: the last ")

	ok(t, cli(t, ctx, "--config", path, "migrate"))
	enqueue(t, outbox, 2)
	testenv.Eventually(t, 30*time.Second, func() bool {
		code, body = get(t, "http://"+addr+"/readyz")
		return code == http.StatusOK
	}, "/readyz is 200 after migrate")
	assert.Equal(t, "ok\n", body)
	testenv.Eventually(t, 30*time.Second, func() bool {
		return count(t, `SELECT count(*) FROM `+outbox+` WHERE status = 'completed'`) == 2
	}, "the same relay delivers once the table exists")
	r := stop()
	ok(t, r)
	assert.Equal(t, 1, strings.Count(r.stderr, "level=WARN msg=\"not ready: outbox table"),
		"the relay logged once at start that the table is missing; stderr:\n%s", r.stderr)
	assert.Contains(t, r.stderr, "does not exist: run `omnibus migrate`")
}

func TestCommands_OnAnUnmigratedDatabaseSayRunMigrate(t *testing.T) {
	t.Parallel()
	path, outbox, inbox := tablesConfig(t, "")
	for _, args := range [][]string{
		{"outbox", "stats"},
		{"outbox", "failed"},
		{"outbox", "requeue", "--all"},
		{"outbox", "cleanup"},
		{"inbox", "stats", "--group", "billing"},
		{"inbox", "release-leases"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			t.Parallel()
			r := cli(t, context.Background(), append([]string{"--config", path}, args...)...)
			assert.Equal(t, exitFailure, r.code, "stderr:\n%s", r.stderr)
			table := outbox
			if args[0] == "inbox" {
				table = inbox
			}
			assert.Contains(t, r.stderr, fmt.Sprintf("%s table %q does not exist: run `omnibus migrate`", args[0], table))
		})
	}
}

func TestMigrate_SecondRunSaysAlreadyUpToDate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path, outbox, inbox := tablesConfig(t, "")
	tables := fmt.Sprintf("%s (outbox), %s (inbox)", outbox, inbox)
	r := cli(t, ctx, "--config", path, "migrate")
	ok(t, r)
	assert.Equal(t, fmt.Sprintf("migrated %s to version %d\n", tables, postgres.LatestSchemaVersion()), r.stdout)
	r = cli(t, ctx, "--config", path, "migrate")
	ok(t, r)
	assert.Equal(t, fmt.Sprintf("already up to date: %s at version %d\n", tables, postgres.LatestSchemaVersion()), r.stdout)
}

// One host, one config: relay and ingest started from the same file, with
// observability.metrics_addr not set, each serve /healthz on a loopback port
// of their own (relay 127.0.0.1:9464, ingest 127.0.0.1:9465). The test binds
// those ports: nothing else on the machine may hold them.
func TestRelayAndIngest_OneConfigBothServeOnLoopbackByDefault(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	name := "cli_" + randomHex(6)
	testenv.DropPostgresPrefix(t, name)
	path := writeConfig(t, fmt.Sprintf(`broker: redis
postgres:
  url: %q
  max_conns: 4
redis:
  addr: %s
  stream_prefix: %q
outbox:
  table: %s_out
inbox:
  table: %s_in
  topics: [orders]
observability:
  log_level: warn
`, testenv.PostgresURL(), testenv.RedisAddr(), testenv.RedisPrefix(t), name, name))
	ok(t, cli(t, ctx, "--config", path, "migrate"))

	relayAddr, stopRelay := runServing(t, "--config", path, "relay")
	ingestAddr, stopIngest := runServing(t, "--config", path, "ingest")
	for cmd, addr := range map[string]string{"relay": relayAddr, "ingest": ingestAddr} {
		host, _, err := net.SplitHostPort(addr)
		require.NoError(t, err)
		assert.True(t, net.ParseIP(host).IsLoopback(), "%s serves on %s: not a loopback address", cmd, addr)
		testenv.Eventually(t, 30*time.Second, func() bool {
			code, _ := get(t, "http://"+addr+"/healthz")
			return code == http.StatusOK
		}, "%s /healthz answers 200", cmd)
	}
	assert.Equal(t, "127.0.0.1:9464", relayAddr)
	assert.Equal(t, "127.0.0.1:9465", ingestAddr)
	ok(t, stopRelay())
	ok(t, stopIngest())
}

func TestFetchHealth_NotReadyWhileTheLastFetchFailedAndPassesEverythingOn(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	pg, err := postgres.NewMetrics(reg)
	require.NoError(t, err)
	f := &fetchHealth{next: pg}
	ctx := context.Background()
	assert.NoError(t, f.check(ctx), "no fetch yet is no failure")
	boom := errors.New("connection refused")
	f.ObserveFetch(postgres.FetchInfo{Table: "t", Err: boom})
	f.ObserveFetch(postgres.FetchInfo{Table: "t", Err: boom})
	err = f.check(ctx)
	require.ErrorIs(t, err, boom)
	assert.Contains(t, err.Error(), "the last 2 fetches failed")
	f.ObserveFetch(postgres.FetchInfo{Table: "t", Rows: 3})
	assert.NoError(t, f.check(ctx), "a successful fetch makes it ready again")

	f.ObserveLeaseLost(postgres.LeaseLostInfo{Table: "t", Rows: 1})
	n, err := testutil.GatherAndCount(reg, "omnibus_postgres_fetch_errors_total", "omnibus_postgres_leases_lost_total", "omnibus_postgres_fetch_size_rows")
	require.NoError(t, err)
	assert.Equal(t, 3, n, "fetch errors, lost leases and fetch sizes still reach the metrics")
}

func TestBrokerCheck_ProbesTheConfiguredBroker(t *testing.T) {
	t.Parallel()
	open, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer open.Close()
	closedLn, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	closed := closedLn.Addr().String()
	require.NoError(t, closedLn.Close())

	ctx := context.Background()
	for _, tc := range []struct {
		name string
		cfg  bus.Config
		want string // "" when reachable
	}{
		{"redis up", redisConfig(open.Addr().String()), ""},
		{"redis down", redisConfig(closed), "redis broker unreachable at " + closed},
		{"kafka, one of two up", kafkaConfig(closed, open.Addr().String()), ""},
		{"kafka down", kafkaConfig(closed), "kafka broker unreachable at " + closed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := brokerCheck(tc.cfg)(ctx)
			if tc.want == "" {
				assert.NoError(t, err)
			} else {
				assert.ErrorContains(t, err, tc.want)
			}
		})
	}
	assert.Nil(t, brokerCheck(bus.Config{Broker: bus.BrokerPostgres}), "the database check covers the postgres broker")
	assert.Nil(t, brokerCheck(bus.Config{Broker: bus.BrokerMemory}))
}

func TestSchemaCheck_SaysMissingThenBehindThenPasses(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path, outbox, inbox := tablesConfig(t, "")
	adm, err := postgres.NewAdmin(testenv.Postgres(t), postgres.OutboxTable(outbox))
	require.NoError(t, err)
	check := schemaCheck(adm)
	latest := postgres.LatestSchemaVersion()
	require.Greater(t, latest, 1)

	err = check(ctx)
	var se *schemaError
	require.ErrorAs(t, err, &se)
	assert.EqualError(t, err, fmt.Sprintf("outbox table %q does not exist: run `omnibus migrate` (with this configuration)", outbox))

	ok(t, cli(t, ctx, "--config", path, "migrate"))
	require.NoError(t, check(ctx))

	// A binary newer than the schema: the last migration is not recorded.
	_, err = testenv.Postgres(t).Exec(ctx, `DELETE FROM omnibus_schema_migrations WHERE table_name = $1 AND version = $2`, outbox, latest)
	require.NoError(t, err)
	assert.EqualError(t, check(ctx), fmt.Sprintf("outbox table %q is at schema version %d, this omnibus needs %d: run `omnibus migrate` (with this configuration)",
		outbox, latest-1, latest))
	r := cli(t, ctx, "--config", path, "migrate")
	ok(t, r)
	assert.Equal(t, fmt.Sprintf("migrated %s (outbox), %s (inbox) to version %d\n", outbox, inbox, latest), r.stdout,
		"not up to date: one table was behind")
	assert.NoError(t, check(ctx))
}

func redisConfig(addr string) bus.Config {
	cfg := bus.Config{Broker: redis.Name}
	redis.SetSection(&cfg, redis.Config{Addr: addr})
	return cfg
}

func kafkaConfig(brokers ...string) bus.Config {
	cfg := bus.Config{Broker: kafka.Name}
	kafka.SetSection(&cfg, kafka.Config{ConnectionConfig: kafka.ConnectionConfig{Brokers: brokers}})
	return cfg
}
