package testenv

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// PostgresBinDir is where StartTLSPostgres and StartPrivatePostgres look for
// initdb and postgres first (the Debian package postgresql-15); PATH is
// searched next.
const PostgresBinDir = "/usr/lib/postgresql/15/bin"

// TLSPostgres is a private PostgreSQL cluster started by StartTLSPostgres
// that accepts TCP connections over TLS only. Its server certificate, signed
// by a throwaway CA made for the test, names localhost and 127.0.0.1.
type TLSPostgres struct {
	// Port is the TCP port the server listens on, on Host and OtherHost.
	Port int
	// Host is the loopback address the server certificate names (127.0.0.1;
	// "localhost" is named too).
	Host string
	// OtherHost is a second loopback address the server listens on
	// (127.0.0.2) that its certificate does not name: verify-full to it
	// must fail on the host name.
	OtherHost string
	// Database is owned by User; User may create tables in its public schema.
	Database string
	// User logs in with Password (scram-sha-256, TLS only).
	User, Password string
	// CertUser logs in with the client certificate ClientCertFile /
	// ClientKeyFile (method cert, TLS only); it has no password.
	CertUser string
	// CAFile is the PEM certificate of the CA that signed the server and
	// client certificates: what sslrootcert must name for verify-ca/-full.
	CAFile string
	// OtherCAFile is the PEM certificate of another throwaway CA, which
	// signed nothing the server shows.
	OtherCAFile string
	// ClientCertFile and ClientKeyFile are CertUser's certificate and key
	// (PEM, the key 0600), for sslcert and sslkey.
	ClientCertFile, ClientKeyFile string
}

// URL returns a postgres:// connection string to the cluster's Database on
// host (Host, OtherHost or "localhost") as user with password (none when
// empty), with params (such as "sslmode=verify-full&sslrootcert=/ca.pem")
// as its query.
func (p *TLSPostgres) URL(host, user, password, params string) string {
	u := url.URL{
		Scheme:   "postgres",
		Host:     net.JoinHostPort(host, strconv.Itoa(p.Port)),
		Path:     "/" + p.Database,
		RawQuery: params,
	}
	if password != "" {
		u.User = url.UserPassword(user, password)
	} else {
		u.User = url.User(user)
	}
	return u.String()
}

