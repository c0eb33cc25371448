package kafka_test

import (
	"context"
	"crypto/tls"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/omnibus-go/omnibus/internal/testenv"
	"github.com/omnibus-go/omnibus/transports/kafka"
)

// TestSASL_Mechanisms authenticates with PLAIN, SCRAM-SHA-256 and
// SCRAM-SHA-512 against a kfake cluster that requires SASL, and is refused
// with a wrong password.
func TestSASL_Mechanisms(t *testing.T) {
	t.Parallel()
	cluster := testenv.NewKafkaCluster(t,
		kfake.EnableSASL(),
		kfake.Superuser(kafka.SASLPlain, "plain-user", "plain-pass"),
		kfake.Superuser(kafka.SASLScramSHA256, "scram256-user", "scram256-pass"),
		kfake.Superuser(kafka.SASLScramSHA512, "scram512-user", "scram512-pass"),
	)
	brokers := cluster.ListenAddrs()
	for _, tc := range []struct{ mechanism, user, pass string }{
		{kafka.SASLPlain, "plain-user", "plain-pass"},
		{kafka.SASLScramSHA256, "scram256-user", "scram256-pass"},
		{kafka.SASLScramSHA512, "scram512-user", "scram512-pass"},
	} {
		t.Run(tc.mechanism, func(t *testing.T) {
			t.Parallel()
			sasl := kafka.SASLConfig{Mechanism: tc.mechanism, User: tc.user, Password: tc.pass}
			pcfg := testPublisherConfig(brokers)
			pcfg.SASL = sasl
			scfg := testSubscriberConfig(brokers, groupName(t))
			scfg.SASL = sasl
			publishAndReceive(t, testenv.Name(t), pcfg, scfg)

			pcfg.SASL.Password = "wrong"
			_, err := kafka.NewPublisher(pcfg, nil)
			assert.Error(t, err, "a wrong password is refused")
		})
	}
}

// TestTLS_VerifiesBrokerWithCAFile talks TLS to a kfake cluster whose
// certificate is signed by a CA given in TLS.CAFile; without that CA (the
// default: verification on) the connection is refused.
func TestTLS_VerifiesBrokerWithCAFile(t *testing.T) {
	t.Parallel()
	caFile, serverCert := testCertificates(t)
	cluster := testenv.NewKafkaCluster(t, kfake.TLS(&tls.Config{Certificates: []tls.Certificate{serverCert}, MinVersion: tls.VersionTLS12}))
	brokers := cluster.ListenAddrs()

	pcfg := testPublisherConfig(brokers)
	pcfg.TLS = kafka.TLSConfig{CAFile: caFile}
	scfg := testSubscriberConfig(brokers, groupName(t))
	scfg.TLS = kafka.TLSConfig{CAFile: caFile}
	publishAndReceive(t, testenv.Name(t), pcfg, scfg)

	pcfg.TLS = kafka.TLSConfig{Enable: true} // system roots do not know the test CA
	pcfg.DialTimeout = 2 * time.Second
	_, err := kafka.NewPublisher(pcfg, nil)
	assert.Error(t, err, "an unknown CA is refused when verification is on")
}

func publishAndReceive(t *testing.T, topic string, pcfg kafka.PublisherConfig, scfg kafka.SubscriberConfig) {
	t.Helper()
	pub := newPublisher(t, pcfg)
	msg := message.NewMessage(watermill.NewUUID(), []byte("secret"))
	require.NoError(t, pub.Publish(topic, msg))
	sub := newSubscriber(t, scfg)
	msgs, err := sub.Subscribe(context.Background(), topic)
	require.NoError(t, err)
	got := receive(t, msgs, 30*time.Second, "subscriber")
	assert.Equal(t, msg.UUID, got.UUID)
	got.Ack()
}

// testCertificates writes a CA certificate to a file and returns it with a
// server certificate for 127.0.0.1 signed by it.
func testCertificates(t *testing.T) (caFile string, server tls.Certificate) {
	t.Helper()
	ca, caKey := testenv.NewCert(t, "omnibus test CA", nil, nil, true, nil, nil)
	srv, srvKey := testenv.NewCert(t, "kfake", []string{"localhost"}, []net.IP{net.ParseIP("127.0.0.1")}, false, ca, caKey)
	caFile = filepath.Join(t.TempDir(), "ca.pem")
	require.NoError(t, os.WriteFile(caFile, testenv.PEMCert(ca), 0o600))
	return caFile, tls.Certificate{Certificate: [][]byte{srv.Raw}, PrivateKey: srvKey}
}
