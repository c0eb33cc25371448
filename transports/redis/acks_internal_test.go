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

	ours := func(id string) bool { return sub.ours([]string{id})[0] }

	sub.held["1-0"] = &entry{id: "1-0"}
	assert.True(t, ours("1-0"), "a held entry")
	assert.False(t, ours("9-0"), "an entry never seen")
	assert.Equal(t, []bool{true, false}, sub.ours([]string{"1-0", "9-0"}), "several at once")

	sub.ack("2-0")
	assert.True(t, ours("2-0"), "acked, queued for its XACK")
	ids := sub.takeAcks()
	assert.True(t, ours("2-0"), "acked, its XACK on its way")
	sub.ackConfirmed(ids)
	assert.False(t, ours("2-0"), "XACK answered with no reclaim running")

	sub.ack("3-0")
	ids = sub.takeAcks()
	ends := sub.reclaimBegins()
	sub.ackConfirmed(ids)
	assert.True(t, ours("3-0"), "XACK answered while a reclaim runs that may have returned it")
	ends()
	assert.False(t, ours("3-0"), "after that reclaim")
	assert.Empty(t, sub.unconfirmedAcks(), "nothing kept once every XACK is answered and no reclaim runs")
}
