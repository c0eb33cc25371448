package bus

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// LibraryLogger carries the lines a client library prints through its own
// global logger (go-redis's redis.SetLogger, sarama.Logger) into slog: one
// record per line, at a fixed level, with a "library" attribute, in the
// format and at the level filter of the *slog.Logger it is given. Until it
// has one it drops the lines.
//
// Those loggers are global to the process, so a LibraryLogger takes the
// logger of the first Open given one (WithLogger) and keeps it for the life
// of the process; later Opens do not change it. Transports create theirs
// with NewLibraryLogger. It is safe for concurrent use: the library may
// print while the logger is being set.
//
// A client retrying a broker that is down prints the same line again and
// again (go-redis: one per dial attempt, four per failed command). A
// LibraryLogger logs a line once and then holds back exact repeats of it:
// the next different line (the connection's state changed) carries how
// many were held back ("repeats_before"), and a line still repeating is
// logged again at most once every LibraryRepeatEvery, with how many times
// it came meanwhile ("repeated"). So an outage is one line per state
// change and per interval, not one per retry.
type LibraryLogger struct {
	name    string
	level   slog.Level
	install func(*LibraryLogger)
	once    sync.Once
	l       atomic.Pointer[slog.Logger]

	mu      sync.Mutex
	now     func() time.Time // time.Now; tests move it
	last    string
	lastAt  time.Time
	repeats int
}

// LibraryRepeatEvery is how often a LibraryLogger logs a line that keeps
// repeating.
const LibraryRepeatEvery = time.Minute

var (
	libraryLoggersMu sync.Mutex
	libraryLoggers   []*LibraryLogger
)

// NewLibraryLogger registers a LibraryLogger for the library name, writing
// at level. install, if not nil, is called once, right after the first
// logger is set: that is where a library whose default is to print to
// stderr is told to print here instead (so that a program that never gives
// omnibus a logger keeps the library's default). A library whose default is
// to print nothing can be pointed at the LibraryLogger at init instead.
func NewLibraryLogger(name string, level slog.Level, install func(*LibraryLogger)) *LibraryLogger {
	l := &LibraryLogger{name: name, level: level, install: install}
	libraryLoggersMu.Lock()
	libraryLoggers = append(libraryLoggers, l)
	libraryLoggersMu.Unlock()
	return l
}

// routeLibraryLogs gives logger to every LibraryLogger that has none yet.
func routeLibraryLogs(logger *slog.Logger) {
	libraryLoggersMu.Lock()
	ls := append([]*LibraryLogger(nil), libraryLoggers...)
	libraryLoggersMu.Unlock()
	for _, l := range ls {
		l.once.Do(func() {
			l.l.Store(logger.With("library", l.name))
			if l.install != nil {
				l.install(l)
			}
		})
	}
}

func (l *LibraryLogger) log(ctx context.Context, line string) {
	lg := l.l.Load()
	if lg == nil || !lg.Enabled(ctx, l.level) {
		return
	}
	line = strings.TrimRight(line, "\n")
	now := time.Now
	if l.now != nil {
		now = l.now
	}
	t := now()
	l.mu.Lock()
	same := line == l.last
	if same && t.Sub(l.lastAt) < LibraryRepeatEvery {
		l.repeats++
		l.mu.Unlock()
		return
	}
	repeats := l.repeats
	l.last, l.lastAt, l.repeats = line, t, 0
	l.mu.Unlock()
	switch {
	case repeats == 0:
		lg.Log(ctx, l.level, line)
	case same:
		lg.Log(ctx, l.level, line, "repeated", repeats)
	default:
		lg.Log(ctx, l.level, line, "repeats_before", repeats)
	}
}

// Print logs fmt.Sprint(v...) (sarama's StdLogger).
func (l *LibraryLogger) Print(v ...any) { l.log(context.Background(), fmt.Sprint(v...)) }

// Printf logs fmt.Sprintf(format, v...) (sarama's StdLogger).
func (l *LibraryLogger) Printf(format string, v ...any) {
	l.log(context.Background(), fmt.Sprintf(format, v...))
}

// Println logs fmt.Sprintln(v...) without its newline (sarama's StdLogger).
func (l *LibraryLogger) Println(v ...any) { l.log(context.Background(), fmt.Sprintln(v...)) }

// Context returns l with the method set of go-redis's logger:
// Printf(ctx, format, v...).
func (l *LibraryLogger) Context() ContextLibraryLogger { return ContextLibraryLogger{l} }

// ContextLibraryLogger is a LibraryLogger whose Printf takes a context, as
// go-redis's redis.SetLogger wants.
type ContextLibraryLogger struct{ l *LibraryLogger }

// Printf logs fmt.Sprintf(format, v...).
func (c ContextLibraryLogger) Printf(ctx context.Context, format string, v ...any) {
	if ctx == nil {
		ctx = context.Background()
	}
	c.l.log(ctx, fmt.Sprintf(format, v...))
}
