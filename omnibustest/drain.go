package omnibustest

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/processors"
	"github.com/omnibus-go/omnibus/transports/postgres"
)

// DrainTimeout bounds Drain and Handle.
const DrainTimeout = 30 * time.Second

// Published is a message as a relay published it.
type Published struct {
	Topic   string
	Message *message.Message
}

func (p Published) String() string {
	return fmt.Sprintf("topic=%q key=%q type=%q payload=%s", p.Topic, bus.PartitionKey(p.Message), bus.EventType(p.Message), short(p.Message.Payload))
}

// recorder is an in-memory Publisher that keeps what it is given.
type recorder struct {
	mu  sync.Mutex
	got []Published
}

func (r *recorder) Publish(topic string, msgs ...*message.Message) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, m := range msgs {
		r.got = append(r.got, Published{Topic: topic, Message: m.Copy()})
	}
	return nil
}

func (r *recorder) Close() error { return nil }

func (r *recorder) published() []Published {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Published(nil), r.got...)
}

// Drain runs an OutboxRelay (default configuration) over env's outbox into
// an in-memory publisher until no committed event is left to deliver (every
// row due now is completed), and returns what it published, in the order it
// published it: per key, the order the events were enqueued in. Events
// scheduled for later (postgres.SetDeliverAt) stay. It fails the test after
// DrainTimeout.
func (env *Env) Drain(t TB) []Published {
	t.Helper()
	rec := &recorder{}
	relay, err := processors.NewOutboxRelay(env.Pool, processors.OutboxRelayConfig{
		Publisher:  rec,
		Subscriber: postgres.SubscriberConfig{Table: env.Outbox.Table(), PollInterval: 10 * time.Millisecond},
	}, nil)
	if err != nil {
		t.Fatalf("omnibustest: Drain: %v", err)
	}
	left := `SELECT count(*) FROM ` + quoted(env.Outbox.Table()) + ` WHERE status = 'pending' AND scheduled_at <= now()`
	run(t, "Drain", relay.Run, func(ctx context.Context) (bool, string, error) {
		var n int
		err := env.Pool.QueryRow(ctx, left).Scan(&n)
		return n == 0, fmt.Sprintf("%d events still to deliver; published so far: %s", n, describe(rec.published())), err
	})
	return rec.published()
}

// run runs a processor until done says so, then stops it and waits.
func run(t TB, what string, processor func(context.Context) error, done func(context.Context) (bool, string, error)) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan error, 1)
	go func() { stopped <- processor(ctx) }()
	stop := func() error {
		cancel()
		return <-stopped
	}
	deadline := time.Now().Add(DrainTimeout)
	for {
		ok, state, err := done(context.Background())
		switch {
		case err != nil:
			_ = stop()
			t.Fatalf("omnibustest: %s: %v", what, err)
			return
		case ok:
			if err := stop(); err != nil {
				t.Fatalf("omnibustest: %s: the processor failed: %v", what, err)
			}
			return
		case time.Now().After(deadline):
			_ = stop()
			t.Fatalf("omnibustest: %s: not done after %s: %s", what, DrainTimeout, state)
			return
		}
		select {
		case err := <-stopped:
			t.Fatalf("omnibustest: %s: the processor stopped early: %v", what, err)
			return
		case <-time.After(10 * time.Millisecond):
		}
	}
}
