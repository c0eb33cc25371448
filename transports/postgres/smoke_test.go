package postgres

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestSubscriber_DeliversInOrderPerKey(t *testing.T) {
	t.Parallel()
	pool, ob := newOutbox(t)
	enqueue(t, pool, ob, "orders", event("k1", "a"), event("k1", "b"), event("k2", "c"), event("", "d"))
	sub, err := NewSubscriber(pool, SubscriberConfig{Table: ob.Table()}, nil)
	require.NoError(t, err)
	defer sub.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ch, err := sub.Subscribe(ctx, AllTopics)
	require.NoError(t, err)
	got := map[string]bool{}
	var k1 []string
	for len(got) < 4 {
		select {
		case m := <-ch:
			got[string(m.Payload)] = true
			if m.Metadata.Get("partition_key") == "k1" {
				k1 = append(k1, string(m.Payload))
			}
			m.Ack()
		case <-ctx.Done():
			t.Fatalf("got only %v", got)
		}
	}
	require.Equal(t, []string{"a", "b"}, k1)
	require.NoError(t, sub.Close())
	var completed int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+ob.q.table.quoted()+` WHERE status='completed'`).Scan(&completed))
	require.Equal(t, 4, completed)
}
