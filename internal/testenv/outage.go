package testenv

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// FreePort returns a loopback TCP port nothing listens on right now: tests
// point a client at it to play an outage, then start the service there.
func FreePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("find a free loopback port: %v", err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	if err := ln.Close(); err != nil {
		t.Fatalf("find a free loopback port: %v", err)
	}
	return port
}

// StartRedisServer starts a private redis-server on 127.0.0.1:port (no
// persistence) and stops it when the test ends. It returns once the server
// answers PING. A test that needs a Redis outage uses it: the shared server
// must never be stopped.
func StartRedisServer(t testing.TB, port int) {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("redis-server is not installed (%v): this test runs a private Redis to play an outage.\n"+
			"Install it with `make services` (Debian: apt-get install redis-server).", err)
	}
	cmd := exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--daemonize", "no", "--loglevel", "warning")
	if err := cmd.Start(); err != nil {
		t.Fatalf("start redis-server on port %d: %v", port, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	c := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", port), MaxRetries: -1})
	defer func() { _ = c.Close() }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return
		}
		select {
		case werr := <-exited:
			t.Fatalf("redis-server on port %d exited at start: %v", port, werr)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("private redis-server on port %d does not answer after 30s: %v", port, err)
		}
		time.Sleep(20 * time.Millisecond) // polling with a deadline
	}
}
