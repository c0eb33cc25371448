package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The README's install commands work on a clone of the repository (issue 25:
// only `go install …@latest`, which needs a published module, was given):
// `go install ./cmd/omnibus` from the root builds the command, and the
// example configuration the README copies passes `config check`.
func TestREADME_InstallFromACloneAndItsExampleConfigWork(t *testing.T) {
	t.Parallel()
	root, err := filepath.Abs("../..")
	require.NoError(t, err)
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	require.NoError(t, err)
	for _, line := range []string{"go install ./cmd/omnibus", "cp omnibus.example.yaml omnibus.yaml"} {
		require.Contains(t, string(readme), line, "the README gives the command")
	}

	bin := t.TempDir()
	install := exec.Command("go", "install", "./cmd/omnibus")
	install.Dir = root
	install.Env = append(os.Environ(), "GOBIN="+bin)
	out, err := install.CombinedOutput()
	require.NoError(t, err, "go install ./cmd/omnibus from the root: %s", out)

	check := exec.Command(filepath.Join(bin, "omnibus"), "--config", "omnibus.example.yaml", "config", "check")
	check.Dir = root
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "OMNIBUS_") {
			check.Env = append(check.Env, kv)
		}
	}
	out, err = check.CombinedOutput()
	require.NoError(t, err, "omnibus --config omnibus.example.yaml config check: %s", out)
	assert.Contains(t, string(out), "configuration OK")
	assert.Contains(t, string(out), "broker: redis")
}