// StartTLSPostgres starts a private PostgreSQL cluster for one test and stops
// it (and deletes its files) when the test ends. It takes a few seconds
// (initdb): start one per test function and share it across subtests.
//
// How: initdb (PostgresBinDir, else PATH; a missing binary fails the test
// naming `make services` and the Debian package postgresql) into a fresh
// directory under the system temp dir, a throwaway CA and server and client
// certificates made with crypto/x509, then postgres with ssl=on on a free
// port of 127.0.0.1 and 127.0.0.2 and its Unix socket in that directory.
// pg_hba.conf allows CertUser by client certificate and everyone else by
// scram-sha-256, over TLS only (hostssl); plain TCP is rejected (hostnossl …
// reject). Only the Unix socket, which only the server's OS user can open,
// trusts the superuser postgres; the helper uses it to create User,
// CertUser and Database.
//
// PostgreSQL refuses to run as root. When the test runs as root, initdb and
// postgres run as the OS user postgres (setuid through
// syscall.SysProcAttr.Credential, as `runuser -u postgres --` would), and the
// directory and every file in it, the keys 0600, are chowned to it.
// Listening on 127.0.0.2 needs Linux, where all of 127.0.0.0/8 is loopback.
func StartTLSPostgres(t testing.TB) *TLSPostgres {
	t.Helper()
	initdb := findPostgresBin(t, "initdb")
	postgresBin := findPostgresBin(t, "postgres")
	cred := postgresCredential(t)

	dir := clusterDir(t, "omnibus-pgtls-", cred)
	p := &TLSPostgres{
		Host:      "127.0.0.1",
		OtherHost: "127.0.0.2",
		Database:  "omnibus_tls",
		User:      "omnibus_app",
		Password:  "pw_" + randomHex(t, 16),
		CertUser:  "omnibus_certuser",
	}
	serverCert, serverKey := writeTLSFiles(t, dir, p)
	chownTree(t, dir, cred)
	data := initCluster(t, cred, initdb, dir, "reject", strings.Join([]string{
		"# omnibus testenv.StartTLSPostgres: TLS only over TCP",
		"local    all  postgres                    trust",
		"hostssl  all  " + p.CertUser + "  127.0.0.1/32  cert",
		"hostssl  all  " + p.CertUser + "  127.0.0.2/32  cert",
		"hostssl  all  all  127.0.0.1/32  scram-sha-256",
		"hostssl  all  all  127.0.0.2/32  scram-sha-256",
		"hostnossl all all  127.0.0.1/32  reject",
		"hostnossl all all  127.0.0.2/32  reject",
		"",
	}, "\n"))

	srv := startOnFreePort(t, "the private TLS PostgreSQL", func(port int) (*pgServer, error) {
		p.Port = port
		return startPostgres(t, cred, postgresBin, dir, data, port,
			filepath.Join(dir, "postgres-"+strconv.Itoa(port)+".log"),
			"listen_addresses=127.0.0.1,127.0.0.2",
			"ssl=on", "ssl_cert_file="+serverCert, "ssl_key_file="+serverKey, "ssl_ca_file="+p.CAFile)
	})
	t.Cleanup(srv.stop)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, socketDSN(dir, p.Port))
	if err != nil {
		t.Fatalf("connect to the private PostgreSQL over its Unix socket in %s: %v", dir, err)
	}
	defer func() { _ = conn.Close(context.Background()) }()
	for _, stmt := range []string{
		// The password is hex: no quoting issue; scram-sha-256 is PG 15's
		// default password_encryption.
		fmt.Sprintf("CREATE ROLE %s LOGIN PASSWORD '%s'", p.User, p.Password),
		fmt.Sprintf("CREATE ROLE %s LOGIN", p.CertUser),
		fmt.Sprintf("CREATE DATABASE %s OWNER %s", p.Database, p.User),
	} {
		if _, err := conn.Exec(ctx, stmt); err != nil {
			t.Fatalf("set up the private PostgreSQL: %s: %v", strings.SplitN(stmt, " PASSWORD", 2)[0], err)
		}
	}
	return p
}

// clusterDir makes a fresh directory for a private cluster, removed when
// the test ends, and gives it to cred's user. It is a short path of our own,
// not t.TempDir: the Unix socket's path must fit in 107 bytes, and
// t.TempDir's parent is 0700 root, which the postgres user cannot enter.
func clusterDir(t testing.TB, prefix string, cred *syscall.Credential) string {
	t.Helper()
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		t.Fatalf("make a directory for the private PostgreSQL: %v", err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatalf("chmod %s: %v", dir, err)
	}
	chownTree(t, dir, cred)
	return dir
}

// initCluster runs initdb into dir/data (superuser postgres, trust over the
// Unix socket, authHost over TCP until hba replaces pg_hba.conf) and returns
// the data directory.
func initCluster(t testing.TB, cred *syscall.Credential, initdb, dir, authHost, hba string) string {
	t.Helper()
	data := filepath.Join(dir, "data")
	run(t, cred, initdb, "-D", data, "-U", "postgres", "-E", "UTF8", "--locale=C",
		"--auth-local=trust", "--auth-host="+authHost, "--no-sync", "--no-instructions")
	writeFile(t, filepath.Join(data, "pg_hba.conf"), []byte(hba), 0o600)
	chownTree(t, data, cred)
	return data
}

// startOnFreePort starts a server on a free port with start, trying a few
// ports (a free port can be taken by someone else before postgres binds
// it); it fails the test naming what after the last try.
func startOnFreePort(t testing.TB, what string, start func(port int) (*pgServer, error)) *pgServer {
	t.Helper()
	var lastErr error
	for range 3 {
		srv, err := start(FreePort(t))
		if err == nil {
			return srv
		}
		lastErr = err
	}
	t.Fatalf("start %s: %v", what, lastErr)
	return nil
}

// socketDSN connects as the superuser postgres over the cluster's Unix
// socket in dir, which only the server's OS user (and root) can open.
func socketDSN(dir string, port int) string {
	return fmt.Sprintf("host=%s port=%d user=postgres dbname=postgres sslmode=disable connect_timeout=2", dir, port)
}

