package bus

import (
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"unicode"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// assertNoSecret fails when out shows secret, or any piece of it of four or
// more letters and digits (so that a secret redacted only up to its first
// '@' or '"' still fails).
func assertNoSecret(t *testing.T, out, secret, where string) {
	t.Helper()
	pieces := []string{secret}
	for _, piece := range strings.FieldsFunc(secret, func(r rune) bool { return !unicode.IsLetter(r) && !unicode.IsDigit(r) }) {
		if len(piece) >= 4 && piece != secret {
			pieces = append(pieces, piece)
		}
	}
	for _, piece := range pieces {
		if i := strings.Index(out, piece); i >= 0 {
			t.Errorf("%s shows %q of the secret %q: …%s…", where, piece, secret, out[max(0, i-60):min(len(out), i+len(piece)+20)])
		}
	}
}

// printed is every way a Config is shown: String, the fmt verbs, slog.
func printed(c Config) map[string]string {
	var text, json strings.Builder
	slog.New(slog.NewTextHandler(&text, nil)).Info("config", "config", c)
	slog.New(slog.NewJSONHandler(&json, nil)).Info("config", "config", c)
	return map[string]string{
		"String":    c.String(),
		"%v":        fmt.Sprintf("%v", c),
		"%+v":       fmt.Sprintf("%+v", c),
		"%#v":       fmt.Sprintf("%#v", c),
		"%s":        fmt.Sprintf("%s", c),
		"GoString":  c.GoString(),
		"slog text": text.String(),
		"slog json": json.String(),
	}
}

// TestConfig_SecretNeverShownInOutputOrValidationErrors puts a secret into
// every key that can hold one, in every syntax the key accepts (and in the
// malformed shapes users write by mistake), and checks that neither printing
// the config nor validating it shows the secret.
func TestConfig_SecretNeverShownInOutputOrValidationErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		secret  string
		cfg     Config
		invalid bool // Validate must fail (the error path is exercised)
	}{
		{"postgres.url key=value with :// in another value", "s3cretKV",
			Config{Postgres: PostgresConfig{URL: "host=db password=s3cretKV application_name=svc://worker"}}, false},
		{"postgres.url key=value quoted with spaces and escapes", `se cr\'etQuoted`,
			Config{Postgres: PostgresConfig{URL: `host=db password = 'se cr\'etQuoted' dbname=app`}}, false},
		{"postgres.url key=value sslpassword", "keyPassphrase9",
			Config{Postgres: PostgresConfig{URL: "host=db sslkey=/k.pem sslpassword=keyPassphrase9"}}, false},
		{"postgres.url key=value unquoted password with a space", "frst9 scnd7half",
			Config{Postgres: PostgresConfig{URL: "host=db password=frst9 scnd7half dbname=app"}}, true},
		{"postgres.url URL with unescaped @ in the password", "hunter@2word",
			Config{Postgres: PostgresConfig{URL: "postgres://u:hunter@2word@host/db"}}, true},
		{"postgres.url URL with unescaped / in the password", "ab/cdsecret",
			Config{Postgres: PostgresConfig{URL: "postgres://u:ab/cdsecret@host/db"}}, true},
		{"postgres.url URL with ? in the password before a numeric port-like part", "9z8y?tail5678",
			Config{Postgres: PostgresConfig{URL: "postgres://u:9z8y?tail5678@host/db"}}, false},
		{"postgres.url malformed URL with ?password=", "querysecret",
			Config{Postgres: PostgresConfig{URL: "postgres://u@h:badport/db?password=querysecret"}}, true},
		{"postgres.url URL with percent-encoded query key", "encodedkey",
			Config{Postgres: PostgresConfig{URL: "postgres://h/db?pass%77ord=encodedkey"}}, false},
		{"postgres.url malformed URL with \" in the password", `quo"tedsecret`,
			Config{Postgres: PostgresConfig{URL: `postgres://u:quo"tedsecret@h:bad/db`}}, true},
		{"postgres.url malformed URL with % in the password", "pct%zzsecret",
			Config{Postgres: PostgresConfig{URL: "postgres://u:pct%zzsecret@h/db"}}, true},
		{"postgres.url not a connection string at all", "bareword5ecret",
			Config{Postgres: PostgresConfig{URL: "bareword5ecret"}}, true},
		{"a secret copied into another key", "dupl1cated-s3cret",
			with(Config{Broker: "dupl1cated-s3cret"}, "redis.password", "dupl1cated-s3cret"), true},
		{"redis.password", `re"dis@pw`,
			with(Config{}, "redis.password", `re"dis@pw`), false},
		{"redis.addr given as a URL with credentials", "addrsecret",
			with(Config{}, "redis.addr", "redis://default:addrsecret@cache:6379"), true},
		{"kafka.sasl.password", "kafkaSASL#1",
			with(Config{}, "kafka.sasl.mechanism", "PLAIN", "kafka.sasl.user", "u", "kafka.sasl.password", "kafkaSASL#1"), false},
		{"kafka.brokers given as a URL with credentials", "brokersecret",
			with(Config{}, "kafka.brokers", "sasl://u:brokersecret@k1:9093:x"), true},
		{"observability.otlp_endpoint user info", "otlpsecret",
			Config{Observability: ObservabilityConfig{OTLPEndpoint: "https://tenant:otlpsecret@collector:4318/v1/traces"}}, false},
		{"observability.otlp_endpoint invalid", "otlpbadsecret",
			Config{Observability: ObservabilityConfig{OTLPEndpoint: "ftp://tenant:otlpbadsecret@collector/v1"}}, true},
		{"observability.otlp_endpoint token in the query", "otlptoken42",
			Config{Observability: ObservabilityConfig{OTLPEndpoint: "https://collector:4318/v1/traces?api_key=otlptoken42"}}, false},
		{"observability.otlp_endpoint malformed with \" in the password", `Wq7"Zr9wq`,
			Config{Observability: ObservabilityConfig{OTLPEndpoint: `https://t:Wq7"Zr9wq@collector:bad/v1`}}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			for where, out := range printed(tc.cfg) {
				assertNoSecret(t, out, tc.secret, where)
			}
			err := tc.cfg.Validate()
			if tc.invalid {
				require.Error(t, err, "the case must exercise a validation error")
				assertNoSecret(t, err.Error(), tc.secret, "Validate error")
			} else {
				require.NoError(t, err)
			}
		})
	}
}

