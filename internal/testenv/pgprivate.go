package testenv

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// PrivatePostgres is a private plain PostgreSQL cluster started by
// StartPrivatePostgres, which a test may crash and restart: what the shared
// server must never be put through. Its methods are not safe for concurrent
// use; call them from the test's goroutine.
type PrivatePostgres struct {
	// Port is the TCP port the server listens on, on 127.0.0.1; a restart
	// keeps it, so a pool built on URL reaches the restarted server.
	Port int

	cred           *syscall.Credential
	bin, dir, data string
	srv            *pgServer // nil while crashed
	starts         int
}

// URL returns a postgres:// connection string to the cluster's database
// postgres as the superuser postgres (trust over TCP, no TLS).
func (p *PrivatePostgres) URL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", p.Port)
}

// StartPrivatePostgres starts a private PostgreSQL cluster for one test and
// stops it (and deletes its files) when the test ends. It takes a few
// seconds (initdb): start one per test function.
//
// The cluster is PostgresBinDir's (else PATH's) initdb and postgres in a
// fresh directory under the system temp dir, listening on a free port of
// 127.0.0.1, trusting every user over TCP and the Unix socket (no TLS), and
// running as the OS user postgres when the test runs as root, as
// StartTLSPostgres does. It keeps the server's defaults for durability
// (synchronous_commit on, wal_writer_delay 200ms) but fsync, which only an
// operating system crash would need, is off.
func StartPrivatePostgres(t testing.TB) *PrivatePostgres {
	t.Helper()
	initdb := findPostgresBin(t, "initdb")
	p := &PrivatePostgres{bin: findPostgresBin(t, "postgres"), cred: postgresCredential(t)}
	p.dir = clusterDir(t, "omnibus-pg-", p.cred)
	p.data = initCluster(t, p.cred, initdb, p.dir, "trust", strings.Join([]string{
		"# omnibus testenv.StartPrivatePostgres: trust, no TLS",
		"local  all  all                 trust",
		"host   all  all  127.0.0.1/32   trust",
		"",
	}, "\n"))
	p.srv = startOnFreePort(t, "the private PostgreSQL", func(port int) (*pgServer, error) {
		p.Port = port
		return p.start(t)
	})
	t.Cleanup(func() {
		if p.srv != nil {
			p.srv.stop()
		}
	})
	return p
}

func (p *PrivatePostgres) start(t testing.TB) (*pgServer, error) {
	t.Helper()
	p.starts++
	logPath := filepath.Join(p.dir, fmt.Sprintf("postgres-%d-%d.log", p.Port, p.starts))
	return startPostgres(t, p.cred, p.bin, p.dir, p.data, p.Port, logPath, "listen_addresses=127.0.0.1")
}

// Crash stops the server as a crash would and returns once it has exited:
// SIGQUIT to the postmaster, PostgreSQL's immediate shutdown. No checkpoint
// is taken and WAL that the WAL writer has not written yet is lost, commits
// made with synchronous_commit off among it; every client's connection is
// closed. The data directory stays for Restart.
func (p *PrivatePostgres) Crash(t testing.TB) {
	t.Helper()
	if p.srv == nil {
		t.Fatalf("Crash: the private PostgreSQL on port %d is not running (crashed and not restarted)", p.Port)
	}
	p.srv.crash()
	p.srv = nil
}

// Restart starts the crashed server again on the same data directory and
// port and returns once it accepts connections. It fails the test unless
// the server ran crash recovery (its log says "automatic recovery in
// progress"), which proves Crash was a crash and not a clean shutdown.
func (p *PrivatePostgres) Restart(t testing.TB) {
	t.Helper()
	if p.srv != nil {
		t.Fatalf("Restart: the private PostgreSQL on port %d is running; Crash it first", p.Port)
	}
	srv, err := p.start(t)
	if err != nil {
		t.Fatalf("restart the private PostgreSQL on port %d: %v", p.Port, err)
	}
	p.srv = srv
	if log, _ := os.ReadFile(srv.logPath); !bytes.Contains(log, []byte("automatic recovery in progress")) {
		t.Fatalf("the private PostgreSQL on port %d restarted without crash recovery; its log:\n%s", p.Port, srv.log())
	}
}
