package bus_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/omnibus-go/omnibus/bus"
)

func TestRedelivery_FromTheSettlement(t *testing.T) {
	t.Parallel()
	at := time.Now().Add(time.Hour)
	for _, c := range []struct {
		name    string
		st      bus.Settlement
		ok      bool
		giveUp  bool
		due     time.Time // zero: after the nack delay
		counted bool
	}{
		{"no settlement", bus.Settlement{}, false, false, time.Time{}, true},
		{"transient, no time", bus.Settlement{Class: bus.ClassTransient}, true, false, time.Time{}, false},
		{"counted at a time", bus.Settlement{Class: bus.ClassCounted, RetryAt: at}, true, false, at, true},
		{"given up", bus.Settlement{Class: bus.ClassPermanent, GiveUp: true}, true, true, time.Time{}, true},
		{"give up without ok is ignored", bus.Settlement{GiveUp: true}, false, false, time.Time{}, true},
	} {
		before := time.Now()
		r := bus.RedeliveryFor(c.st, c.ok, time.Minute)
		assert.Equal(t, c.giveUp, r.GiveUp, c.name)
		assert.Equal(t, c.counted, r.Counted, c.name)
		if c.due.IsZero() {
			assert.WithinRange(t, r.Due, before.Add(time.Minute), time.Now().Add(time.Minute), c.name)
		} else {
			assert.Equal(t, c.due, r.Due, c.name)
		}
	}
	ctx := bus.WithDelivery(context.Background(), bus.Delivery{})
	assert.True(t, bus.RedeliveryOf(ctx, time.Second).Counted, "nothing settled: counted")
}
