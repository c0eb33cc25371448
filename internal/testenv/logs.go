package testenv

import (
	"bufio"
	"bytes"
	"encoding/json"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// LogBuffer collects what a program writes (a slog handler's lines, a
// command's output) while a test reads it; safe for concurrent use.
type LogBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *LogBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String returns what was written so far.
func (l *LogBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Records returns the JSON log records written so far; a line that is not
// one JSON record fails the test.
func (l *LogBuffer) Records(t testing.TB) []map[string]any {
	t.Helper()
	l.mu.Lock()
	data := append([]byte(nil), l.b.Bytes()...)
	l.mu.Unlock()
	var out []map[string]any
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		var r map[string]any
		require.NoError(t, json.Unmarshal(sc.Bytes(), &r), "every log line is one JSON record: %q", sc.Text())
		out = append(out, r)
	}
	return out
}
