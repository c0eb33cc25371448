package rabbitmq_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/internal/testenv"
	"github.com/omnibus-go/omnibus/transports/rabbitmq"
)

func TestConfig_FromYAMLAndEnvWithDefaults(t *testing.T) {
	t.Parallel()
	cfg, err := testenv.ParseConfig("broker: rabbitmq\nrabbitmq:\n  url: amqp://app:s3cret@mq:5672/orders\n  shards: 8\n  heartbeat: 5s\n  groups: [billing, shipping]\n", nil)
	require.NoError(t, err)
	r := rabbitmq.Section(cfg)
	assert.Equal(t, "amqp://app:s3cret@mq:5672/orders", r.URL)
	assert.Equal(t, 8, r.Shards)
	assert.Equal(t, 5*time.Second, r.Heartbeat)
	assert.Equal(t, []string{"billing", "shipping"}, r.Groups)
	assert.Equal(t, rabbitmq.DefaultPrefetch, r.Prefetch)
	printed := fmt.Sprint(cfg.Redacted())
	assert.Contains(t, printed, "amqp://app:REDACTED@mq:5672/orders")
	assert.NotContains(t, printed, "s3cret")

	cfg, err = testenv.ParseConfig("broker: rabbitmq\n", map[string]string{
		"OMNIBUS_RABBITMQ_URL": "amqps://u:p@mq.internal:5671/", "OMNIBUS_RABBITMQ_SHARDS": "4", "OMNIBUS_RABBITMQ_PREFETCH": "10",
	})
	require.NoError(t, err)
	r = rabbitmq.Section(cfg)
	assert.Equal(t, "amqps://u:p@mq.internal:5671/", r.URL)
	assert.Equal(t, 4, r.Shards)
	assert.Equal(t, 10, r.Prefetch)

	cfg, err = testenv.ParseConfig("broker: rabbitmq\n", nil)
	require.NoError(t, err)
	assert.Equal(t, rabbitmq.DefaultURL, rabbitmq.Section(cfg).URL)
	assert.Equal(t, rabbitmq.DefaultShards, rabbitmq.Section(cfg).Shards)
}

func TestConfig_BadValuesNameTheKeyAndHideThePassword(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ yaml, key, reason string }{
		{"url: http://u:topsecret@mq/", "rabbitmq.url", `scheme "http" is not amqp or amqps`},
		{"url: amqp://u:topsecret@/", "rabbitmq.url", "has no host"},
		{"shards: -1\n  url: amqp://u:topsecret@mq/", "rabbitmq.shards", "-1 is not between 1 and 1024"},
		{"shards: 1025", "rabbitmq.shards", "1025 is not between 1 and 1024"},
		{"heartbeat: 100ms", "rabbitmq.heartbeat", "100ms is under 1s"},
		{"prefetch: 70000", "rabbitmq.prefetch", "70000 is not between 1 and 65535"},
		{"groups: [\"a b\"]", "rabbitmq.groups[0]", "contains a space"},
		{"queue_expires: 10ms", "rabbitmq.queue_expires", "under 1s"},
		{"tls_ca_file: /nonexistent.pem", "rabbitmq.tls_ca_file", "no such file"},
	} {
		_, err := testenv.ParseConfig("broker: rabbitmq\nrabbitmq:\n  "+c.yaml+"\n", nil)
		require.Error(t, err, c.yaml)
		assert.ErrorIs(t, err, bus.ErrInvalidConfig, c.yaml)
		assert.Contains(t, err.Error(), c.key+": ", c.yaml)
		assert.Contains(t, err.Error(), c.reason, c.yaml)
		assert.NotContains(t, err.Error(), "topsecret", c.yaml)
	}
}

// Credentials RabbitMQ refuses fail OpenBroker at once (an operator fixes
// them), without the password in the error; an unreachable server makes a
// connection that keeps trying.
func TestOpenBroker_RefusedCredentialsFailAtStart(t *testing.T) {
	t.Parallel()
	cfg := bus.Config{Broker: rabbitmq.Name}
	rabbitmq.SetSection(&cfg, rabbitmq.Config{URL: "amqp://guest:wrong-pw@127.0.0.1:5672/"})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err := bus.OpenBroker(ctx, cfg)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "rabbitmq.url")
	assert.Contains(t, err.Error(), "refused the credentials")
	assert.NotContains(t, err.Error(), "wrong-pw")
}
