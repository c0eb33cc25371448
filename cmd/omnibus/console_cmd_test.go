package main

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestConsole_ListensOnLoopbackByDefault(t *testing.T) {
	t.Parallel()
	a := &app{lookupEnv: func(string) (string, bool) { return "", false }}
	f := a.consoleCommand().Flags().Lookup("listen")
	require.NotNil(t, f)
	assert.Equal(t, "127.0.0.1:8090", f.DefValue)
}

func TestConsole_RefusesAnOpenBindWithoutCredentials(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{"all interfaces", []string{"console", "--listen", "0.0.0.0:0"}, nil, "is not a loopback address"},
		{"empty host", []string{"console", "--listen", ":0"}, nil, "is not a loopback address"},
		{"bad basic auth", []string{"console"}, map[string]string{envConsoleBasicAuth: "ops"}, "OMNIBUS_CONSOLE_BASIC_AUTH: want user:password"},
		{"bad refresh", []string{"console", "--refresh", "0s"}, nil, "--refresh must be positive"},
	} {
		a := &app{lookupEnv: func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok }}
		r := cliWith(t, context.Background(), a, tc.args...)
		assert.Equal(t, exitUsage, r.code, tc.name)
		assert.Contains(t, r.stderr, tc.want, tc.name)
	}
}

// serveConsole runs `omnibus console` with env and returns its address.
func serveConsole(t *testing.T, env map[string]string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	listening := make(chan string, 1)
	a := &app{onListen: func(addr string) { listening <- addr },
		lookupEnv: func(k string) (string, bool) { v, ok := env[k]; return v, ok }}
	done := make(chan result, 1)
	go func() { done <- cliWith(t, ctx, a, args...) }()
	t.Cleanup(func() {
		cancel()
		r := <-done
		assert.Equal(t, exitOK, r.code, "console stops cleanly: %s", r.stderr)
	})
	select {
	case addr := <-listening:
		return addr
	case r := <-done:
		t.Fatalf("console exited early with %d: %s", r.code, r.stderr)
	case <-time.After(30 * time.Second):
		t.Fatal("console did not start serving")
	}
	return ""
}

func TestConsole_ServesTheConfiguredTablesWithoutTheirSecrets(t *testing.T) {
	t.Parallel()
	path, outbox, inbox := tablesConfig(t, "")
	ok(t, cli(t, context.Background(), "migrate", "--config", path))
	addr := serveConsole(t, nil, "console", "--config", path, "--listen", "127.0.0.1:0")

	code, body := get(t, "http://"+addr+"/")
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, outbox)
	assert.Contains(t, body, inbox)
	assert.NotContains(t, body, "postgres://", "the database URL never appears on a page")
	code, body = get(t, "http://"+addr+"/relays")
	require.Equal(t, http.StatusOK, code)
	assert.Contains(t, body, `name="action" value="release-leases"`)
}

func TestConsole_ReadOnlyAndTokenOnAnOpenBind(t *testing.T) {
	t.Parallel()
	path, _, _ := tablesConfig(t, "")
	ok(t, cli(t, context.Background(), "migrate", "--config", path))
	addr := serveConsole(t, map[string]string{envConsoleToken: "s3cret-token"},
		"console", "--config", path, "--listen", "0.0.0.0:0", "--read-only")
	url := "http://" + strings.Replace(addr, "0.0.0.0", "127.0.0.1", 1) + "/relays"

	code, _ := get(t, url)
	assert.Equal(t, http.StatusUnauthorized, code, "no token, no page")
	req, err := http.NewRequest(http.MethodGet, url, nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer s3cret-token")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	var b strings.Builder
	_, _ = io.Copy(&b, resp.Body)
	assert.NotContains(t, b.String(), `method="post"`, "--read-only hides the actions")
	assert.NotContains(t, b.String(), "s3cret-token")
}
