// Package examples_test runs every example program the way a user would
// (`go run ./examples/<name>`: built once here, then executed) against the
// real services, with a timeout, and checks what it prints.
package examples_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omnibus-go/omnibus/internal/testenv"
)

// binDir holds the example binaries, built once by TestMain.
var binDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "omnibus-examples-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	build := exec.Command(goBin, "build", "-o", dir+string(filepath.Separator), "./...")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build the examples:", err)
		os.Exit(1)
	}
	binDir = dir
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// runExample runs the example name with the test services' addresses and
// extra environment, and returns its output; it fails the test when the
// program fails or runs for more than 90 s.
func runExample(t *testing.T, name string, env ...string) string {
	t.Helper()
	testenv.Postgres(t) // a clear failure when PostgreSQL is down
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, name))
	cmd.Env = append(filteredEnv(),
		"OMNIBUS_POSTGRES_URL="+testenv.PostgresURL(),
		"OMNIBUS_REDIS_ADDR="+testenv.RedisAddr(),
	)
	cmd.Env = append(cmd.Env, env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	require.NoError(t, err, "%s %v failed (context: %v)\nstdout:\n%s\nstderr:\n%s", name, env, ctx.Err(), stdout.String(), stderr.String())
	return stdout.String()
}

// filteredEnv is the environment without OMNIBUS_* variables, so a
// developer's settings do not change what the examples do.
func filteredEnv() []string {
	var out []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "OMNIBUS_") {
			out = append(out, kv)
		}
	}
	return out
}

func TestOutboxBasic(t *testing.T) {
	t.Parallel()
	out := runExample(t, "outbox-basic")
	assert.Contains(t, out, "wrote 3 orders and 9 events in 9 transactions")
	assert.Contains(t, out, "all 9 events delivered in order per order id; 0 left pending")
}

func TestBrokerSwap_SameCodeOnEveryBroker(t *testing.T) {
	t.Parallel()
	for _, broker := range []string{"memory", "postgres", "redis", "kafka"} {
		t.Run(broker, func(t *testing.T) {
			t.Parallel()
			env := []string{"OMNIBUS_BROKER=" + broker}
			if broker == "kafka" {
				env = append(env, "OMNIBUS_KAFKA_BROKERS="+strings.Join(testenv.Kafka(t), ","))
			}
			out := runExample(t, "broker-swap", env...)
			assert.Contains(t, out, "broker: "+broker+"\n")
			for _, id := range []string{"order-1", "order-2", "order-3"} {
				assert.Contains(t, out, id+": created, paid, shipped\n")
			}
			assert.Contains(t, out, "9 messages published and received through "+broker+", in order per key")
		})
	}
}

// TestCompleteWorker runs the worker over two brokers, one after the other:
// it recreates its own tables on start.
func TestCompleteWorker(t *testing.T) {
	t.Parallel()
	for _, broker := range []string{"memory", "redis"} {
		out := runExample(t, "complete-worker", "OMNIBUS_BROKER="+broker)
		assert.Equal(t, fmt.Sprintf(`complete-worker: broker %s, topic orders
placed 3 orders
confirmed by the dispatcher: order-1, order-2, order-3
seen by the audit log: order-1, order-2, order-3
shut down gracefully
`, broker), out)
	}
}

// The examples of the transport and inbox work: they must run and say that
// they delivered everything.
func TestTransportAndInboxExamples(t *testing.T) {
	t.Parallel()
	for name, want := range map[string]*regexp.Regexp{
		"outbox-redis":     regexp.MustCompile(`all \d+ events delivered through stream .* in order per order id; 0 outbox rows left pending`),
		"outbox-kafka":     regexp.MustCompile(`all \d+ events delivered through Kafka topic .* in order per order id; 0 outbox rows left pending`),
		"inbox-dispatcher": regexp.MustCompile(`ledger: \d+ entries, exactly one per handled event`),
		"saga":             regexp.MustCompile(`saga `),
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			env := []string{}
			if name == "outbox-kafka" {
				env = append(env, "OMNIBUS_KAFKA_BROKERS="+strings.Join(testenv.Kafka(t), ","))
			}
			assert.Regexp(t, want, runExample(t, name, env...))
		})
	}
}
