package processors_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omnibus-go/omnibus/internal/testenv"
	"github.com/omnibus-go/omnibus/processors"
	"github.com/omnibus-go/omnibus/transports/postgres"
)

// A crash loop ends: a message whose handling kills the process (here
// os.Exit, as a panic past the Recoverer or the OOM killer would) is counted
// when it is leased, so after max_attempts expired leases it fails with a
// last_error that says so, and the rest of its key is delivered.
//
// The relay (or dispatcher) runs in a child process, this test binary
// started again with crashChildEnv set; the test restarts it after each
// crash, as a supervisor would.
const (
	crashChildEnv   = "OMNIBUS_TEST_CRASH_CHILD" // "relay" or "dispatch"
	crashTableEnv   = "OMNIBUS_TEST_CRASH_TABLE" // the table the child works on
	crashExitCode   = 3                          // the child's exit code when it dies on the killer
	crashLease      = time.Second                // the child's lease: short, so expiry comes soon
	crashChildLives = 2500 * time.Millisecond    // how long a child that does not crash runs
	killerPayload   = `"killer"`                 // the message that kills the process (a JSON string, for the dispatcher)
	crashBudget     = 3                          // max attempts of the killer
	crashGroup      = "crash"                    // the dispatcher's consumer group
	crashEventType  = "crash.event"              // the dispatcher's event type
	crashTopic      = "orders"                   // the topic of every event
	crashKey        = "k"                        // the key of every event
	crashStoreTopic = "orders"                   // the inbox rows' source topic
)

func TestMain(m *testing.M) {
	if mode := os.Getenv(crashChildEnv); mode != "" {
		os.Exit(runCrashChild(mode, os.Getenv(crashTableEnv)))
	}
	os.Exit(m.Run())
}

// runCrashChild runs a relay or a dispatcher over table until
// crashChildLives passes, and exits the process when it meets the killer.
func runCrashChild(mode, table string) int {
	ctx, cancel := context.WithTimeout(context.Background(), crashChildLives)
	defer cancel()
	pool, err := pgxpool.New(ctx, testenv.PostgresURL())
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	defer pool.Close()
	die := func(payload []byte) {
		if string(payload) == killerPayload {
			os.Exit(crashExitCode)
		}
	}
	sub := postgres.SubscriberConfig{Table: table, Lease: crashLease, PollInterval: 20 * time.Millisecond}
	var run func(context.Context) error
	switch mode {
	case "relay":
		relay, err := processors.NewOutboxRelay(pool, processors.OutboxRelayConfig{
			Subscriber: sub,
			Publisher: publisherFunc(func(_ string, msgs ...*message.Message) error {
				for _, m := range msgs {
					die(m.Payload)
				}
				return nil
			}),
		}, nil)
		if err != nil {
			fmt.Fprintln(os.Stderr, "child:", err)
			return 1
		}
		run = relay.Run
	case "dispatch":
		sub.ConsumerGroup = crashGroup
		d, err := processors.NewDispatcher(pool, processors.DispatcherConfig{Subscriber: sub}, nil)
		if err != nil {
			fmt.Fprintln(os.Stderr, "child:", err)
			return 1
		}
		processors.Handle(d, crashEventType, func(_ context.Context, _ string, m *message.Message) error {
			die(m.Payload)
			return nil
		})
		run = d.Run
	}
	if err := run(ctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	return 0
}

// superviseCrashLoop restarts the child until the killer row failed, and
// returns how many times the child died on it.
func superviseCrashLoop(t *testing.T, pool *pgxpool.Pool, mode, table string) (crashes int) {
	t.Helper()
	quoted := pgx.Identifier{table}.Sanitize()
	for run := 0; run < 3*crashBudget; run++ {
		var status string
		require.NoError(t, pool.QueryRow(context.Background(),
			`SELECT status FROM `+quoted+` WHERE payload = $1::bytea`, []byte(killerPayload)).Scan(&status))
		if status == "failed" {
			return crashes
		}
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), crashChildEnv+"="+mode, crashTableEnv+"="+table)
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		switch {
		case errors.As(err, &exit) && exit.ExitCode() == crashExitCode:
			crashes++
		case err != nil:
			t.Fatalf("child %s: %v\n%s", mode, err, out)
		}
	}
	t.Fatalf("the killer row is still not failed after %d runs (%d crashes): a crash loop never ends", 3*crashBudget, crashes)
	return crashes
}

