package bus

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestConfig_ZeroIsAValidMemoryBus(t *testing.T) {
	t.Parallel()
	require.NoError(t, Config{}.Validate())
	c := Config{}.WithDefaults()
	assert.Equal(t, BrokerMemory, c.Broker)
	assert.Equal(t, DefaultOutboxTable, c.Outbox.Table)
	assert.Equal(t, []string{DefaultConsumerGroup}, c.Postgres.QueueGroups, "queue groups default to the inbox group")
	assert.Equal(t, DefaultRetention, c.Inbox.Retention)
	assert.Equal(t, c, c.WithDefaults(), "WithDefaults is idempotent")
}

func TestConfig_ValidateNamesTheFieldAndAcceptedValues(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		mutate func(*Config)
		field  string
		reason string
	}{
		{"unknown broker", func(c *Config) { c.Broker = "pigeon" }, "broker", `"pigeon" is not one of the brokers linked into this program (memory, postgres, kafka, nats, rabbitmq, redis); to link another, import its transport package`},
		{"postgres url", func(c *Config) { c.Postgres.URL = "localhost" }, "postgres.url", "neither a postgres:// URL nor a key=value"},
		{"postgres url unparsable", func(c *Config) { c.Postgres.URL = "postgres://u:pw@h:badport/db%zz" }, "postgres.url", "not a valid URL"},
		{"postgres url other scheme", func(c *Config) { c.Postgres.URL = "mysql://u:pw@h/db" }, "postgres.url", `scheme "mysql" is not postgres or postgresql`},
		{"postgres url @ in the host", func(c *Config) { c.Postgres.URL = "postgres://u:p@ss@h/db" }, "postgres.url", "host 1 contains '@' (percent-encode"},
		{"postgres url @ in the database", func(c *Config) { c.Postgres.URL = "postgres://u:12/p@h/db" }, "postgres.url", "the database name contains '@'"},
		{"postgres url port", func(c *Config) { c.Postgres.URL = "postgres://u:pw@h1:5432,h2:x/db" }, "postgres.url", "host 2: the port is not a number"},
		{"postgres url ipv6", func(c *Config) { c.Postgres.URL = "postgres://[::1/db" }, "postgres.url", "host 1: an IPv6 address without its closing ]"},
		{"postgres url query", func(c *Config) { c.Postgres.URL = "postgres://h/db?sslmode" }, "postgres.url", "query parameter 1 is not key=value"},
		{"postgres url percent", func(c *Config) { c.Postgres.URL = "postgres://u:a%zz@h/db" }, "postgres.url", "not followed by two hex digits"},
		{"postgres key=value unquoted space", func(c *Config) { c.Postgres.URL = "host=h password=a b" }, "postgres.url", `after key "password": text is not key=value`},
		{"postgres key=value unterminated", func(c *Config) { c.Postgres.URL = "host=h password='a b" }, "postgres.url", `the quoted value of key "password" has no closing quote`},
		{"max conns", func(c *Config) { c.Postgres.MaxConns = -1 }, "postgres.max_conns", "must not be negative"},
		{"queue table", func(c *Config) { c.Postgres.QueueTable = "1queue" }, "postgres.queue_table", "not a table name"},
		{"queue table shared", func(c *Config) { c.Postgres.QueueTable = DefaultOutboxTable }, "postgres.queue_table", "needs a table of its own"},
		{"queue group empty", func(c *Config) { c.Postgres.QueueGroups = []string{"a", " "} }, "postgres.queue_groups[1]", "must not be empty"},
		{"queue group twice", func(c *Config) { c.Postgres.QueueGroups = []string{"a", "a"} }, "postgres.queue_groups", `"a" is listed twice`},
		{"kafka brokers required", func(c *Config) { c.Broker = "kafka" }, "kafka.brokers", "required when broker is kafka"},
		{"kafka broker address", func(c *Config) { *c = with(*c, "kafka.brokers", "localhost") }, "kafka.brokers[0]", "not host:port"},
		{"kafka broker port", func(c *Config) { *c = with(*c, "kafka.brokers", "localhost:99999") }, "kafka.brokers[0]", "port"},
		{"kafka version", func(c *Config) { *c = with(*c, "kafka.version", "3") }, "kafka.version", "not major.minor.patch"},
		{"kafka offset", func(c *Config) { *c = with(*c, "kafka.initial_offset", "latest") }, "kafka.initial_offset", `"latest" is not one of oldest, newest`},
		{"kafka in flight", func(c *Config) { *c = with(*c, "kafka.max_in_flight", "-2") }, "kafka.max_in_flight", "must not be negative"},
		{"kafka read-ahead", func(c *Config) { *c = with(*c, "kafka.max_read_ahead_bytes", "-1") }, "kafka.max_read_ahead_bytes", "must not be negative"},
		{"kafka fetch wait", func(c *Config) { *c = with(*c, "kafka.fetch_max_wait", "-1s") }, "kafka.fetch_max_wait", "must be at least 1ms"},
		{"kafka fetch wait below 1ms", func(c *Config) { *c = with(*c, "kafka.fetch_max_wait", "1µs") }, "kafka.fetch_max_wait", "must be at least 1ms"},
		{"kafka tls pair", func(c *Config) { *c = with(*c, "kafka.tls.cert_file", "c.pem") }, "kafka.tls.cert_file", "set both or neither"},
		{"kafka sasl mechanism", func(c *Config) { *c = with(*c, "kafka.sasl.mechanism", "GSSAPI") }, "kafka.sasl.mechanism", "is not one of , PLAIN, SCRAM-SHA-256, SCRAM-SHA-512"},
		{"kafka sasl user", func(c *Config) { *c = with(*c, "kafka.sasl.mechanism", "PLAIN", "kafka.sasl.password", "p") }, "kafka.sasl.user", "required when kafka.sasl.mechanism is set"},
		{"kafka sasl password", func(c *Config) { *c = with(*c, "kafka.sasl.mechanism", "PLAIN", "kafka.sasl.user", "u") }, "kafka.sasl.password", "required when kafka.sasl.mechanism is set"},
		{"redis addr", func(c *Config) { *c = with(*c, "redis.addr", "redis") }, "redis.addr", "not host:port"},
		{"redis db", func(c *Config) { *c = with(*c, "redis.db", "-1") }, "redis.db", "must not be negative"},
		{"redis max len", func(c *Config) { *c = with(*c, "redis.max_len", "-1") }, "redis.max_len", "must not be negative"},
		{"redis ordering", func(c *Config) { *c = with(*c, "redis.ordering", "strict") }, "redis.ordering", `"strict" is not one of key, none`},
		{"redis tls ca file missing", func(c *Config) { *c = with(*c, "redis.tls_ca_file", "/nonexistent/ca.pem") }, "redis.tls_ca_file", "no such file"},
		{"redis tls ca file without certificate", func(c *Config) { *c = with(*c, "redis.tls_ca_file", "config_test.go") }, "redis.tls_ca_file", "holds no PEM certificate"},
		{"redis tls server name with port", func(c *Config) { *c = with(*c, "redis.tls_server_name", "redis.example:6380") }, "redis.tls_server_name", "not a host name"},
		{"redis tls server name with scheme", func(c *Config) { *c = with(*c, "redis.tls_server_name", "rediss://redis.example") }, "redis.tls_server_name", "not a host name"},
		{"outbox table", func(c *Config) { c.Outbox.Table = "a.b.c" }, "outbox.table", "not a table name"},
		{"outbox table too long", func(c *Config) { c.Outbox.Table = strings.Repeat("t", 48) }, "outbox.table", "longer than 47 bytes"},
		{"outbox attempts", func(c *Config) { c.Outbox.MaxAttempts = -1 }, "outbox.max_attempts", "must not be negative"},
		{"outbox retention", func(c *Config) { c.Outbox.Retention = -time.Hour }, "outbox.retention", "must not be negative"},
		{"outbox partition interval below a minute", func(c *Config) { *c = with(*c, "outbox.partition_interval", "30s") }, "outbox.partition_interval", "must be 0 (one table) or from 1m0s to 744h0m0s (31 days), got 30s"},
		{"outbox partition interval over 31 days", func(c *Config) { c.Outbox.PartitionInterval = 32 * 24 * time.Hour }, "outbox.partition_interval", "from 1m0s to 744h0m0s"},
		{"outbox partition interval negative", func(c *Config) { c.Outbox.PartitionInterval = -time.Hour }, "outbox.partition_interval", "must be 0 (one table)"},
		{"inbox partition interval not whole minutes", func(c *Config) { *c = with(*c, "inbox.partition_interval", "90s") }, "inbox.partition_interval", "whole number of minutes, got 1m30s"},
		{"inbox table", func(c *Config) { c.Inbox.Table = "in box" }, "inbox.table", "not a table name"},
		{"inbox is outbox", func(c *Config) { c.Inbox.Table = DefaultOutboxTable }, "inbox.table", "also outbox.table"},
		{"inbox group spaces", func(c *Config) { c.Inbox.ConsumerGroup = " g" }, "inbox.consumer_group", "leading or trailing spaces"},
		{"inbox topic empty", func(c *Config) { c.Inbox.Topics = []string{""} }, "inbox.topics[0]", "must not be empty"},
		{"inbox topic twice", func(c *Config) { c.Inbox.Topics = []string{"o", "o"} }, "inbox.topics", `"o" is listed twice`},
		{"inbox attempts", func(c *Config) { c.Inbox.MaxAttempts = -3 }, "inbox.max_attempts", "must not be negative"},
		{"inbox retention", func(c *Config) { c.Inbox.Retention = -1 }, "inbox.retention", "must not be negative"},
		{"retry cap below base", func(c *Config) { c.Retry.Base, c.Retry.Cap = time.Minute, time.Second }, "retry.cap", "less than retry.base"},
		{"retry transient", func(c *Config) { c.Retry.TransientDelay = -time.Second }, "retry.transient_delay", "must not be negative"},
		{"relay batch", func(c *Config) { c.Relay.BatchSize = -1 }, "relay.batch_size", "must not be negative"},
		{"relay run", func(c *Config) { c.Relay.RunLength = -1 }, "relay.run_length", "must not be negative"},
		{"relay lease negative", func(c *Config) { c.Relay.Lease = -time.Second }, "relay.lease", "must not be negative"},
		{"relay lease short", func(c *Config) { c.Relay.Lease = 10 * time.Millisecond }, "relay.lease", "too short"},
		{"relay poll", func(c *Config) { c.Relay.PollInterval = -1 }, "relay.poll_interval", "must not be negative"},
		{"relay timeout", func(c *Config) { c.Relay.Timeout = -1 }, "relay.timeout", "must not be negative"},
		{"relay failed policy", func(c *Config) { c.Relay.FailedPolicy = "drop" }, "relay.failed_policy", `"drop" is not one of skip, block`},
		{"relay breaker threshold", func(c *Config) { c.Relay.BreakerThreshold = -1 }, "relay.breaker_threshold", "must not be negative"},
		{"relay breaker timeout", func(c *Config) { c.Relay.BreakerOpenTimeout = -1 }, "relay.breaker_open_timeout", "must not be negative"},
		{"relay close timeout", func(c *Config) { c.Relay.CloseTimeout = -1 }, "relay.close_timeout", "must not be negative"},
		{"log level", func(c *Config) { c.Observability.LogLevel = "verbose" }, "observability.log_level", `"verbose" is not one of debug, info, warn, error`},
		{"log format", func(c *Config) { c.Observability.LogFormat = "xml" }, "observability.log_format", `"xml" is not one of text, json`},
		{"metrics addr", func(c *Config) { c.Observability.MetricsAddr = "9464" }, "observability.metrics_addr", "not host:port"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var c Config
			tc.mutate(&c)
			err := c.Validate()
			require.Error(t, err, "a config with a bad %s must not validate", tc.field)
			assert.ErrorIs(t, err, ErrInvalidConfig)
			var ce *ConfigError
			require.ErrorAs(t, err, &ce)
			assert.Equal(t, tc.field, ce.Field, "the error names the key")
			assert.Contains(t, ce.Reason, tc.reason)
			assert.Contains(t, err.Error(), "invalid config: "+tc.field+": ")
		})
	}
}

