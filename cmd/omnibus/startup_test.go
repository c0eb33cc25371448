package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/internal/testenv"
	"github.com/omnibus-go/omnibus/transports/postgres"
)

// startProxy forwards 127.0.0.1:port to target until the test ends: a
// PostgreSQL that "comes back" on a port, without touching the shared server.
func startProxy(t *testing.T, port int, target string) {
	t.Helper()
	ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	require.NoError(t, err, "listen on the proxy's port")
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	track := func(c net.Conn) {
		mu.Lock()
		conns = append(conns, c)
		mu.Unlock()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", target)
			if err != nil {
				_ = in.Close()
				continue
			}
			track(in)
			track(out)
			wg.Add(2)
			go func() { defer wg.Done(); _, _ = io.Copy(out, in); _ = out.Close() }()
			go func() { defer wg.Done(); _, _ = io.Copy(in, out); _ = in.Close() }()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
}

// postgresBehind returns the test server's URL pointed at 127.0.0.1:port,
// with a password (the server trusts, so it is ignored) that must never be
// printed.
func postgresBehind(t *testing.T, port int) (dsn, target string) {
	t.Helper()
	u, err := url.Parse(testenv.PostgresURL())
	require.NoError(t, err)
	target = u.Host
	u.Host = fmt.Sprintf("127.0.0.1:%d", port)
	u.User = url.UserPassword(u.User.Username(), "hunter2")
	q := u.Query()
	q.Set("connect_timeout", "2")
	u.RawQuery = q.Encode()
	return u.String(), target
}

// serving is a relay or ingest running in process, whose stderr the test
// reads while it runs.
type serving struct {
	stderr    testenv.LogBuffer
	cancel    context.CancelFunc
	done      chan int
	listening atomic.Bool // the metrics endpoint was started
}

func startServing(t *testing.T, args ...string) *serving {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s := &serving{cancel: cancel, done: make(chan int, 1)}
	a := &app{stdout: io.Discard, stderr: &s.stderr, lookupEnv: func(string) (string, bool) { return "", false },
		onListen: func(string) { s.listening.Store(true) }}
	go func() { s.done <- a.run(ctx, args) }()
	t.Cleanup(func() {
		cancel()
		<-s.done
	})
	return s
}

// records returns the JSON log records written so far.
func (s *serving) records(t *testing.T) []map[string]any {
	t.Helper()
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(s.stderr.String()))
	for sc.Scan() {
		var r map[string]any
		if json.Unmarshal(sc.Bytes(), &r) == nil {
			out = append(out, r)
		}
	}
	return out
}

// waitLog waits until a record at level whose msg contains text is logged,
// and returns it; it fails if the command exits first.
func (s *serving) waitLog(t *testing.T, level, text string) map[string]any {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		for _, r := range s.records(t) {
			if r["level"] == level && strings.Contains(fmt.Sprint(r["msg"]), text) {
				return r
			}
		}
		select {
		case code := <-s.done:
			s.done <- code
			t.Fatalf("exited with %d before logging %s %q:\n%s", code, level, text, s.stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s line %q within 30s:\n%s", level, text, s.stderr.String())
		}
		time.Sleep(20 * time.Millisecond) // polling with a deadline
	}
}

// stop stops the command as SIGTERM would and returns its exit status.
func (s *serving) stop(t *testing.T) int {
	t.Helper()
	s.cancel()
	select {
	case code := <-s.done:
		s.done <- code
		return code
	case <-time.After(30 * time.Second):
		t.Fatal("the command did not stop within 30s of its context ending")
		return -1
	}
}

