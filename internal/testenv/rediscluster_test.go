package testenv

import (
	"context"
	"fmt"
	"net"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"
)

// recordingTB is a testing.TB whose Fatal and Skip record what they were
// told and end the calling goroutine, so a test can check that a helper
// fails (not skips) and what it says.
type recordingTB struct {
	testing.TB
	fatal   string
	skipped bool
}

func (r *recordingTB) Helper() {}

func (r *recordingTB) Fatalf(format string, args ...any) {
	r.fatal = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func (r *recordingTB) Skip(...any)          { r.skipped = true; runtime.Goexit() }
func (r *recordingTB) Skipf(string, ...any) { r.skipped = true; runtime.Goexit() }
func (r *recordingTB) SkipNow()             { r.skipped = true; runtime.Goexit() }

// TestNewRedisClusterClient_UnreachableClusterFailsWithInstructions points
// the cluster helper at a port nobody listens on: the test must fail with
// the address and `make services`, never skip.
func TestNewRedisClusterClient_UnreachableClusterFailsWithInstructions(t *testing.T) {
	// A port that was free a moment ago: listen, note it, close.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen on a free port: %v", err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	t.Setenv("OMNIBUS_TEST_REDIS_CLUSTER_ADDRS", addr)

	rec := &recordingTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		NewRedisClusterClient(rec)
	}()
	<-done

	if rec.skipped {
		t.Fatal("an unreachable cluster skipped the test; it must fail it")
	}
	for _, want := range []string{addr, "make services", "OMNIBUS_TEST_REDIS_CLUSTER_ADDRS"} {
		if !strings.Contains(rec.fatal, want) {
			t.Errorf("failure message %q does not mention %q", rec.fatal, want)
		}
	}
}

func TestRedisClusterAddrs_ReadsCommaSeparatedList(t *testing.T) {
	cases := []struct {
		env  string
		want []string
	}{
		{env: "", want: []string{"127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7003"}},
		{env: "10.0.0.1:6379", want: []string{"10.0.0.1:6379"}},
		{env: " a:1 , b:2,,", want: []string{"a:1", "b:2"}},
	}
	for _, c := range cases {
		t.Run(c.env, func(t *testing.T) {
			t.Setenv("OMNIBUS_TEST_REDIS_CLUSTER_ADDRS", c.env)
			got := RedisClusterAddrs()
			if strings.Join(got, "|") != strings.Join(c.want, "|") {
				t.Fatalf("RedisClusterAddrs() = %q, want %q", got, c.want)
			}
		})
	}
}

// TestRedisCluster_ReachesEveryMaster needs the cluster `make services`
// starts and checks the shared client reaches every master.
func TestRedisCluster_ReachesEveryMaster(t *testing.T) {
	c := RedisCluster(t)
	var masters atomic.Int32
	err := c.ForEachMaster(t.Context(), func(ctx context.Context, node *redis.Client) error {
		masters.Add(1)
		return node.Ping(ctx).Err()
	})
	if err != nil {
		t.Fatalf("ping every master: %v", err)
	}
	if masters.Load() < 1 {
		t.Fatal("the cluster client found no master")
	}
}
