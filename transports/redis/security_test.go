package redis_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/internal/testenv"
	omniredis "github.com/omnibus-go/omnibus/transports/redis"
)

const (
	tlsServerName = "redis.omnibus.test"
	aclUser       = "relay"
	aclPassword   = "s3cret-acl-password-of-the-relay"
)

// tlsRedis is a private redis-server that speaks only TLS, with a
// certificate for tlsServerName (not for 127.0.0.1) from a throwaway CA,
// and an ACL user aclUser; the default user is off.
type tlsRedis struct {
	addr   string
	caFile string
}

func startTLSRedis(t *testing.T) *tlsRedis {
	t.Helper()
	dir := t.TempDir()
	caFile, certFile, keyFile := writeTestPKI(t, dir, tlsServerName)
	pool := x509.NewCertPool()
	caPEM, err := os.ReadFile(caFile)
	require.NoError(t, err)
	require.True(t, pool.AppendCertsFromPEM(caPEM))

	srv := startPrivateRedis(t,
		func(port int) []string {
			return []string{
				"--port", "0", "--tls-port", strconv.Itoa(port),
				"--tls-cert-file", certFile, "--tls-key-file", keyFile, "--tls-ca-cert-file", caFile,
				"--tls-auth-clients", "no",
				"--user", "default", "off",
				"--user", aclUser, "on", ">" + aclPassword, "~*", "&*", "+@all",
			}
		},
		func(ctx context.Context, addr string) error {
			c := goredis.NewClient(&goredis.Options{
				Addr: addr, Username: aclUser, Password: aclPassword, MaxRetries: -1,
				TLSConfig: &tls.Config{RootCAs: pool, ServerName: tlsServerName, MinVersion: tls.VersionTLS12},
			})
			defer c.Close()
			return c.Ping(ctx).Err()
		})
	return &tlsRedis{addr: srv.Addr, caFile: caFile}
}

// writeTestPKI writes a self-signed CA and a server certificate it signed
// for dnsName to dir, as PEM files.
func writeTestPKI(t *testing.T, dir, dnsName string) (caFile, certFile, keyFile string) {
	t.Helper()
	ca, caKey := testenv.NewCert(t, "omnibus test CA", nil, nil, true, nil, nil)
	srv, srvKey := testenv.NewCert(t, dnsName, []string{dnsName}, nil, false, ca, caKey)
	write := func(name string, data []byte) string {
		path := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(path, data, 0o600))
		return path
	}
	return write("ca.pem", testenv.PEMCert(ca)), write("server.pem", testenv.PEMCert(srv)), write("server.key", testenv.PEMKey(t, srvKey))
}

// TestTLSAndACL_CAFileAndServerNameConnect runs a Publisher and a
// Subscriber opened from Addr with TLSCAFile, TLSServerName and an ACL
// user against a TLS-only Redis; a wrong server name or password fails
// each Publish with a clear, transient error that never shows a password.
func TestTLSAndACL_CAFileAndServerNameConnect(t *testing.T) {
	t.Parallel()
	srv := startTLSRedis(t)

	t.Run("CA file and server name", func(t *testing.T) {
		pub, err := omniredis.NewPublisher(omniredis.PublisherConfig{
			Addr: srv.addr, Username: aclUser, Password: aclPassword,
			TLSCAFile: srv.caFile, TLSServerName: tlsServerName,
		}, nil)
		require.NoError(t, err)
		defer pub.Close()
		sub, err := omniredis.NewSubscriber(omniredis.SubscriberConfig{
			Addr: srv.addr, Username: aclUser, Password: aclPassword,
			TLSCAFile: srv.caFile, TLSServerName: tlsServerName,
			ConsumerGroup: "billing", BlockTime: 100 * time.Millisecond,
		}, nil)
		require.NoError(t, err)
		defer sub.Close()

		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		msgs, err := sub.Subscribe(ctx, "orders")
		require.NoError(t, err, "subscribe over TLS with the CA file and server name")
		sent := message.NewMessage(watermill.NewUUID(), []byte("over TLS"))
		require.NoError(t, pub.Publish("orders", sent), "publish over TLS with the CA file and server name")
		got := receive(t, msgs, 10*time.Second)
		assert.Equal(t, sent.UUID, got.UUID)
		got.Ack()
	})

	refused := []struct {
		name        string
		cfg         omniredis.PublisherConfig
		inError     string // the error must say this
		isAuthError bool
	}{
		{"wrong server name", omniredis.PublisherConfig{
			Addr: srv.addr, Username: aclUser, Password: aclPassword,
			TLSCAFile: srv.caFile, TLSServerName: "other.omnibus.test",
		}, "other.omnibus.test", false},
		{"no server name (the certificate is not for 127.0.0.1)", omniredis.PublisherConfig{
			Addr: srv.addr, Username: aclUser, Password: aclPassword,
			TLSCAFile: srv.caFile,
		}, "127.0.0.1", false},
		{"no CA file (the system roots do not know the CA)", omniredis.PublisherConfig{
			Addr: srv.addr, Username: aclUser, Password: aclPassword,
			TLSServerName: tlsServerName,
		}, "unknown authority", false},
		{"wrong ACL password", omniredis.PublisherConfig{
			Addr: srv.addr, Username: aclUser, Password: "not-the-" + aclPassword,
			TLSCAFile: srv.caFile, TLSServerName: tlsServerName,
		}, "WRONGPASS", true},
	}
	for _, tc := range refused {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pub, err := omniredis.NewPublisher(tc.cfg, nil)
			require.NoError(t, err)
			defer pub.Close()
			err = pub.Publish("orders", message.NewMessage(watermill.NewUUID(), []byte("x")))
			require.Error(t, err)
			t.Logf("Publish: %v", err)
			assert.ErrorContains(t, err, tc.inError)
			assert.Equal(t, bus.ClassTransient, bus.ClassOf(err), "a connection the server or client refuses is an outage: %v", err)
			assert.Equal(t, tc.isAuthError, goredis.IsAuthError(err), "IsAuthError(%v)", err)
			assert.NotContains(t, err.Error(), aclPassword, "the error shows a password")
		})
	}
}

