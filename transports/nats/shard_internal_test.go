package nats

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
)

// A consumer paused past its shard lease, with a message waiting for its
// consumer to take it, hands nothing out when it wakes, even before its
// renewal (keep) has run again: the shard's next owner hands the message
// out. (Before, the lease was looked at before the wait only.)
func TestShard_AMessageWaitingForItsConsumerIsNotHandedOutOnceTheLeaseLapses(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	g := &group{s: &Subscriber{}, topic: "orders", base: "orders", ctx: ctx, out: make(chan *message.Message)}
	sh := &shard{g: g, subject: "orders.0", logger: slog.New(slog.DiscardHandler), keys: map[string][]*entry{}}
	sh.soft, sh.stopSoft = context.WithCancel(ctx)
	sh.hard, sh.stopHard = context.WithCancel(ctx)
	// No keep runs: the lease lapses at until.
	until := time.Now().Add(300 * time.Millisecond)
	sh.leaseUntil.Store(until.UnixNano())

	handed := make(chan bool, 1)
	go func() { handed <- sh.handOut(&entry{seq: 1, msg: message.NewMessage("m1", nil)}) }()
	time.Sleep(time.Until(until) + 100*time.Millisecond)
	select {
	case m := <-g.out:
		t.Fatalf("handed out %s after the shard lease lapsed", m.UUID)
	case <-time.After(200 * time.Millisecond):
	}
	select {
	case again := <-handed:
		assert.False(t, again, "a message not handed out is not due again: the shard's next owner reads it")
	case <-time.After(time.Second):
		t.Fatal("handOut still waits after the lease lapsed")
	}
	assert.Error(t, sh.soft.Err(), "the shard stops handing out")
	assert.EqualValues(t, 1, g.s.stats.lost.Load(), "the shard counts as lost")
}
