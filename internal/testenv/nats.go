package testenv

import (
	"context"
	"errors"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// DefaultNATSURL is the NATS server `make services` starts (with JetStream).
const DefaultNATSURL = "nats://127.0.0.1:4222"

// NATSURL is the server the tests use: OMNIBUS_TEST_NATS_URL, or
// DefaultNATSURL.
func NATSURL() string {
	if u := os.Getenv("OMNIBUS_TEST_NATS_URL"); u != "" {
		return u
	}
	return DefaultNATSURL
}

var (
	natsOnce sync.Once
	natsErr  error
)

// NATS returns the server's URL after checking, once per test binary, that
// it is reachable with JetStream enabled; it fails the test with how to
// start it when not.
func NATS(t testing.TB) string {
	t.Helper()
	natsOnce.Do(func() {
		nc, err := nats.Connect(NATSURL(), nats.Timeout(5*time.Second))
		if err != nil {
			natsErr = err
			return
		}
		defer nc.Close()
		js, err := jetstream.New(nc)
		if err != nil {
			natsErr = err
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, err := js.AccountInfo(ctx); err != nil {
			natsErr = errors.Join(errors.New("JetStream is not enabled (run nats-server with -js)"), err)
		}
	})
	if natsErr != nil {
		t.Fatalf("NATS with JetStream is not reachable at %s: %v\n"+
			"Start it with `make services` (or set OMNIBUS_TEST_NATS_URL to a server you run).", NATSURL(), natsErr)
	}
	return NATSURL()
}

// NATSPrefix returns a subject prefix unique to the test
// ("omnibus_test.<name>."); the streams under it are deleted when the test
// ends.
func NATSPrefix(t testing.TB) string {
	t.Helper()
	url := NATS(t)
	prefix := "omnibus_test." + Name(t) + "."
	t.Cleanup(func() {
		nc, err := nats.Connect(url)
		if err != nil {
			return
		}
		defer nc.Close()
		js, _ := jetstream.New(nc)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		names := js.StreamNames(ctx, jetstream.WithStreamListSubject(prefix+">"))
		for name := range names.Name() {
			_ = js.DeleteStream(ctx, name)
		}
	})
	return prefix
}