func TestConfig_ValidateReportsEveryBadKey(t *testing.T) {
	t.Parallel()
	err := with(Config{Broker: "x"}, "redis.db", "-1").Validate()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "broker:")
	assert.Contains(t, err.Error(), "redis.db:")
}

func TestConfig_ValidAlternatives(t *testing.T) {
	t.Parallel()
	for _, c := range []Config{
		with(Config{Broker: "kafka"}, "kafka.brokers", "k1:9092,[::1]:9093", "kafka.sasl.mechanism", "SCRAM-SHA-512", "kafka.sasl.user", "u", "kafka.sasl.password", "p"),
		with(Config{Broker: "redis"}, "redis.addr", "redis:6380", "redis.ordering", "none"),
		{Broker: BrokerPostgres, Postgres: PostgresConfig{URL: "host=db user=app password=secret dbname=app", QueueGroups: []string{"a", "b"}}},
		{Postgres: PostgresConfig{URL: "host = db password = 'it\\'s a secret' application_name=svc://worker"}},
		{Postgres: PostgresConfig{URL: "postgres://u:pw@[::1]:5432,[::2]:5433,h3/db?sslmode=require&target_session_attrs=read-write"}},
		{Postgres: PostgresConfig{URL: "postgresql://u:p#ss@h/db"}},
		{Postgres: PostgresConfig{URL: "postgres://u:p?ss@h/db?application_name=a@b"}},
		{Postgres: PostgresConfig{URL: "postgres:///db?host=/var/run/postgresql"}},
		{Outbox: OutboxConfig{Table: "events.outbox"}, Inbox: InboxConfig{Table: "events.inbox"}},
		{Retry: RetryConfig{Base: -1}, Observability: ObservabilityConfig{MetricsAddr: MetricsOff}},
	} {
		assert.NoError(t, c.Validate(), "%+v", c)
	}
}

