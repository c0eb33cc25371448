package redis_test

import (
	"context"
	"errors"
	"net"
	"os/exec"
	"strconv"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/omnibus-go/omnibus/internal/testenv"
)

// privateRedis is a redis-server process of the test's own, for what the
// shared server must not be put through (CONFIG SET, maxmemory, TLS, ACL
// users). It is stopped when the test ends.
type privateRedis struct {
	// Addr is 127.0.0.1:<port>, the plain or the TLS port.
	Addr string
}

// startPrivateRedis starts redis-server on a free loopback port with args
// (given the port; they must include --port or --tls-port) plus --bind,
// --save "" and --appendonly no, and waits until ping(addr) succeeds. A
// missing redis-server binary fails the test with instructions.
func startPrivateRedis(t *testing.T, args func(port int) []string, ping func(ctx context.Context, addr string) error) *privateRedis {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("redis-server is not installed (%v): this test starts a private Redis server of its own.\n"+
			"Install it with `make services` (or apt-get install redis-server).", err)
	}
	var lastErr error
	for range 3 { // the free port may be taken between choosing and binding it
		port := freePort(t)
		addr := "127.0.0.1:" + strconv.Itoa(port)
		full := append([]string{"--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", t.TempDir()}, args(port)...)
		cmd := exec.Command(bin, full...)
		out := &testenv.LogBuffer{}
		cmd.Stdout, cmd.Stderr = out, out
		require.NoError(t, cmd.Start(), "start redis-server")
		exited := make(chan struct{}) // closed when the process has exited
		go func() { _ = cmd.Wait(); close(exited) }()
		stop := func() {
			_ = cmd.Process.Kill()
			<-exited
		}

		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		lastErr = waitReady(ctx, addr, ping, exited)
		cancel()
		if lastErr == nil {
			t.Cleanup(func() {
				stop()
				if t.Failed() {
					t.Logf("private redis-server output:\n%s", out.String())
				}
			})
			return &privateRedis{Addr: addr}
		}
		stop()
		t.Logf("private redis-server on %s did not come up: %v\n%s", addr, lastErr, out.String())
	}
	t.Fatalf("could not start a private redis-server: %v", lastErr)
	return nil
}

// waitReady polls ping until it succeeds, the process exits or ctx ends.
func waitReady(ctx context.Context, addr string, ping func(context.Context, string) error, exited <-chan struct{}) error {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		err := ping(pctx, addr)
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-exited:
			return errors.Join(errors.New("redis-server exited"), err)
		case <-ctx.Done():
			return errors.Join(ctx.Err(), err)
		case <-tick.C:
		}
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// startPlainRedis starts a private redis-server without TLS, with extra
// config args, and returns it with a client of its own that does not retry
// failed commands (so each failure reaches the code under test).
func startPlainRedis(t *testing.T, extra ...string) (*privateRedis, *goredis.Client) {
	t.Helper()
	srv := startPrivateRedis(t,
		func(port int) []string { return append([]string{"--port", strconv.Itoa(port)}, extra...) },
		func(ctx context.Context, addr string) error {
			c := goredis.NewClient(&goredis.Options{Addr: addr, MaxRetries: -1})
			defer c.Close()
			return c.Ping(ctx).Err()
		})
	client := goredis.NewClient(&goredis.Options{Addr: srv.Addr, MaxRetries: -1})
	t.Cleanup(func() { _ = client.Close() })
	return srv, client
}
