package bus

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type recorded struct {
	mu      sync.Mutex
	records []slog.Record
}

func (r *recorded) Enabled(context.Context, slog.Level) bool { return true }
func (r *recorded) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.records = append(r.records, rec)
	return nil
}
func (r *recorded) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *recorded) WithGroup(string) slog.Handler      { return r }

func attrOf(r slog.Record, key string) (int64, bool) {
	var v int64
	found := false
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == key {
			v, found = a.Value.Int64(), true
		}
		return true
	})
	return v, found
}

// Issue 25: with Redis unreachable go-redis printed four identical lines
// per failed command, drowning the relay's own WARN. A repeating line is
// logged once per state change and once per LibraryRepeatEvery.
func TestLibraryLogger_RepeatedLinesAreFoldedIntoOnePerStateChange(t *testing.T) {
	t.Parallel()
	h := &recorded{}
	clock := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	l := &LibraryLogger{name: "go-redis", level: slog.LevelInfo, now: func() time.Time { return clock }}
	l.l.Store(slog.New(h))
	refused := "redis: connection pool: failed to dial after 5 attempts: dial tcp 127.0.0.1:1: connect: connection refused"
	for range 40 { // ten failed commands
		l.Printf("%s", refused)
		clock = clock.Add(100 * time.Millisecond)
	}
	require.Len(t, h.records, 1, "forty identical lines in four seconds are one record")
	assert.Equal(t, refused, h.records[0].Message)

	clock = clock.Add(LibraryRepeatEvery)
	l.Printf("%s", refused)
	require.Len(t, h.records, 2, "a line still repeating after LibraryRepeatEvery is logged again")
	n, ok := attrOf(h.records[1], "repeated")
	assert.True(t, ok)
	assert.EqualValues(t, 39, n, "with how many times it was held back")

	l.Printf("%s", refused)
	l.Printf("redis: reconnected")
	require.Len(t, h.records, 3, "a different line is logged at once")
	n, ok = attrOf(h.records[2], "repeats_before")
	assert.True(t, ok)
	assert.EqualValues(t, 1, n, "and says how many repeats of the line before it were held back")
}