func checkCrashLoopEnded(t *testing.T, pool *pgxpool.Pool, mode, table string, crashes int) {
	t.Helper()
	quoted := pgx.Identifier{table}.Sanitize()
	var (
		attempts  int
		lastError string
	)
	require.NoError(t, pool.QueryRow(context.Background(),
		`SELECT attempts, last_error FROM `+quoted+` WHERE payload = $1::bytea`, []byte(killerPayload)).Scan(&attempts, &lastError))
	assert.Equal(t, crashBudget, crashes, "the process dies exactly max_attempts times on the killer")
	assert.Equal(t, crashBudget, attempts, "each crash spent one attempt")
	assert.Contains(t, lastError, "lease expired", "last_error says why the row failed: %q", lastError)
	testenv.Eventually(t, 20*time.Second, func() bool {
		var pending int
		require.NoError(t, pool.QueryRow(context.Background(),
			`SELECT count(*) FROM `+quoted+` WHERE status <> 'completed' AND payload <> $1::bytea`, []byte(killerPayload)).Scan(&pending))
		if pending > 0 {
			// A child finishes the job.
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), crashChildEnv+"="+mode, crashTableEnv+"="+table)
			_ = cmd.Run()
		}
		return pending == 0
	}, "the rest of the key delivered after the killer failed")
}

func TestOutboxRelay_CrashLoopEndsAfterMaxAttempts(t *testing.T) {
	t.Parallel()
	pool, ob := newTable(t)
	killer := keyed(crashKey, killerPayload)
	postgres.SetMaxAttempts(killer, crashBudget)
	require.NoError(t, ob.Enqueue(context.Background(), pool, crashTopic,
		keyed(crashKey, `"before"`), killer, keyed(crashKey, `"after-1"`), keyed(crashKey, `"after-2"`)))
	crashes := superviseCrashLoop(t, pool, "relay", ob.Table())
	checkCrashLoopEnded(t, pool, "relay", ob.Table(), crashes)
}

func TestDispatcher_CrashLoopEndsAfterMaxAttempts(t *testing.T) {
	t.Parallel()
	pool, in := newInboxTable(t)
	msgs := []*message.Message{keyed(crashKey, `"before"`), keyed(crashKey, killerPayload), keyed(crashKey, `"after-1"`)}
	for _, m := range msgs {
		m.Metadata.Set("event_type", crashEventType)
	}
	postgres.SetMaxAttempts(msgs[1], crashBudget)
	_, err := in.StoreWith(context.Background(), pool, postgres.StoreOptions{Group: crashGroup, Topic: crashStoreTopic}, msgs...)
	require.NoError(t, err)
	crashes := superviseCrashLoop(t, pool, "dispatch", in.Table())
	checkCrashLoopEnded(t, pool, "dispatch", in.Table(), crashes)
}

// TestOutboxRelay_CrashLoopFailsOnlyTheKiller gives every row of the key the
// killer's budget: the rows leased in the same run as the killer (before it,
// its ack perhaps not written when the process died, and behind it, never
// delivered) must not spend their budget with it. Only the killer fails.
func TestOutboxRelay_CrashLoopFailsOnlyTheKiller(t *testing.T) {
	t.Parallel()
	pool, ob := newTable(t)
	msgs := []*message.Message{keyed(crashKey, `"before"`), keyed(crashKey, killerPayload),
		keyed(crashKey, `"after-1"`), keyed(crashKey, `"after-2"`)}
	for _, m := range msgs {
		postgres.SetMaxAttempts(m, crashBudget)
	}
	require.NoError(t, ob.Enqueue(context.Background(), pool, crashTopic, msgs...))
	crashes := superviseCrashLoop(t, pool, "relay", ob.Table())
	rows, _ := pool.Query(context.Background(), "SELECT row_to_json(x)::text FROM (SELECT id, convert_from(payload,'UTF8') p, status, attempts, locked_by, last_error FROM "+pgx.Identifier{ob.Table()}.Sanitize()+" ORDER BY id) x")
	for rows.Next() {
		var s string
		rows.Scan(&s)
		t.Log("DBG", s)
	}
	checkCrashLoopEnded(t, pool, "relay", ob.Table(), crashes)
}