// TestTLSAndACL_BrokerMapsTheRedisSection opens the redis broker of
// bus.OpenBroker with redis.tls_ca_file and redis.tls_server_name (and no
// redis.tls: setting them turns TLS on) and publishes through it; with a
// wrong password Open fails without showing it.
func TestTLSAndACL_BrokerMapsTheRedisSection(t *testing.T) {
	t.Parallel()
	srv := startTLSRedis(t)
	ctx := context.Background()
	cfg := bus.Config{Broker: omniredis.Name}
	rc := omniredis.Config{Addr: srv.addr, Username: aclUser, Password: aclPassword, TLSCAFile: srv.caFile, TLSServerName: tlsServerName}
	omniredis.SetSection(&cfg, rc)

	b, err := bus.OpenBroker(ctx, cfg)
	require.NoError(t, err, "open the redis broker over TLS")
	require.NoError(t, b.Publisher().Publish("orders", message.NewMessage(watermill.NewUUID(), []byte("x"))))
	require.NoError(t, b.Close())

	rc.Password = "not-the-" + aclPassword
	omniredis.SetSection(&cfg, rc)
	_, err = bus.OpenBroker(ctx, cfg)
	require.Error(t, err)
	assert.True(t, goredis.IsAuthError(err), "a wrong password must fail as an auth error: %v", err)
	assert.NotContains(t, err.Error(), aclPassword, "the error shows a password")

	rc.Password = aclPassword
	rc.TLSServerName = "other.omnibus.test"
	omniredis.SetSection(&cfg, rc)
	_, err = bus.OpenBroker(ctx, cfg)
	require.Error(t, err)
	assert.ErrorContains(t, err, "other.omnibus.test")
}

func TestConfig_TLSCAFileMustHoldACertificate(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "not.pem")
	require.NoError(t, os.WriteFile(notPEM, []byte("not a certificate"), 0o600))
	for _, tc := range []struct {
		name, file, reason string
	}{
		{"missing file", filepath.Join(dir, "missing.pem"), "no such file"},
		{"no certificate in it", notPEM, "holds no PEM certificate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := omniredis.NewPublisher(omniredis.PublisherConfig{Addr: "127.0.0.1:1", TLSCAFile: tc.file}, nil)
			var ce *bus.ConfigError
			require.True(t, errors.As(err, &ce), "want a *ConfigError, got %v", err)
			assert.Equal(t, "TLSCAFile", ce.Field)
			assert.Contains(t, ce.Reason, tc.reason)
			_, err = omniredis.NewSubscriber(omniredis.SubscriberConfig{Addr: "127.0.0.1:1", ConsumerGroup: "g", TLSCAFile: tc.file}, nil)
			require.True(t, errors.As(err, &ce), "want a *ConfigError, got %v", err)
			assert.Equal(t, "TLSCAFile", ce.Field)
		})
	}
}
