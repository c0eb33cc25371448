package processors_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/middleware"
	"github.com/omnibus-go/omnibus/transports/postgres"
)

// dedupHandler is a handler behind middleware.Dedup over a postgres.Deduper
// that writes one effect per call with the deduper's transaction; fail, when
// set, decides whether a call fails after writing its effect.
func dedupHandler(t *testing.T, fail func(call int) error) (message.HandlerFunc, effects, *postgres.Inbox, func() int) {
	t.Helper()
	pool, in := newInboxTable(t)
	fx := newEffects(t, pool)
	deduper, err := postgres.NewDeduper(pool, in, "billing")
	require.NoError(t, err)
	dedup, err := middleware.NewDedup(deduper, nil)
	require.NoError(t, err)
	var mu sync.Mutex
	calls := 0
	h := dedup.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		mu.Lock()
		calls++
		call := calls
		mu.Unlock()
		tx, ok := postgres.TxFromContext(msg.Context())
		if !ok {
			return nil, errors.New("no transaction in the handler's context")
		}
		if err := fx.write(msg.Context(), pgxEffectsDB{tx}, bus.EventID(msg), "paid"); err != nil {
			return nil, err
		}
		if fail != nil {
			if err := fail(call); err != nil {
				return nil, err
			}
		}
		return []*message.Message{message.NewMessage(watermill.NewUUID(), []byte("produced"))}, nil
	})
	return h, fx, in, func() int { mu.Lock(); defer mu.Unlock(); return calls }
}

func received(uuid string) *message.Message {
	msg := message.NewMessage(uuid, []byte(`{"order":"o-1"}`))
	msg.SetContext(bus.WithDelivery(context.Background(), bus.Delivery{Topic: "orders", Source: "kafka"}))
	return msg
}

func TestDedup_ARedeliveredMessageHasItsEffectOnce(t *testing.T) {
	t.Parallel()
	h, fx, _, calls := dedupHandler(t, nil)
	id := watermill.NewUUID()
	out, err := h(received(id))
	require.NoError(t, err)
	assert.Len(t, out, 1, "what the handler produced goes to the router")
	for range 2 {
		out, err = h(received(id))
		require.NoError(t, err, "a duplicate is acked")
		assert.Empty(t, out, "a duplicate produces nothing")
	}
	assert.Equal(t, 1, calls(), "the handler ran once")
	assert.Equal(t, 1, fx.count(t), "one effect")
	_, err = h(received(watermill.NewUUID()))
	require.NoError(t, err)
	assert.Equal(t, 2, fx.count(t), "another message is handled")
}

func TestDedup_AFailedHandlerLeavesNoRecordAndNoEffect(t *testing.T) {
	t.Parallel()
	boom := errors.New("payment service down")
	h, fx, in, calls := dedupHandler(t, func(call int) error {
		if call == 1 {
			return boom
		}
		return nil
	})
	pool := fx.pool
	id := watermill.NewUUID()
	_, err := h(received(id))
	require.ErrorIs(t, err, boom, "the handler's error comes back as is")
	assert.Zero(t, fx.count(t), "its effect was rolled back")
	assert.Zero(t, countRows(t, pool, in, `message_id = $1`, id), "and so was the record")
	_, err = h(received(id))
	require.NoError(t, err)
	assert.Equal(t, 2, calls())
	assert.Equal(t, 1, fx.count(t))
	assert.Equal(t, 1, countRows(t, pool, in, `message_id = $1 AND consumer_group = 'billing' AND status = 'completed'`, id),
		"the record is a completed inbox row of the group, for cleanup to delete after the retention")
}

func TestDedup_ConcurrentDeliveriesOfOneMessageHaveOneEffect(t *testing.T) {
	t.Parallel()
	h, fx, _, calls := dedupHandler(t, nil)
	id := watermill.NewUUID()
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			_, err := h(received(id))
			assert.NoError(t, err)
		})
	}
	wg.Wait()
	assert.Equal(t, 1, calls(), "the others waited on the record and found it")
	assert.Equal(t, 1, fx.count(t))
}

func TestDedup_AMessageThatCannotBeRecordedFailsPermanently(t *testing.T) {
	t.Parallel()
	h, fx, _, calls := dedupHandler(t, nil)
	msg := message.NewMessage(watermill.NewUUID(), []byte("{}")) // no Delivery, no router topic
	_, err := h(msg)
	require.Error(t, err)
	assert.Equal(t, bus.ClassPermanent, bus.ClassOf(err))
	assert.Contains(t, err.Error(), "topic")
	assert.Zero(t, calls())
	assert.Zero(t, fx.count(t))
}

func TestNewDeduper_InvalidArguments(t *testing.T) {
	t.Parallel()
	pool, in := newInboxTable(t)
	_, err := postgres.NewDeduper(pool, in, "")
	assert.ErrorContains(t, err, "consumer group")
	_, err = postgres.NewDeduper(nil, in, "g")
	assert.ErrorContains(t, err, "pool")
	_, err = middleware.NewDedup(nil, nil)
	assert.ErrorContains(t, err, "Deduplicator")
}
