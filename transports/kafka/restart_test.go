package kafka_test

import (
	"context"
	"fmt"
	"maps"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/internal/testenv"
)

// TestSubscriber_RestartResumesAtFirstUnackedOffset stops a consumer that
// holds some messages unacked (and has acked records after them) and starts
// another one in the same group: the committed offset of each partition is
// its first unacked record, the new consumer starts there, delivers every
// message the first one did not ack, and nothing the first one acked.
func TestSubscriber_RestartResumesAtFirstUnackedOffset(t *testing.T) {
	t.Parallel()
	const (
		keys       = 20
		perKey     = 20
		total      = keys * perKey
		heldSeq    = 5 // seq 5 of keys 0..2 is never acked by the first consumer
		heldKeys   = 3
		partitions = 3
	)
	brokers := testenv.Kafka(t)
	topic := testenv.KafkaTopic(t, brokers, partitions)
	group := groupName(t)

	pub := newPublisher(t, testPublisherConfig(brokers))
	all := map[string]string{} // uuid -> "key/seq"
	for seq := 0; seq < perKey; seq++ {
		var batch []*message.Message
		for k := 0; k < keys; k++ {
			msg := message.NewMessage(watermill.NewUUID(), []byte(strconv.Itoa(seq)))
			bus.SetPartitionKey(msg, fmt.Sprintf("key-%02d", k))
			batch = append(batch, msg)
			all[msg.UUID] = fmt.Sprintf("key-%02d/%d", k, seq)
		}
		require.NoError(t, pub.Publish(topic, batch...))
	}
	isHeld := func(m *message.Message) bool {
		seq, _ := strconv.Atoi(string(m.Payload))
		var k int
		_, _ = fmt.Sscanf(bus.PartitionKey(m), "key-%d", &k)
		return k < heldKeys && seq == heldSeq
	}

	// First consumer: ack everything except the held messages, which also
	// block the later messages of their keys.
	sub1 := newSubscriber(t, testSubscriberConfig(brokers, group))
	msgs1, err := sub1.Subscribe(context.Background(), topic)
	require.NoError(t, err)
	acked1 := map[string]bool{}
	var held []*message.Message
	firstUnacked := map[int32]int64{}
	wantAcked := total - heldKeys*(perKey-heldSeq)
	for len(acked1) < wantAcked || len(held) < heldKeys {
		m := receive(t, msgs1, 30*time.Second, fmt.Sprintf("first consumer (%d acked, %d held)", len(acked1), len(held)))
		if isHeld(m) {
			d, _ := bus.DeliveryOf(m)
			held = append(held, m)
			if off, ok := firstUnacked[d.Partition]; !ok || d.Offset < off {
				firstUnacked[d.Partition] = d.Offset
			}
			continue
		}
		acked1[m.UUID] = true
		m.Ack()
	}
	require.NoError(t, sub1.Close())
	for _, m := range held {
		select {
		case <-m.Context().Done():
		default:
			t.Errorf("held message %s: context not cancelled by Close", m.UUID)
		}
	}

	// The committed offsets stop at the first unacked record.
	admin, err := sarama.NewClusterAdmin(brokers, sarama.NewConfig())
	require.NoError(t, err)
	defer func() { _ = admin.Close() }()
	client, err := sarama.NewClient(brokers, sarama.NewConfig())
	require.NoError(t, err)
	defer func() { _ = client.Close() }()
	end := map[int32]int64{}
	wantCommitted := map[int32]int64{}
	for p := int32(0); p < partitions; p++ {
		end[p], err = client.GetOffset(topic, p, sarama.OffsetNewest)
		require.NoError(t, err)
		wantCommitted[p] = end[p]
		if off, ok := firstUnacked[p]; ok {
			wantCommitted[p] = off
		}
	}
	assert.Equal(t, wantCommitted, committedOffsets(t, admin, group, topic, partitions),
		"committed offsets after the first consumer stopped")

	// Second consumer: starts at the first unacked offset and delivers
	// exactly what the first one did not ack.
	want := map[string]bool{}
	for id := range all {
		if !acked1[id] {
			want[id] = true
		}
	}
	require.Len(t, want, heldKeys*(perKey-heldSeq))

	sub2 := newSubscriber(t, testSubscriberConfig(brokers, group))
	msgs2, err := sub2.Subscribe(context.Background(), topic)
	require.NoError(t, err)
	var (
		mu        sync.Mutex
		got2      = map[string]int{}
		firstOff2 = map[int32]int64{}
		done      = make(chan struct{})
	)
	go func() {
		defer close(done)
		for m := range msgs2 {
			d, _ := bus.DeliveryOf(m)
			mu.Lock()
			got2[m.UUID]++
			if off, ok := firstOff2[d.Partition]; !ok || d.Offset < off {
				firstOff2[d.Partition] = d.Offset // lowest offset delivered
			}
			mu.Unlock()
			m.Ack()
		}
	}()
	testenv.Eventually(t, 30*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		for id := range want {
			if got2[id] == 0 {
				return false
			}
		}
		return true
	}, "the second consumer delivers every message the first did not ack")
	// Once everything is committed, the second consumer has read (and
	// delivered or skipped) every record.
	testenv.Eventually(t, 30*time.Second, func() bool {
		return maps.Equal(end, committedOffsets(t, admin, group, topic, partitions))
	}, "the group commits every partition to its end")
	require.NoError(t, sub2.Close())
	<-done

	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, firstUnacked, firstOff2, "the second consumer starts each partition at its first unacked offset")
	for id, n := range got2 {
		assert.True(t, want[id], "message %s (%s) was acked by the first consumer and delivered again", id, all[id])
		assert.Equal(t, 1, n, "message %s (%s) delivered %d times by the second consumer", id, all[id], n)
	}
	for id := range all {
		assert.True(t, acked1[id] || got2[id] > 0, "message %s (%s) was lost", id, all[id])
	}
}

func committedOffsets(t testing.TB, admin sarama.ClusterAdmin, group, topic string, partitions int32) map[int32]int64 {
	t.Helper()
	ps := make([]int32, partitions)
	for i := range ps {
		ps[i] = int32(i)
	}
	resp, err := admin.ListConsumerGroupOffsets(group, map[string][]int32{topic: ps})
	require.NoError(t, err)
	out := map[int32]int64{}
	for _, p := range ps {
		if b := resp.GetBlock(topic, p); b != nil {
			out[p] = b.Offset
		}
	}
	return out
}