// pgServer is a running postmaster.
type pgServer struct {
	cmd     *exec.Cmd
	exited  chan struct{} // closed when the postmaster has exited
	err     error         // its exit status, once exited is closed
	logPath string
}

// stop shuts the server down cleanly (fast shutdown: a checkpoint, every
// commit kept), killing it after 30s.
func (s *pgServer) stop() { s.signal(syscall.SIGINT) }

// crash shuts the server down as a crash would (immediate shutdown: no
// checkpoint, WAL not yet written by the WAL writer is lost, and the next
// start runs crash recovery), killing it after 30s.
func (s *pgServer) crash() { s.signal(syscall.SIGQUIT) }

func (s *pgServer) signal(sig syscall.Signal) {
	select {
	case <-s.exited:
		return
	default:
	}
	_ = s.cmd.Process.Signal(sig)
	select {
	case <-s.exited:
	case <-time.After(30 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.exited
	}
}

// log returns the tail of the server's log.
func (s *pgServer) log() string {
	b, _ := os.ReadFile(s.logPath)
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

// startPostgres starts postgres on data and returns once it accepts
// connections on its Unix socket in dir. Its output goes to logPath;
// settings are more -c name=value settings (listen_addresses among them).
// An error carries the tail of the server's log.
func startPostgres(t testing.TB, cred *syscall.Credential, bin, dir, data string, port int, logPath string, settings ...string) (*pgServer, error) {
	t.Helper()
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("create %s: %w", logPath, err)
	}
	defer func() { _ = logFile.Close() }()
	args := []string{"-D", data,
		"-c", "port=" + strconv.Itoa(port),
		"-c", "unix_socket_directories=" + dir,
		"-c", "unix_socket_permissions=0700",
		"-c", "fsync=off",
		"-c", "max_connections=30",
		"-c", "shared_buffers=16MB",
	}
	for _, s := range settings {
		args = append(args, "-c", s)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	// Pdeathsig: a test binary killed on timeout does not leave a server.
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	srv := &pgServer{cmd: cmd, exited: make(chan struct{}), logPath: logPath}
	go func() {
		srv.err = cmd.Wait()
		close(srv.exited)
	}()
	deadline := time.Now().Add(60 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		conn, err := pgx.Connect(ctx, socketDSN(dir, port))
		cancel()
		if err == nil {
			_ = conn.Close(context.Background())
			return srv, nil
		}
		select {
		case <-srv.exited:
			return nil, fmt.Errorf("postgres on port %d exited at start (%v); its log:\n%s", port, srv.err, srv.log())
		default:
		}
		if time.Now().After(deadline) {
			srv.stop()
			return nil, fmt.Errorf("postgres on port %d does not accept connections after 60s (%v); its log:\n%s", port, err, srv.log())
		}
		time.Sleep(50 * time.Millisecond) // polling with a deadline
	}
}

// findPostgresBin returns the path of a PostgreSQL server program.
func findPostgresBin(t testing.TB, name string) string {
	t.Helper()
	p := filepath.Join(PostgresBinDir, name)
	if _, err := os.Stat(p); err == nil {
		return p
	}
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	t.Fatalf("PostgreSQL's %s is neither in %s nor on PATH: this test runs a private PostgreSQL 15.\n"+
		"Install it with `make services` (Debian: apt-get install postgresql).", name, PostgresBinDir)
	return ""
}

// postgresCredential returns the OS user the server programs run as: nil
// (the test's own user) unless the test runs as root, which PostgreSQL
// refuses; then the user postgres.
func postgresCredential(t testing.TB) *syscall.Credential {
	t.Helper()
	if os.Geteuid() != 0 {
		return nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		t.Fatalf("the test runs as root and PostgreSQL refuses root, but there is no OS user postgres to run it as (%v).\n"+
			"Install PostgreSQL with `make services` (Debian: apt-get install postgresql), which creates it, or run the tests as another user.", err)
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err := errors.Join(err1, err2); err != nil {
		t.Fatalf("OS user postgres has a non-numeric uid or gid: %v", err)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), NoSetGroups: true}
}

// chownTree gives dir and everything under it to cred's user (no-op for nil).
func chownTree(t testing.TB, dir string, cred *syscall.Credential) {
	t.Helper()
	if cred == nil {
		return
	}
	err := filepath.WalkDir(dir, func(path string, _ os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(path, int(cred.Uid), int(cred.Gid))
	})
	if err != nil {
		t.Fatalf("give %s to the OS user postgres: %v", dir, err)
	}
}

// run runs a program as cred's user and fails the test with its output if
// it fails.
func run(t testing.TB, cred *syscall.Credential, bin string, args ...string) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	cmd.Dir = os.TempDir() // a directory the postgres user may enter
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v\n%s", filepath.Base(bin), strings.Join(args, " "), err, out)
	}
}

