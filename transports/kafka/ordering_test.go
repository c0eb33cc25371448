package kafka_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/internal/testenv"
)

// TestSubscriber_KeyOrderWithRandomNacksAndConcurrency publishes 50 keys ×
// 200 messages over 4 partitions and consumes them with several records of
// a partition in flight at once, nacking at random (plain nacks, counted
// settlements and transient ones). Per key, deliveries never go backwards
// (so first deliveries follow publish order), every message is acked in
// the end, and Delivery.Attempts counts exactly the counted failures.
func TestSubscriber_KeyOrderWithRandomNacksAndConcurrency(t *testing.T) {
	t.Parallel()
	const (
		keys       = 50
		perKey     = 200
		total      = keys * perKey
		partitions = 4
	)
	brokers := testenv.Kafka(t)
	topic := testenv.KafkaTopic(t, brokers, partitions)

	pub := newPublisher(t, testPublisherConfig(brokers))
	// Interleave keys in publish order: batch b holds message b of every key.
	for seq := 0; seq < perKey; seq++ {
		batch := make([]*message.Message, 0, keys)
		for k := 0; k < keys; k++ {
			msg := message.NewMessage(watermill.NewUUID(), []byte(strconv.Itoa(seq)))
			bus.SetPartitionKey(msg, fmt.Sprintf("key-%02d", k))
			batch = append(batch, msg)
		}
		require.NoError(t, pub.Publish(topic, batch...))
	}

	cfg := testSubscriberConfig(brokers, groupName(t))
	cfg.MaxInFlight = 16
	sub := newSubscriber(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	msgs, err := sub.Subscribe(ctx, topic)
	require.NoError(t, err)

	type state struct {
		lastSeq       int // highest seq delivered so far
		firstSeqs     []int
		seen          map[int]bool
		counted       map[int]int // counted nacks per seq
		badAttempts   []string
		wentBackwards []string
	}
	var (
		mu          sync.Mutex
		byKey       = map[string]*state{}
		acked       = map[string]bool{}
		inFlight    = map[int32]int{}
		maxInFlight = map[int32]int{}
		allAcked    = make(chan struct{})
	)
	settle := func(msg *message.Message, key string, seq int, d bus.Delivery) {
		mu.Lock()
		defer mu.Unlock()
		st := byKey[key]
		inFlight[d.Partition]--
		switch r := rand.IntN(10); {
		case r == 0: // plain nack: counted, redelivered after NackDelay
			st.counted[seq]++
			msg.Nack()
		case r == 1: // counted settlement with an explicit retry time
			st.counted[seq]++
			bus.Settle(msg, bus.Settlement{Class: bus.ClassCounted, RetryAt: time.Now().Add(5 * time.Millisecond), Error: "try later"})
			msg.Nack()
		case r == 2: // transient: no attempt spent
			bus.Settle(msg, bus.Settlement{Class: bus.ClassTransient, Error: "broker down"})
			msg.Nack()
		default:
			if !acked[msg.UUID] {
				acked[msg.UUID] = true
				if len(acked) == total {
					close(allAcked)
				}
			}
			msg.Ack()
		}
	}

	// The reader holds up to 8 messages before settling them in random
	// order, so several records of a partition are in flight together.
	go func() {
		var held []*message.Message
		flush := func() {
			rand.Shuffle(len(held), func(i, j int) { held[i], held[j] = held[j], held[i] })
			for _, m := range held {
				d, _ := bus.DeliveryOf(m)
				seq, _ := strconv.Atoi(string(m.Payload))
				settle(m, bus.PartitionKey(m), seq, d)
			}
			held = held[:0]
		}
		for {
			select {
			case m, ok := <-msgs:
				if !ok {
					return
				}
				d, ok := bus.DeliveryOf(m)
				if !ok {
					t.Errorf("message %s has no Delivery in its context", m.UUID)
					return
				}
				key := bus.PartitionKey(m)
				seq, _ := strconv.Atoi(string(m.Payload))
				mu.Lock()
				st := byKey[key]
				if st == nil {
					st = &state{lastSeq: -1, seen: map[int]bool{}, counted: map[int]int{}}
					byKey[key] = st
				}
				if seq < st.lastSeq {
					st.wentBackwards = append(st.wentBackwards, fmt.Sprintf("%d after %d", seq, st.lastSeq))
				}
				st.lastSeq = max(st.lastSeq, seq)
				if !st.seen[seq] {
					st.seen[seq] = true
					st.firstSeqs = append(st.firstSeqs, seq)
				}
				if d.Attempts != st.counted[seq] {
					st.badAttempts = append(st.badAttempts, fmt.Sprintf("seq %d: Attempts %d, counted failures %d", seq, d.Attempts, st.counted[seq]))
				}
				inFlight[d.Partition]++
				maxInFlight[d.Partition] = max(maxInFlight[d.Partition], inFlight[d.Partition])
				mu.Unlock()
				held = append(held, m)
				if len(held) >= 8 {
					flush()
				}
			case <-time.After(5 * time.Millisecond):
				flush() // nothing more arrives for now: settle what is held
			}
		}
	}()

	select {
	case <-allAcked:
	case <-ctx.Done():
		mu.Lock()
		n := len(acked)
		mu.Unlock()
		t.Fatalf("only %d of %d messages acked before the deadline", n, total)
	}
	require.NoError(t, sub.Close())

	mu.Lock()
	defer mu.Unlock()
	require.Len(t, byKey, keys)
	want := make([]int, perKey)
	for i := range want {
		want[i] = i
	}
	for key, st := range byKey {
		assert.Empty(t, st.wentBackwards, "key %s was delivered out of order", key)
		assert.Equal(t, want, st.firstSeqs, "first deliveries of key %s are not in publish order", key)
		assert.Empty(t, st.badAttempts, "key %s: Delivery.Attempts does not count the counted failures", key)
	}
	concurrent := false
	for _, n := range maxInFlight {
		concurrent = concurrent || n > 1
	}
	assert.True(t, concurrent, "no partition ever had more than one message in flight: %v", maxInFlight)
}
