package nats_test

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/internal/testenv"
	"github.com/omnibus-go/omnibus/transports/nats"
)

func TestConfig_FromYAMLAndEnvWithDefaults(t *testing.T) {
	t.Parallel()
	cfg, err := testenv.ParseConfig("broker: nats\nnats:\n  url: nats://app:s3cret@nats1:4222,nats://app:s3cret@nats2:4222\n  token: tok-s3cret\n  shards: 8\n  shard_lease: 5s\n  max_age: 168h\n  subject_prefix: prod.\n", nil)
	require.NoError(t, err)
	n := nats.Section(cfg)
	assert.Equal(t, 8, n.Shards)
	assert.Equal(t, 5*time.Second, n.ShardLease)
	assert.Equal(t, 168*time.Hour, n.MaxAge)
	assert.Equal(t, "prod.", n.SubjectPrefix)
	assert.Equal(t, nats.DefaultDuplicateWindow, n.DuplicateWindow)
	assert.Equal(t, nats.DefaultPrefetch, n.Prefetch)
	printed := fmt.Sprint(cfg.Redacted())
	assert.NotContains(t, printed, "s3cret")

	cfg, err = testenv.ParseConfig("broker: nats\n", map[string]string{
		"OMNIBUS_NATS_URL": "tls://nats.internal:4443", "OMNIBUS_NATS_SHARDS": "4", "OMNIBUS_NATS_PREFETCH": "10", "OMNIBUS_NATS_BUCKET": "leases",
	})
	require.NoError(t, err)
	n = nats.Section(cfg)
	assert.Equal(t, "tls://nats.internal:4443", n.URL)
	assert.Equal(t, 4, n.Shards)
	assert.Equal(t, 10, n.Prefetch)
	assert.Equal(t, "leases", n.Bucket)

	cfg, err = testenv.ParseConfig("broker: nats\n", nil)
	require.NoError(t, err)
	assert.Equal(t, nats.DefaultURL, nats.Section(cfg).URL)
	assert.Equal(t, nats.DefaultShardLease, nats.Section(cfg).ShardLease)
}

func TestConfig_BadValuesNameTheKeyAndHideTheSecret(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ yaml, key, reason string }{
		{"url: http://u:topsecret@nats/", "nats.url", `scheme "http" is not nats or tls`},
		{"url: nats://u:topsecret@", "nats.url", "has no host"},
		{"url: nats://topsecret@nats:4222", "nats.url", "set the token in nats.token"},
		{"shards: 1025\n  url: nats://u:topsecret@nats", "nats.shards", "1025 is not between 1 and 1024"},
		{"shard_lease: 100ms", "nats.shard_lease", "100ms is under 1s"},
		{"duplicate_window: 10ms", "nats.duplicate_window", "under 1s"},
		{"max_age: 30s", "nats.max_age", "under duplicate_window"},
		{"prefetch: 70000", "nats.prefetch", "70000 is not between 1 and 65536"},
		{"bucket: a.b", "nats.bucket", "only letters, digits"},
		{"subject_prefix: a..b", "nats.subject_prefix", "empty token"},
		{"creds_file: /nonexistent.creds", "nats.creds_file", "no such file"},
		{"tls_ca_file: /nonexistent.pem", "nats.tls_ca_file", "no such file"},
	} {
		_, err := testenv.ParseConfig("broker: nats\nnats:\n  "+c.yaml+"\n", nil)
		require.Error(t, err, c.yaml)
		assert.ErrorIs(t, err, bus.ErrInvalidConfig, c.yaml)
		assert.Contains(t, err.Error(), c.key+": ", c.yaml)
		assert.Contains(t, err.Error(), c.reason, c.yaml)
		assert.NotContains(t, err.Error(), "topsecret", c.yaml)
	}
	_, err := nats.NewSubscriber(nats.SubscriberConfig{ConsumerGroup: "a.b"}, nil)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "ConsumerGroup")
}

// authServer runs a nats-server of the test's own that wants the given
// options (--user/--pass or --auth), and returns its port.
func authServer(t *testing.T, args ...string) int {
	t.Helper()
	bin, err := exec.LookPath("nats-server")
	require.NoError(t, err, "nats-server is not installed: run `make services`")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := ln.Addr().(*net.TCPAddr).Port
	_ = ln.Close()
	cmd := exec.Command(bin, append([]string{"-a", "127.0.0.1", "-p", strconv.Itoa(port), "-js", "-sd", t.TempDir()}, args...)...)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	testenv.Eventually(t, 10*time.Second, func() bool {
		c, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err == nil {
			_ = c.Close()
		}
		return err == nil
	}, "the test's nats-server listens")
	return port
}

// Credentials the server refuses fail OpenBroker at once (an operator fixes
// them), without the secret in the error; the right token opens it.
func TestOpenBroker_RefusedCredentialsFailAtStart(t *testing.T) {
	t.Parallel()
	port := authServer(t, "--auth", "right-token")
	url := "nats://127.0.0.1:" + strconv.Itoa(port)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	cfg := bus.Config{Broker: nats.Name}
	nats.SetSection(&cfg, nats.Config{URL: url, Token: "wrong-token"})
	_, err := bus.OpenBroker(ctx, cfg)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "nats.url")
	assert.Contains(t, err.Error(), "refused the credentials")
	assert.NotContains(t, err.Error(), "wrong-token")

	nats.SetSection(&cfg, nats.Config{URL: url, Token: "right-token"})
	b, err := bus.OpenBroker(ctx, cfg)
	require.NoError(t, err)
	defer b.Close()
	msg := keyed("k", "1")
	require.NoError(t, b.Publisher().Publish("orders", msg))
}
