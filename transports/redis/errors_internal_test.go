package redis

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"testing"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/internal/testenv"
)

// TestClassify_EveryRedisErrorHasItsClass names every error go-redis v9 can
// hand the transport (its error.go and internal/proto/redis_errors.go, the
// connection and pool errors) and the class a Publish failing with it must
// have. A broker that cannot take writes for now (down, loading, failing
// over, out of memory, busy with a script, refusing our credentials) is an
// outage: transient, no attempt spent. A reply that refuses this write for
// a reason of its own (wrong key type, a value too large for the server) is
// counted, so a message that can never be written runs out of attempts
// instead of holding its key forever.
//
// Server replies are real: the shared Redis sends them (EVAL
// redis.error_reply, read-only) and go-redis parses them into its typed
// errors, as it does for any command.
func TestClassify_EveryRedisErrorHasItsClass(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	client := testenv.Redis(t)
	prefix := testenv.RedisPrefix(t)

	// reply returns the error go-redis makes of an error reply msg.
	reply := func(msg string) func(t *testing.T) error {
		return func(t *testing.T) error {
			err := client.Eval(ctx, "return redis.error_reply(ARGV[1])", nil, msg).Err()
			require.Error(t, err)
			require.Equal(t, msg, err.Error(), "the server changed the error reply")
			return err
		}
	}
	// real returns the error of a real command.
	real := func(run func(t *testing.T) error) func(t *testing.T) error {
		return func(t *testing.T) error {
			err := run(t)
			require.Error(t, err)
			return err
		}
	}
	value := func(err error) func(*testing.T) error { return func(*testing.T) error { return err } }

	cases := []struct {
		name string
		err  func(t *testing.T) error
		want bus.Class
	}{
		// Redis cannot be reached, or the client cannot use it.
		{"connection refused", real(func(t *testing.T) error {
			c := goredis.NewClient(&goredis.Options{Addr: closedAddr(t), MaxRetries: -1, DialerRetries: 1})
			defer c.Close()
			return c.Ping(ctx).Err()
		}), bus.ClassTransient},
		{"connection reset", value(&net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)}), bus.ClassTransient},
		{"connection closed by the server (EOF)", value(io.EOF), bus.ClassTransient},
		{"reply cut short (unexpected EOF)", value(io.ErrUnexpectedEOF), bus.ClassTransient},
		{"read timeout", value(&net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}), bus.ClassTransient},
		{"deadline of the message's context", value(context.DeadlineExceeded), bus.ClassTransient},
		{"message's context canceled (relay stopping)", value(context.Canceled), bus.ClassTransient},
		{"pool timeout", value(goredis.ErrPoolTimeout), bus.ClassTransient},
		{"pool exhausted", value(goredis.ErrPoolExhausted), bus.ClassTransient},
		{"client closed", real(func(t *testing.T) error {
			c := goredis.NewClient(&goredis.Options{Addr: testenv.RedisAddr()})
			require.NoError(t, c.Close())
			return c.Ping(ctx).Err()
		}), bus.ClassTransient},
		{"publisher closed", value(ErrClosed), bus.ClassTransient},
		{"TLS: server certificate from an unknown authority", value(&tls.CertificateVerificationError{Err: x509.UnknownAuthorityError{}}), bus.ClassTransient},
		{"TLS: server certificate for another name", value(&tls.CertificateVerificationError{Err: x509.HostnameError{Certificate: &x509.Certificate{DNSNames: []string{"redis.example"}}, Host: "127.0.0.1"}}), bus.ClassTransient},
		{"TLS: server does not speak TLS", value(tls.RecordHeaderError{Msg: "first record does not look like a TLS handshake"}), bus.ClassTransient},

		// Redis is there but cannot take writes for now.
		{"OOM (maxmemory reached)", reply("OOM command not allowed when used memory > 'maxmemory'."), bus.ClassTransient},
		{"LOADING", reply("LOADING Redis is loading the dataset in memory"), bus.ClassTransient},
		{"READONLY (a replica after failover)", reply("READONLY You can't write against a read only replica."), bus.ClassTransient},
		{"MASTERDOWN", reply("MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'."), bus.ClassTransient},
		{"CLUSTERDOWN", reply("CLUSTERDOWN The cluster is down"), bus.ClassTransient},
		{"TRYAGAIN", reply("TRYAGAIN Multiple keys request during rehashing of slot"), bus.ClassTransient},
		{"BUSY (a script runs too long)", reply("BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE."), bus.ClassTransient},
		{"NOREPLICAS", reply("NOREPLICAS Not enough good replicas to write."), bus.ClassTransient},
		{"max number of clients reached", reply("ERR max number of clients reached"), bus.ClassTransient},
		{"MOVED (slot migrated, redirects exhausted)", reply("MOVED 3999 127.0.0.1:6381"), bus.ClassTransient},
		{"ASK (slot migrating, redirects exhausted)", reply("ASK 3999 127.0.0.1:6381"), bus.ClassTransient},
		{"NOAUTH", reply("NOAUTH Authentication required."), bus.ClassTransient},
		{"WRONGPASS", reply("WRONGPASS invalid username-password pair or user is disabled."), bus.ClassTransient},
		{"NOPERM (ACL forbids the stream)", reply("NOPERM No permissions to access a key"), bus.ClassTransient},

		// Redis refuses this write for a reason of its own: not an outage.
		{"WRONGTYPE (the stream's key holds another type)", real(func(t *testing.T) error {
			require.NoError(t, client.Set(ctx, prefix+"not-a-stream", "x", 0).Err())
			return client.XAdd(ctx, &goredis.XAddArgs{Stream: prefix + "not-a-stream", Values: []any{"a", "b"}}).Err()
		}), bus.ClassCounted},
		{"NOSCRIPT", real(func(t *testing.T) error {
			return client.EvalSha(ctx, "0000000000000000000000000000000000000000", nil).Err()
		}), bus.ClassCounted},
		{"NOGROUP", real(func(t *testing.T) error {
			return client.XReadGroup(ctx, &goredis.XReadGroupArgs{Group: "g", Consumer: "c", Streams: []string{prefix + "none", ">"}, Block: -1}).Err()
		}), bus.ClassCounted},
		{"BUSYGROUP", real(func(t *testing.T) error {
			require.NoError(t, client.XGroupCreateMkStream(ctx, prefix+"s", "g", "0").Err())
			return client.XGroupCreateMkStream(ctx, prefix+"s", "g", "0").Err()
		}), bus.ClassCounted},
		{"CROSSSLOT", value(goredis.ErrCrossSlot), bus.ClassCounted},
		{"EXECABORT", reply("EXECABORT Transaction discarded because of previous errors."), bus.ClassCounted},
		{"value larger than the server's proto-max-bulk-len", reply("ERR Protocol error: invalid bulk length"), bus.ClassCounted},
		{"XADD refuses the entry id", real(func(t *testing.T) error {
			return client.XAdd(ctx, &goredis.XAddArgs{Stream: prefix + "s", ID: "0-0", Values: []any{"a", "b"}}).Err()
		}), bus.ClassCounted},
		{"any other error", value(errors.New("something else")), bus.ClassCounted},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := tc.err(t)
			wrapped := classify(fmt.Errorf("publish 1 message(s) to stream %q: %w", "s", err))
			assert.Equal(t, tc.want, bus.ClassOf(wrapped), "class of %v (%T)", err, err)
			assert.ErrorIs(t, wrapped, err, "the classified error must wrap the original")
		})
	}
}

// closedAddr returns an address on which nothing listens.
func closedAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	return addr
}

// TestPublisherWrap_TransientOnlyWhenEveryEntryFailedTransiently: a Publish
// of several entries is transient only if each failed entry failed
// transiently; one entry the server refused makes the whole call counted,
// so a connection error on its neighbours cannot hide it.
func TestPublisherWrap_TransientOnlyWhenEveryEntryFailedTransiently(t *testing.T) {
	t.Parallel()
	p := &Publisher{}
	req := &publishRequest{stream: "s", entries: make([][]any, 3)}
	refused := errors.New("ERR refused")
	cases := []struct {
		name string
		errs []error
		want bus.Class
	}{
		{"all transient", []error{io.EOF, io.EOF, io.EOF}, bus.ClassTransient},
		{"one refused, the rest cut off", []error{refused, io.EOF, io.EOF}, bus.ClassCounted},
		{"refused after a transient", []error{io.EOF, refused}, bus.ClassCounted},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			assert.Equal(t, tc.want, bus.ClassOf(p.wrap(req, errors.Join(tc.errs...))))
		})
	}
}