// writeTLSFiles makes the throwaway CAs and the server and client
// certificates in dir, sets p.CAFile, p.OtherCAFile, p.ClientCertFile and
// p.ClientKeyFile, and returns the paths of the server's certificate and
// key.
func writeTLSFiles(t testing.TB, dir string, p *TLSPostgres) (serverCert, serverKey string) {
	t.Helper()
	ca, caKey := NewCert(t, "omnibus test CA", nil, nil, true, nil, nil)
	other, _ := NewCert(t, "omnibus other test CA", nil, nil, true, nil, nil)
	srv, srvKey := NewCert(t, "localhost", []string{"localhost"}, []net.IP{net.ParseIP("127.0.0.1")}, false, ca, caKey)
	cli, cliKey := NewCert(t, p.CertUser, nil, nil, false, ca, caKey)

	p.CAFile = filepath.Join(dir, "ca.crt")
	p.OtherCAFile = filepath.Join(dir, "other-ca.crt")
	serverCert = filepath.Join(dir, "server.crt")
	serverKey = filepath.Join(dir, "server.key")
	p.ClientCertFile = filepath.Join(dir, "client.crt")
	p.ClientKeyFile = filepath.Join(dir, "client.key")
	writeFile(t, p.CAFile, PEMCert(ca), 0o600)
	writeFile(t, p.OtherCAFile, PEMCert(other), 0o600)
	writeFile(t, serverCert, PEMCert(srv), 0o600)
	writeFile(t, serverKey, PEMKey(t, srvKey), 0o600)
	writeFile(t, p.ClientCertFile, PEMCert(cli), 0o600)
	writeFile(t, p.ClientKeyFile, PEMKey(t, cliKey), 0o600)
	return serverCert, serverKey
}

// NewCert makes a throwaway ECDSA certificate for tests: a CA when isCA,
// else a server and client certificate for dnsNames and ips; self-signed
// when parent is nil, else signed by parent and parentKey. Valid from an hour
// ago for a day.
func NewCert(t testing.TB, cn string, dnsNames []string, ips []net.IP, isCA bool, parent *x509.Certificate, parentKey *ecdsa.PrivateKey) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatalf("generate a key for %q: %v", cn, err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		t.Fatalf("draw a serial for %q: %v", cn, err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		DNSNames:     dnsNames,
		IPAddresses:  ips,
	}
	if isCA {
		tmpl.IsCA = true
		tmpl.BasicConstraintsValid = true
		tmpl.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageCRLSign
	} else {
		tmpl.KeyUsage = x509.KeyUsageDigitalSignature
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	}
	if parent == nil {
		parent, parentKey = tmpl, key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		t.Fatalf("make the certificate %q: %v", cn, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatalf("parse the certificate %q: %v", cn, err)
	}
	return cert, key
}

// PEMCert encodes c as PEM.
func PEMCert(c *x509.Certificate) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
}

// PEMKey encodes k as a PKCS #8 PEM block.
func PEMKey(t testing.TB, k *ecdsa.PrivateKey) []byte {
	t.Helper()
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		t.Fatalf("encode a private key: %v", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
}

func writeFile(t testing.TB, path string, data []byte, perm os.FileMode) {
	t.Helper()
	if err := os.WriteFile(path, data, perm); err != nil {
		t.Fatalf("write %s: %v", path, err)
	}
	if err := os.Chmod(path, perm); err != nil { // WriteFile keeps an existing file's mode
		t.Fatalf("chmod %s: %v", path, err)
	}
}

func randomHex(t testing.TB, n int) string {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatalf("draw random bytes: %v", err)
	}
	return hex.EncodeToString(b)
}
