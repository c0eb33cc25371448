package bus_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/internal/testenv"
	"github.com/omnibus-go/omnibus/transports/kafka"
	"github.com/omnibus-go/omnibus/transports/redis"
)

// libraryLog is the logger this package's tests give bus.OpenBroker, and what it
// received. The client libraries' loggers are global and take the logger of
// the first Open given one, so every test (and every -count run) must share
// this one.
var libraryLog = struct {
	mu      sync.Mutex
	records []slog.Record
	logger  *slog.Logger
}{}

func init() {
	libraryLog.logger = slog.New(recordHandler{f: func(r slog.Record) {
		libraryLog.mu.Lock()
		defer libraryLog.mu.Unlock()
		libraryLog.records = append(libraryLog.records, r)
	}})
}

// libraryLogged reports whether the library name logged a record
// containing every one of texts.
func libraryLogged(name string, texts ...string) bool {
	libraryLog.mu.Lock()
	defer libraryLog.mu.Unlock()
	for _, r := range libraryLog.records {
		lib := ""
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "library" {
				lib = a.Value.String()
			}
			return true
		})
		if lib == name && containsAll(r.Message, texts) {
			return true
		}
	}
	return false
}

func containsAll(s string, subs []string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

// TestOpen_ClientLibraryLinesAreSlogRecords: what go-redis and sarama print
// about a broker they cannot reach arrives as records of the logger given
// to Open (so in its format, e.g. JSON, and with a "library" attribute),
// not as raw lines on stderr. Tests of this package that pass
// bus.WithLogger to bus.OpenBroker must pass libraryLog.logger.
func TestOpen_ClientLibraryLinesAreSlogRecords(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	redisAddr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	redisCfg := bus.Config{Broker: redis.Name}
	redis.SetSection(&redisCfg, redis.Config{Addr: redisAddr})
	rb, err := bus.OpenBroker(ctx, redisCfg, bus.WithLogger(libraryLog.logger))
	require.NoError(t, err)
	defer func() { require.NoError(t, rb.Close()) }()

	kafkaAddr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	kafkaCfg := bus.Config{Broker: kafka.Name}
	kafka.SetSection(&kafkaCfg, kafka.Config{ConnectionConfig: kafka.ConnectionConfig{Brokers: []string{kafkaAddr}}})
	kb, err := bus.OpenBroker(ctx, kafkaCfg, bus.WithLogger(libraryLog.logger))
	require.NoError(t, err)
	defer func() { require.NoError(t, kb.Close()) }()

	require.Eventually(t, func() bool { return libraryLogged("go-redis", "failed to dial", redisAddr) },
		30*time.Second, 20*time.Millisecond, "go-redis's line about the refused dial to %s is a slog record", redisAddr)
	require.Eventually(t, func() bool { return libraryLogged("sarama", kafkaAddr) }, 30*time.Second, 20*time.Millisecond,
		"sarama's lines about %s are slog records", kafkaAddr)
}
