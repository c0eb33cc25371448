package rabbitmq

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omnibus-go/omnibus/internal/testenv"
)

// A consumer paused past its lease (Heartbeat), with a message waiting for
// its consumer to take it, hands nothing out when it wakes, even before its
// round trip (renewLoop) has run again: by then RabbitMQ may have given the
// queue to another consumer. (Before, the lease was looked at before the
// wait only.)
func TestSession_AMessageWaitingForItsConsumerIsNotHandedOutOnceTheLeaseLapses(t *testing.T) {
	t.Parallel()
	conn, err := dial(ConnectionConfig{URL: testenv.RabbitMQ(t)})
	require.NoError(t, err)
	defer conn.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sub := &subscription{s: &Subscriber{}, cfg: &SubscriberConfig{}, topic: "orders", exchange: "orders",
		ctx: ctx, out: make(chan *message.Message), logger: slog.New(slog.DiscardHandler)}
	sctx, scancel := context.WithCancel(ctx)
	ss := &session{sub: sub, conn: conn, ctx: sctx, cancel: scancel, keys: map[string][]*entry{}}
	// No renewLoop runs: the lease lapses at until.
	until := time.Now().Add(300 * time.Millisecond)
	ss.leaseUntil.Store(until.UnixNano())

	handed := make(chan bool, 1)
	e := &entry{d: amqp.Delivery{DeliveryTag: 1}, msg: message.NewMessage("m1", nil), queue: "orders.0"}
	go func() { handed <- ss.handOut(e) }()
	time.Sleep(time.Until(until) + 100*time.Millisecond)
	select {
	case m := <-sub.out:
		t.Fatalf("handed out %s after the lease lapsed", m.UUID)
	case <-time.After(200 * time.Millisecond):
	}
	select {
	case again := <-handed:
		assert.False(t, again, "not due again: RabbitMQ redelivers it to the queue's next consumer")
	case <-time.After(time.Second):
		t.Fatal("handOut still waits after the lease lapsed")
	}
	assert.Error(t, ss.ctx.Err(), "the session ends")
	assert.True(t, conn.IsClosed(), "and closes its connection, so RabbitMQ redelivers what it held")
	assert.EqualValues(t, 1, sub.s.stats.fenced.Load())
}