// TestLoadConfig_SecretNeverShownInLoadErrors covers the errors of loading:
// YAML decoding, environment variables and validation after the merge.
func TestLoadConfig_SecretNeverShownInLoadErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		secret string
		file   string
		env    map[string]string
	}{
		{"yaml: password that starts like an alias", "anchorsecret",
			"kafka:\n  sasl:\n    mechanism: PLAIN\n    user: u\n    password: *anchorsecret\n", nil},
		{"yaml: secret in the file, error elsewhere", "filesecret",
			"redis:\n  password: filesecret\nrelay:\n  lease: 30\n", nil},
		{"yaml: malformed url in the file", `fyle"Qz9scrt`,
			"postgres:\n  url: 'postgres://u:fyle\"Qz9scrt@h:bad/db'\n", nil},
		{"env: malformed url", `env"Qz8scrt`,
			"", map[string]string{"OMNIBUS_POSTGRES_URL": `postgres://u:env"Qz8scrt@h:x/db`}},
		{"env: url with credentials in a number key", "numbersecret",
			"", map[string]string{"OMNIBUS_REDIS_DB": "redis://u:numbersecret@h:6379/0"}},
		{"env: secret set, error elsewhere", "envpassword",
			"", map[string]string{"OMNIBUS_KAFKA_SASL_PASSWORD": "envpassword", "OMNIBUS_RELAY_LEASE": "soon"}},
		{"env: otlp endpoint invalid", "envotlp",
			"", map[string]string{"OMNIBUS_OBSERVABILITY_OTLP_ENDPOINT": "tcp://u:envotlp@collector"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			path := ""
			if tc.file != "" {
				path = writeFile(t, tc.file)
			}
			_, err := loadConfig(path, env(tc.env))
			require.Error(t, err, "the case must exercise a load error")
			assert.ErrorIs(t, err, ErrInvalidConfig)
			assertNoSecret(t, err.Error(), tc.secret, "load error")
		})
	}
}

// TestConfig_ADevelopmentPasswordThatIsAConfigWordIsNotScrubbedEverywhere:
// postgres://postgres:postgres@… must not turn "broker: postgres" into
// "broker: REDACTED"; the password itself is still masked.
func TestConfig_ADevelopmentPasswordThatIsAConfigWordIsNotScrubbedEverywhere(t *testing.T) {
	t.Parallel()
	c := Config{Broker: BrokerPostgres, Postgres: PostgresConfig{URL: "postgres://postgres:postgres@localhost:5432/app"}}
	out := c.String()
	assert.Contains(t, out, "broker: postgres")
	assert.Contains(t, out, "url: postgres://postgres:REDACTED@localhost:5432/app")
}
