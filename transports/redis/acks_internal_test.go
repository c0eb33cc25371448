package redis

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omnibus-go/omnibus/internal/testenv"
)

// A reclaim may run in Redis before an XACK that is on its way and return
// the acked entry as idle. The subscription knows the entry as its own
// until its XACK is answered, and, when the answer comes while a reclaim
// runs, until that reclaim ends: a reclaim that begins after the answer
// cannot return it.
func TestAcked_AnEntryIsOursUntilAReclaimCanNoLongerReturnIt(t *testing.T) {
	t.Parallel()
	s, err := NewSubscriber(SubscriberConfig{Client: testenv.Redis(t), ConsumerGroup: "g"}, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	sub := newSubscription(context.Background(), s, "orders", "orders")
	t.Cleanup(sub.cancel)

	sub.held["1-0"] = &entry{id: "1-0"}
	assert.True(t, sub.ours("1-0"), "a held entry")
	assert.False(t, sub.ours("9-0"), "an entry never seen")

	sub.ack("2-0")
	assert.True(t, sub.ours("2-0"), "acked, its XACK not answered")
	sub.ackConfirmed([]string{"2-0"})
	assert.False(t, sub.ours("2-0"), "XACK answered with no reclaim running")

	sub.ack("3-0")
	ends := sub.reclaimBegins()
	sub.ackConfirmed([]string{"3-0"})
	assert.True(t, sub.ours("3-0"), "XACK answered while a reclaim runs that may have returned it")
	ends()
	assert.False(t, sub.ours("3-0"), "after that reclaim")
	assert.Empty(t, sub.acked, "nothing kept once every XACK is answered and no reclaim runs")
}
