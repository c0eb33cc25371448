package bus

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A settled delivery's context carries the delivery and the parent's values,
// has no deadline, ends only when the transport settles it, and ends the
// contexts derived from it; it costs one allocation. (Not parallel:
// testing.AllocsPerRun refuses.)
func TestSettledContext_EndsWhenSettled(t *testing.T) {
	type key struct{}
	ctx := NewSettledContext(context.WithValue(context.Background(), key{}, "v"), Delivery{ID: "1-0", Attempts: 2})
	assert.Equal(t, "v", ctx.Value(key{}), "a value of the parent")
	_, has := ctx.Deadline()
	assert.False(t, has, "no deadline")
	assert.Contains(t, fmt.Sprint(ctx), "WithSettledDelivery(1-0)")

	msg := message.NewMessage(watermill.NewUUID(), nil)
	msg.SetContext(ctx)
	d, ok := DeliveryOf(msg)
	require.True(t, ok)
	assert.Equal(t, 2, d.Attempts)
	require.True(t, Settle(msg, Settlement{Class: ClassTransient, Error: "down"}))
	st, ok := SettlementFromContext(ctx)
	require.True(t, ok)
	assert.Equal(t, "down", st.Error)

	child, stop := context.WithTimeout(ctx, time.Hour)
	defer stop()
	ran := make(chan struct{})
	context.AfterFunc(ctx, func() { close(ran) })
	stopped := context.AfterFunc(ctx, func() { t.Error("a stopped AfterFunc ran") })
	require.True(t, stopped(), "stopping before the settlement")
	done := ctx.Done()
	assert.NoError(t, ctx.Err())
	select {
	case <-done:
		t.Fatal("done before it is settled")
	default:
	}

	ctx.Settle()
	ctx.Settle() // a second time does nothing
	for name, ch := range map[string]<-chan struct{}{"Done": done, "a derived context": child.Done(), "an AfterFunc": ran} {
		select {
		case <-ch:
		case <-time.After(5 * time.Second):
			t.Fatalf("%s did not end with the settlement", name)
		}
	}
	assert.ErrorIs(t, ctx.Err(), context.Canceled)
	assert.ErrorIs(t, child.Err(), context.Canceled)
	select {
	case <-ctx.Done(): // asked for after the settlement
	default:
		t.Fatal("Done asked for after the settlement is not closed")
	}
	late := make(chan struct{})
	context.AfterFunc(ctx, func() { close(late) })
	select {
	case <-late:
	case <-time.After(5 * time.Second):
		t.Fatal("an AfterFunc registered after the settlement did not run")
	}

	base := context.Background()
	var kept *SettledContext
	allocs := testing.AllocsPerRun(100, func() { kept = NewSettledContext(base, Delivery{ID: "1/1"}) })
	_ = kept
	assert.Equal(t, 1.0, allocs, "allocations per NewSettledContext")
}