func writeFile(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "omnibus.yaml")
	require.NoError(t, os.WriteFile(path, []byte(content), 0o600))
	return path
}

func env(vars map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := vars[k]; return v, ok }
}

func TestLoadConfig_EnvironmentWinsOverTheFile(t *testing.T) {
	t.Parallel()
	path := writeFile(t, `
broker: redis
redis:
  addr: file-redis:6379
  password: from-file
kafka:
  brokers: [file:9092]
outbox:
  table: file_outbox
  retention: 48h
relay:
  batch_size: 10
inbox:
  topics: [orders]
`)
	cfg, err := loadConfig(path, env(map[string]string{
		"OMNIBUS_BROKER":             "kafka",
		"OMNIBUS_KAFKA_BROKERS":      "env1:9092, env2:9092",
		"OMNIBUS_REDIS_PASSWORD":     "from-env",
		"OMNIBUS_OUTBOX_RETENTION":   "1h30m",
		"OMNIBUS_RELAY_BATCH_SIZE":   "250",
		"OMNIBUS_KAFKA_TLS_ENABLE":   "true",
		"OMNIBUS_INBOX_TOPICS":       "orders,payments",
		"OMNIBUS_TEST_POSTGRES_URL":  "ignored: not a key",
		"OMNIBUS_OBSERVABILITY_LOG_": "ignored too",
	}))
	require.NoError(t, err)
	assert.Equal(t, "kafka", cfg.Broker)
	assert.Equal(t, []string{"env1:9092", "env2:9092"}, keyValue(cfg, "kafka.brokers"))
	assert.Equal(t, "file-redis:6379", keyValue(cfg, "redis.addr"), "keys the environment does not set keep the file's value")
	assert.Equal(t, "from-env", keyValue(cfg, "redis.password"))
	assert.Equal(t, "file_outbox", cfg.Outbox.Table)
	assert.Equal(t, 90*time.Minute, cfg.Outbox.Retention)
	assert.Equal(t, 250, cfg.Relay.BatchSize)
	assert.Equal(t, true, keyValue(cfg, "kafka.tls.enable"))
	assert.Equal(t, []string{"orders", "payments"}, cfg.Inbox.Topics)
	assert.Equal(t, DefaultRelayLease, cfg.Relay.Lease, "defaults fill the rest")
}