// TestRelay_WaitsForPostgreSQLAndTheBrokerDownAtStart starts the relay with
// neither its database nor its broker reachable: it does not exit, it logs
// each attempt at Warn with the reason (the password redacted), and once
// both come back it relays the outbox.
func TestRelay_WaitsForPostgreSQLAndTheBrokerDownAtStart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	name := "up_" + randomHex(6)
	testenv.DropPostgresPrefix(t, name)
	outbox := name + "_out"
	pgPort, redisPort := testenv.FreePort(t), testenv.FreePort(t)
	dsn, target := postgresBehind(t, pgPort)
	tables := fmt.Sprintf("outbox:\n  table: %s\ninbox:\n  table: %s_in\n", outbox, name)
	ok(t, cli(t, ctx, "--config", writeConfig(t, fmt.Sprintf("postgres:\n  url: %q\n%s", testenv.PostgresURL(), tables)), "migrate"))
	ob, err := postgres.NewOutbox(postgres.OutboxConfig{Table: outbox})
	require.NoError(t, err)
	msg := message.NewMessage("00000000-0000-4000-8000-000000000001", []byte("{}"))
	require.NoError(t, ob.Enqueue(ctx, testenv.Postgres(t), "orders", msg))

	path := writeConfig(t, fmt.Sprintf("postgres:\n  url: %q\n  max_conns: 4\n%sbroker: redis\nredis:\n  addr: 127.0.0.1:%d\nretry:\n  transient_delay: 100ms\nobservability:\n  metrics_addr: \"-\"\n  log_level: warn\n",
		dsn, tables, redisPort))
	relay := startServing(t, "--config", path, "--log-format", "json", "relay")

	pgWarn := relay.waitLog(t, "WARN", "PostgreSQL unreachable")
	assert.Contains(t, pgWarn["error"], "postgres://postgres:REDACTED@", "the reason names the database, password redacted")
	startProxy(t, pgPort, target)
	brokerWarn := relay.waitLog(t, "WARN", "broker unreachable")
	assert.Contains(t, brokerWarn["error"], "connection refused", "the reason is logged")
	testenv.StartRedisServer(t, redisPort)

	testenv.Eventually(t, 30*time.Second, func() bool {
		return count(t, `SELECT count(*) FROM `+outbox+` WHERE status = 'completed' AND attempts = 0`) == 1
	}, "outbox relayed once both are back")
	assert.Equal(t, exitOK, relay.stop(t), relay.stderr.String())
	assert.NotContains(t, relay.stderr.String(), "hunter2")
	var attempts []float64
	for _, r := range relay.records(t) {
		if r["level"] == "WARN" && strings.Contains(fmt.Sprint(r["msg"]), "PostgreSQL unreachable") {
			attempts = append(attempts, r["attempt"].(float64))
		}
	}
	require.NotEmpty(t, attempts)
	assert.Equal(t, float64(1), attempts[0], "one Warn line per attempt, numbered")
}

// TestServe_StopSignalEndsTheStartupWait: SIGINT/SIGTERM (the context
// ending) while relay or ingest waits for its database stops it cleanly;
// the metrics endpoint is not served before the wait is over.
func TestServe_StopSignalEndsTheStartupWait(t *testing.T) {
	t.Parallel()
	dsn, _ := postgresBehind(t, testenv.FreePort(t))
	path := writeConfig(t, fmt.Sprintf("broker: memory\npostgres:\n  url: %q\nobservability:\n  metrics_addr: 127.0.0.1:0\n  log_level: warn\n", dsn))
	for _, cmd := range []string{"relay", "ingest"} {
		t.Run(cmd, func(t *testing.T) {
			t.Parallel()
			args := []string{"--config", path, "--log-format", "json", cmd, "--allow-memory-broker"}
			if cmd == "ingest" {
				args = append(args, "--topic", "orders")
			}
			s := startServing(t, args...)
			s.waitLog(t, "WARN", "PostgreSQL unreachable")
			assert.Equal(t, exitOK, s.stop(t), "stopped while waiting is a clean stop:\n%s", s.stderr.String())
			assert.NotContains(t, s.stderr.String(), "hunter2")
			assert.False(t, s.listening.Load(), "/metrics and /healthz are served only once the wait is over")
		})
	}
}

// TestWaitReachable_RetriesTransientErrorsOnly: the start-up wait retries
// transient failures with one Warn line each, returns any other error at
// once, and ends with its context.
func TestWaitReachable_RetriesTransientErrorsOnly(t *testing.T) {
	t.Parallel()
	down := errors.New("dial tcp 127.0.0.1:1: connect: connection refused")
	for _, tc := range []struct {
		name     string
		errs     []error // results of the attempts, then success
		wantErr  error
		wantWarn int
	}{
		{"up at once", nil, nil, 0},
		{"down twice", []error{bus.Transient(down), bus.Transient(down)}, nil, 2},
		{"refused for good", []error{bus.Transient(down), down}, down, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var logs testenv.LogBuffer
			logger := slog.New(slog.NewJSONHandler(&logs, nil))
			var n atomic.Int32
			err := waitReachable(context.Background(), logger, "PostgreSQL", func(context.Context) error {
				i := int(n.Add(1)) - 1
				if i < len(tc.errs) {
					return tc.errs[i]
				}
				return nil
			})
			if tc.wantErr != nil {
				require.ErrorIs(t, err, tc.wantErr)
			} else {
				require.NoError(t, err)
			}
			assert.Equal(t, tc.wantWarn, strings.Count(logs.String(), `"level":"WARN"`), logs.String())
		})
	}

	ctx, cancel := context.WithCancel(context.Background())
	var calls atomic.Int32
	done := make(chan error, 1)
	go func() {
		done <- waitReachable(ctx, bus.NopLogger(), "PostgreSQL", func(context.Context) error {
			calls.Add(1)
			return bus.Transient(down)
		})
	}()
	testenv.Eventually(t, 30*time.Second, func() bool { return calls.Load() >= 2 }, "a second attempt")
	cancel()
	select {
	case err := <-done:
		require.ErrorIs(t, err, context.Canceled)
	case <-time.After(30 * time.Second):
		t.Fatal("the wait does not end with its context")
	}
}
