package bus

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestLoadConfig_ExpandsEnvironmentVariablesInTheFile: ${VAR} and $VAR in a
// value of the YAML file are replaced by the variable's value, as text: a
// value with YAML's special characters stays one string, a number key gets a
// number, and $$ is a literal $. Comments and keys are not expanded.
func TestLoadConfig_ExpandsEnvironmentVariablesInTheFile(t *testing.T) {
	t.Parallel()
	path := writeFile(t, `# ${NOT_SET_IN_A_COMMENT} is ignored
broker: $BROKER
postgres:
  url: postgres://app:${PGPASSWORD}@db:5432/app?sslmode=require
  max_conns: ${MAX_CONNS}
redis:
  password: "${REDIS_PASSWORD}"
  stream_prefix: price$$-${PREFIX}-
  username: '$USER_NAME'
inbox:
  topics: [$TOPIC, orders]
relay:
  lease: ${LEASE}
kafka:
  tls:
    enable: ${TLS}
  client_id: null$$
  sasl:
    mechanism: PLAIN
    user: app
    password: ${KAFKA_PASSWORD}
`)
	cfg, err := loadConfig(path, env(map[string]string{
		"BROKER":                "kafka",
		"PGPASSWORD":            "p%40ss: #word*&!",
		"MAX_CONNS":             "25",
		"REDIS_PASSWORD":        `quo"te'`,
		"PREFIX":                "eu",
		"USER_NAME":             "svc",
		"TOPIC":                 "payments",
		"LEASE":                 "45s",
		"TLS":                   "true",
		"KAFKA_PASSWORD":        "null",
		"OMNIBUS_KAFKA_BROKERS": "k:9092",
	}))
	require.NoError(t, err)
	assert.Equal(t, "kafka", cfg.Broker)
	assert.Equal(t, "postgres://app:p%40ss: #word*&!@db:5432/app?sslmode=require", cfg.Postgres.URL, "the value is inserted as text, not as YAML")
	assert.Equal(t, 25, cfg.Postgres.MaxConns, "a number key gets the number")
	assert.Equal(t, `quo"te'`, keyValue(cfg, "redis.password"))
	assert.Equal(t, "price$-eu-", keyValue(cfg, "redis.stream_prefix"), "$$ is a literal $")
	assert.Equal(t, "svc", keyValue(cfg, "redis.username"), "quoted values are expanded too")
	assert.Equal(t, []string{"payments", "orders"}, cfg.Inbox.Topics)
	assert.Equal(t, 45*time.Second, cfg.Relay.Lease)
	assert.Equal(t, true, keyValue(cfg, "kafka.tls.enable"), "a boolean key gets a boolean")
	assert.Equal(t, "null$", keyValue(cfg, "kafka.client_id"))
	assert.Equal(t, "null", keyValue(cfg, "kafka.sasl.password"), `a string key keeps "null" as a string`)
}

func TestLoadConfig_DollarNotFollowedByANameIsKept(t *testing.T) {
	t.Parallel()
	path := writeFile(t, "redis:\n  password: pa$1 $ w$-rd$\n")
	cfg, err := loadConfig(path, env(nil))
	require.NoError(t, err)
	assert.Equal(t, "pa$1 $ w$-rd$", keyValue(cfg, "redis.password"))
}

// TestLoadConfig_VariableErrors: an unset variable is an error naming the
// variable, the key and the line, never an empty string; so is a ${ that is
// not a reference. A $NAME inside a secret value is not named (it may be
// part of a password that needed $$).
func TestLoadConfig_VariableErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, file string
		want       []string
		hidden     string
	}{
		{"unset braced variable", "postgres:\n  url: postgres://u:${PGPASSWORD}@db/app\n",
			[]string{"postgres.url: line 2: ${PGPASSWORD} is not set", "$$ for a literal $"}, ""},
		{"unset bare variable in a plain key", "broker: $BROKER\n",
			[]string{"broker: line 1: $BROKER is not set"}, ""},
		{"unset bare variable in a list", "inbox:\n  topics:\n    - orders\n    - $TOPIC\n",
			[]string{"inbox.topics[1]: line 4: $TOPIC is not set"}, ""},
		{"unset bare name inside a secret", "redis:\n  password: Pa$sw0rdTail\n",
			[]string{"redis.password: line 2: a $NAME in this secret value is not set"}, "sw0rdTail"},
		{"unterminated ${", "redis:\n  addr: ${REDIS_ADDR\n",
			[]string{"redis.addr: line 2: a ${ without a variable name and its closing }"}, ""},
		{"not a name in ${}", "redis:\n  password: ab${x-y}cdSecretTail\n",
			[]string{"redis.password: line 2: a ${ without a variable name and its closing }"}, "cdSecretTail"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := loadConfig(writeFile(t, tc.file), env(nil))
			require.Error(t, err)
			assert.ErrorIs(t, err, ErrInvalidConfig)
			for _, w := range tc.want {
				assert.Contains(t, err.Error(), w)
			}
			if tc.hidden != "" {
				assert.NotContains(t, err.Error(), tc.hidden)
			}
		})
	}
}

// TestLoadConfig_ExpandedSecretNeverShown: a value from a variable whose name
// says secret (PASSWORD, TOKEN, KEY, …), or expanded into a secret key, is
// not shown by errors or printing, wherever it lands.
func TestLoadConfig_ExpandedSecretNeverShown(t *testing.T) {
	t.Parallel()
	vars := map[string]string{"DB_PASSWORD": "hunter2secretvalue", "PLAIN": "hunter3secretvalue"}
	for _, tc := range []struct{ name, file, secret string }{
		{"in a number key", "relay:\n  batch_size: ${DB_PASSWORD}\n", "hunter2"},
		{"in an enumeration", "broker: ${DB_PASSWORD}\n", "hunter2secretvalue"},
		{"in a host:port", "redis:\n  addr: ${DB_PASSWORD}\n", "hunter2secretvalue"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := loadConfig(writeFile(t, tc.file), env(vars))
			require.Error(t, err)
			assertNoSecret(t, err.Error(), tc.secret, "load error")
		})
	}
	cfg, err := loadConfig(writeFile(t, "redis:\n  password: ${PLAIN}\n  stream_prefix: ${DB_PASSWORD}\n"), env(vars))
	require.NoError(t, err)
	for where, out := range printed(cfg) {
		assertNoSecret(t, out, "hunter2secretvalue", where)
		assertNoSecret(t, out, "hunter3secretvalue", where)
	}
}

// TestLoadConfig_AnAliasedValueIsExpandedOnce: $$ becomes $ once, however
// many aliases use the anchored value.
func TestLoadConfig_AnAliasedValueIsExpandedOnce(t *testing.T) {
	t.Parallel()
	path := writeFile(t, "inbox:\n  topics: &t [a, $$b]\npostgres:\n  queue_groups: *t\n")
	cfg, err := loadConfig(path, env(map[string]string{"b": "not used"}))
	require.NoError(t, err)
	assert.Equal(t, []string{"a", "$b"}, cfg.Inbox.Topics)
	assert.Equal(t, []string{"a", "$b"}, cfg.Postgres.QueueGroups)
}

func TestLoadConfig_KeysAreNotExpanded(t *testing.T) {
	t.Parallel()
	_, err := loadConfig(writeFile(t, "${BROKER_KEY}: kafka\n"), env(map[string]string{"BROKER_KEY": "broker"}))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "${BROKER_KEY} (line 1): field ${BROKER_KEY} not found")
}