func TestLoadConfig_WithoutAFileReadsTheEnvironment(t *testing.T) {
	t.Parallel()
	cfg, err := loadConfig("", env(map[string]string{"OMNIBUS_BROKER": "postgres"}))
	require.NoError(t, err)
	assert.Equal(t, BrokerPostgres, cfg.Broker)
}

func TestLoadConfig_Errors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		file string
		env  map[string]string
		want string
	}{
		{"unknown key", "brokr: kafka\n", nil, "field brokr not found"},
		{"unknown nested key", "kafka:\n  broker: [a:1]\n", nil, "field broker not found"},
		{"section of a broker not linked", "pigeon:\n  loft: roof\n", nil, "pigeon (line 1): field pigeon not found in type bus.Config; if it is the section of a broker, that broker is not linked into this program (import its transport package"},
		{"wrong type", "relay:\n  batch_size: lots\n", nil, "relay.batch_size (line 2): cannot unmarshal"},
		{"duration without unit", "relay:\n  lease: 30\n", nil, "relay.lease (line 2): cannot unmarshal !!int `30` into time.Duration"},
		{"bad env duration", "", map[string]string{"OMNIBUS_RELAY_LEASE": "30"}, "relay.lease: OMNIBUS_RELAY_LEASE=\"30\": not a duration"},
		{"bad env int", "", map[string]string{"OMNIBUS_POSTGRES_MAX_CONNS": "ten"}, "postgres.max_conns: OMNIBUS_POSTGRES_MAX_CONNS=\"ten\": not an integer"},
		{"bad env bool", "", map[string]string{"OMNIBUS_REDIS_TLS": "yes please"}, "redis.tls: OMNIBUS_REDIS_TLS=\"yes please\": not a boolean"},
		{"invalid after merge", "broker: kafka\n", nil, "kafka.brokers: required when broker is kafka"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			path := ""
			if tc.file != "" {
				path = writeFile(t, tc.file)
			}
			_, err := loadConfig(path, env(tc.env))
			require.Error(t, err)
			assert.ErrorIs(t, err, ErrInvalidConfig)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
	_, err := loadConfig(filepath.Join(t.TempDir(), "missing.yaml"), env(nil))
	assert.ErrorIs(t, err, ErrInvalidConfig)
	assert.Contains(t, err.Error(), "read config file")
}

func TestLoadConfig_EmptyFileIsAllDefaults(t *testing.T) {
	t.Parallel()
	cfg, err := loadConfig(writeFile(t, "# nothing\n"), env(nil))
	require.NoError(t, err)
	assert.Equal(t, Config{}.WithDefaults(), cfg)
}

func TestEnvName(t *testing.T) {
	t.Parallel()
	assert.Equal(t, "OMNIBUS_KAFKA_SASL_PASSWORD", EnvName("kafka.sasl.password"))
	assert.Equal(t, "OMNIBUS_POSTGRES_URL", EnvName("postgres.url"))
	keys := ConfigKeys()
	assert.Contains(t, keys, "observability.metrics_addr")
	assert.Contains(t, keys, "kafka.tls.insecure_skip_verify")
}

func TestConfig_SecretsAreRedactedWheneverPrinted(t *testing.T) {
	t.Parallel()
	c := with(Config{
		Postgres:      PostgresConfig{URL: "postgres://app:pg-secret@db:5432/app?sslmode=require"},
		Observability: ObservabilityConfig{OTLPEndpoint: "https://tenant:otlp-secret@collector:4318/v1/traces"},
	}, "kafka.sasl.mechanism", "PLAIN", "kafka.sasl.user", "kuser", "kafka.sasl.password", "kafka-secret",
		"redis.password", "redis-secret")
	var logged strings.Builder
	slog.New(slog.NewTextHandler(&logged, nil)).Info("config", "config", c)
	var jsonLogged strings.Builder
	slog.New(slog.NewJSONHandler(&jsonLogged, nil)).Info("config", "config", c)
	for name, out := range map[string]string{
		"String": c.String(),
		"%v":     fmt.Sprintf("%v", c),
		"%+v":    fmt.Sprintf("%+v", c),
		"%#v":    fmt.Sprintf("%#v", c),
		"%s":     fmt.Sprintf("%s", c),
		"slog":   logged.String(),
		"json":   jsonLogged.String(),
	} {
		for _, secret := range []string{"pg-secret", "kafka-secret", "redis-secret", "otlp-secret"} {
			assert.NotContains(t, out, secret, "%s output shows a secret", name)
		}
		assert.Contains(t, out, Redacted, name)
	}
	assert.Contains(t, c.String(), "url: postgres://app:REDACTED@db:5432/app?sslmode=require")
	assert.Contains(t, c.String(), "user: kuser", "non-secret keys are shown")
	assert.Contains(t, logged.String(), "config.redis.password=REDACTED")
	assert.Equal(t, "kafka-secret", keyValue(c, "kafka.sasl.password"), "Redacted does not touch the original")
	assert.Empty(t, keyValue(Config{}.Redacted(), "redis.password"), "an unset secret stays empty")
}

func TestRedactDSN(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"postgres://u:p%40ss@h/db":                       "postgres://u:REDACTED@h/db",
		"postgresql://u@h/db":                            "postgresql://u@h/db",
		"postgres://h/db?user=u&password=secret":         "postgres://h/db?user=u&password=REDACTED",
		"host=h user=u password=secret dbname=d":         "host=h user=u password=REDACTED dbname=d",
		"host=h password = 'se cret' dbname=d":           "host=h password = 'REDACTED' dbname=d",
		"postgres://u:sec:ret@h:bad/db%zz":               "postgres://u:REDACTED@h:bad/db%zz",
		"":                                               "",
		"parse \"postgres://u:pw@h:x/\": invalid port":   "parse \"postgres://u:REDACTED@h:x/\": invalid port",
		"host=h PASSWORD=secret":                         "host=h PASSWORD=REDACTED",
		"postgres://user:pass@host/db?sslmode=disable&x": "postgres://user:REDACTED@host/db?sslmode=disable&x",
	} {
		assert.Equal(t, want, RedactDSN(in), in)
	}
}

