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
)

// TestOpen_ClientLibraryLinesAreSlogRecords: what go-redis and sarama print
// about a broker they cannot reach arrives as records of the logger given
// to Open (so in its format, e.g. JSON, and with a "library" attribute),
// not as raw lines on stderr.
//
// The libraries' loggers are global and take the logger of the first Open
// given one: this must stay the only test of this package that passes
// bus.WithLogger to bus.Open.
func TestOpen_ClientLibraryLinesAreSlogRecords(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var mu sync.Mutex
	var records []slog.Record
	logger := slog.New(recordHandler{f: func(r slog.Record) {
		mu.Lock()
		defer mu.Unlock()
		records = append(records, r)
	}})
	fromLibrary := func(name, text string) bool {
		mu.Lock()
		defer mu.Unlock()
		for _, r := range records {
			lib := ""
			r.Attrs(func(a slog.Attr) bool {
				if a.Key == "library" {
					lib = a.Value.String()
				}
				return true
			})
			if lib == name && strings.Contains(r.Message, text) {
				return true
			}
		}
		return false
	}

	redisCfg := bus.Config{Broker: bus.BrokerRedis}
	redisCfg.Redis.Addr = fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	rb, err := bus.Open(ctx, redisCfg, bus.WithLogger(logger))
	require.NoError(t, err)
	defer func() { require.NoError(t, rb.Close()) }()

	kafkaCfg := bus.Config{Broker: bus.BrokerKafka}
	kafkaCfg.Kafka.Brokers = []string{fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))}
	kb, err := bus.Open(ctx, kafkaCfg, bus.WithLogger(logger))
	require.NoError(t, err)
	defer func() { require.NoError(t, kb.Close()) }()

	require.Eventually(t, func() bool { return fromLibrary("go-redis", "failed to dial") }, 30*time.Second, 20*time.Millisecond,
		"go-redis's line about the refused dial is a slog record")
	require.Eventually(t, func() bool { return fromLibrary("sarama", "") }, 30*time.Second, 20*time.Millisecond,
		"sarama's lines are slog records")
}
