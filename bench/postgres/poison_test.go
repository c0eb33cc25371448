package postgresbench

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/omnibus-go/omnibus/bench/internal/pgbench"
	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/middleware"
	"github.com/omnibus-go/omnibus/processors"
	"github.com/omnibus-go/omnibus/transports/postgres"
)

// Shape of BenchmarkPoisonKey.
const (
	poisonBacklog = 20000
	poisonKeys    = 50
	poisonTimeout = 2 * time.Minute
)

// poisonSink fails every publish of the poison payload and counts the rest.
type poisonSink struct {
	others, poisonTries atomic.Int64
}

func (s *poisonSink) Publish(_ string, msgs ...*message.Message) error {
	for _, m := range msgs {
		if string(m.Payload) == "poison" {
			s.poisonTries.Add(1)
			return errors.New("rejected, always")
		}
		s.others.Add(1)
	}
	return nil
}

func (s *poisonSink) Close() error { return nil }

// BenchmarkPoisonKey drains a backlog of 20,000 events over 50 keys with one
// relay (default configuration and breaker), once without and once with a
// poison key whose head fails with a plain error on every try and whose
// budget (1,000 attempts, backoff 10–100 ms) outlasts the drain. It prints
// the other keys' rate in both runs and their ratio: one poison message must
// not slow the other keys (issue 13: at least 80 %), and must not open the
// breaker (breaker-opened is 0 or 1).
func BenchmarkPoisonKey(b *testing.B) {
	var clean, poisoned, opened float64
	for range b.N {
		clean += poisonDrain(b, false, nil)
		var o atomic.Int64
		poisoned += poisonDrain(b, true, &o)
		opened += float64(o.Load())
	}
	n := float64(b.N)
	b.ReportMetric(clean/n, "clean-evt/s")
	b.ReportMetric(poisoned/n, "with-poison-evt/s")
	b.ReportMetric(poisoned/clean, "ratio")
	b.ReportMetric(opened/n, "breaker-opened")
}

func poisonDrain(b *testing.B, poison bool, opened *atomic.Int64) float64 {
	b.StopTimer()
	pool := pgbench.NewPool(b, 20, nil)
	t := pgbench.NewTable(b, pool, postgres.KindOutbox, fmt.Sprintf("poison%v", poison))
	seed(b, pool, t, rows{n: poisonBacklog, keys: poisonKeys, prefix: "k"})
	if poison {
		ob, err := postgres.NewOutbox(postgres.OutboxConfig{Table: t.Name})
		if err != nil {
			b.Fatal(err)
		}
		m := message.NewMessage(watermill.NewUUID(), []byte("poison"))
		bus.SetPartitionKey(m, "poisoned")
		postgres.SetMaxAttempts(m, 1000)
		if err := ob.Enqueue(context.Background(), pool, benchTopic, m); err != nil {
			b.Fatal(err)
		}
	}
	pgbench.Vacuum(b, pool, t)
	sink := &poisonSink{}
	cfg := processors.OutboxRelayConfig{
		Publisher:  sink,
		Subscriber: postgres.SubscriberConfig{Table: t.Name},
		Retry:      middleware.RetryConfig{Base: 10 * time.Millisecond, Cap: 100 * time.Millisecond},
	}
	if opened != nil {
		cfg.Breaker.OnStateChange = func(_, to middleware.BreakerState) {
			if to == middleware.BreakerOpen {
				opened.Add(1)
			}
		}
	}
	r, err := processors.NewOutboxRelay(pool, cfg, nil)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	b.StartTimer()
	start := time.Now()
	go func() { done <- r.Run(ctx) }()
	deadline := time.Now().Add(poisonTimeout)
	for sink.others.Load() < poisonBacklog {
		if time.Now().After(deadline) {
			b.Fatalf("drained %d of %d in %s", sink.others.Load(), poisonBacklog, poisonTimeout)
		}
		time.Sleep(5 * time.Millisecond)
	}
	elapsed := time.Since(start)
	b.StopTimer()
	cancel()
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	if poison {
		b.Logf("poison tried %d times during the drain", sink.poisonTries.Load())
	}
	return pgbench.PerSecond(poisonBacklog, elapsed)
}