func TestRedactDSN_ParsesBeforeItMasks(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, in, want string }{
		{"key=value with :// in another value", "host=db password=s3cret application_name=svc://worker", "host=db password=REDACTED application_name=svc://worker"},
		{"key=value escaped quote", `password='it\'s' host=h`, "password='REDACTED' host=h"},
		{"key=value escaped space", `password=a\ b host=h`, "password=REDACTED host=h"},
		{"key=value sslpassword", "sslkey=/k.pem sslpassword=pp", "sslkey=/k.pem sslpassword=REDACTED"},
		{"key=value: the word after = is the value, even after a space", "host=h password= dbname=d", "host=h password= REDACTED"},
		{"key=value unquoted space: the rest is masked", "password=a b c=d", "password=REDACTED REDACTED"},
		{"key=value unterminated quote", "host=h password='abc", "host=h password=REDACTED"},
		{"not a connection string", "hunter2", "REDACTED"},
		{"URL with an unescaped @", "postgres://u:p@ss@host/db", "postgres://u:REDACTED@host/db"},
		{"URL with an unescaped ? and @", "postgres://u:1?x@h/db", "postgres://u:REDACTED@h/db"},
		{"URL with an unescaped #", "postgres://u:p#ss@h/db", "postgres://u:REDACTED@h/db"},
		{"URL malformed with a password parameter", "postgres://u@h:badport/db?password=qs", "postgres://u@h:badport/db?password=REDACTED"},
		{"URL percent-encoded parameter name", "postgres://h/db?pass%77ord=x&sslmode=require", "postgres://h/db?pass%77ord=REDACTED&sslmode=require"},
		{"URL with several IPv6 hosts", "postgres://u:pw@[::1]:5432,[::2]:5433/db", "postgres://u:REDACTED@[::1]:5432,[::2]:5433/db"},
		{"URL with @ in a query value: masked to the last @", "postgres://u:pw@h/db?application_name=a@b", "postgres://u:REDACTED@b"},
		{"URL without password, @ in a query value", "postgres://h/db?application_name=a@b", "postgres://h/db?application_name=a@b"},
		{"URL empty password", "postgres://u:@h/db", "postgres://u:@h/db"},
		{"http URL token parameter", "https://collector:4318/v1/traces?api_key=tok", "https://collector:4318/v1/traces?api_key=REDACTED"},
		{"text quoting a key=value string", "cannot parse `host=h password=xxxxx port=abc`: invalid port", "cannot parse `host=h password=REDACTED port=abc`: invalid port"},
		{"text quoting a URL", `parse "postgres://u:pw@h:x/": invalid port`, `parse "postgres://u:REDACTED@h:x/": invalid port`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			assert.Equal(t, tc.want, RedactDSN(tc.in))
		})
	}
}

func TestConfigError(t *testing.T) {
	t.Parallel()
	err := fmt.Errorf("open: %w", &ConfigError{Field: "broker", Reason: "bad"})
	assert.True(t, errors.Is(err, ErrInvalidConfig))
	assert.Equal(t, "open: invalid config: broker: bad", err.Error())
}
