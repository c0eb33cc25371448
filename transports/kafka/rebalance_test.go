package kafka_test

import (
	"context"
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
	"github.com/omnibus-go/omnibus/transports/kafka"
)

// TestSubscriber_RebalanceCancelsRevokedWork has a member hold one unacked
// message per partition, then starts a second member: the contexts of the
// messages whose partitions are revoked are cancelled, nothing is committed
// for them, and the new owner delivers them again. With cooperative-sticky
// only the moved partition is revoked; with range every partition is.
func TestSubscriber_RebalanceCancelsRevokedWork(t *testing.T) {
	t.Parallel()
	for _, strategy := range []string{"cooperative-sticky", "range"} {
		t.Run(strategy, func(t *testing.T) {
			t.Parallel()
			brokers := testenv.Kafka(t)
			topic := testenv.KafkaTopic(t, brokers, 2)
			group := groupName(t)

			// One message per partition, written straight to it.
			for p := int32(0); p < 2; p++ {
				produceTo(t, brokers, topic, p)
			}

			cfg := testSubscriberConfig(brokers, group)
			cfg.BalanceStrategy = strategy
			sub1 := newSubscriber(t, cfg)
			msgs1, err := sub1.Subscribe(context.Background(), topic)
			require.NoError(t, err)
			held := map[int32]*message.Message{}
			for len(held) < 2 {
				m := receive(t, msgs1, 30*time.Second, "first member")
				d, _ := bus.DeliveryOf(m)
				held[d.Partition] = m // not acked
			}

			sub2 := newSubscriber(t, cfg)
			msgs2, err := sub2.Subscribe(context.Background(), topic)
			require.NoError(t, err)
			var (
				mu   sync.Mutex
				got2 = map[int32]string{}
			)
			go func() {
				for m := range msgs2 {
					d, _ := bus.DeliveryOf(m)
					mu.Lock()
					got2[d.Partition] = m.UUID
					mu.Unlock()
					m.Ack()
				}
			}()
			// The first member keeps reading: with range it gets back the
			// partition it keeps, and delivers that record again.
			go func() {
				for m := range msgs1 {
					m.Ack()
				}
			}()

			testenv.Eventually(t, 30*time.Second, func() bool {
				mu.Lock()
				defer mu.Unlock()
				return len(got2) == 1
			}, "the second member is assigned a partition and delivers its record")
			mu.Lock()
			var moved int32
			for p, id := range got2 {
				moved = p
				assert.Equal(t, held[p].UUID, id, "the new owner delivers the record the old one held")
			}
			mu.Unlock()
			select {
			case <-held[moved].Context().Done():
			case <-time.After(10 * time.Second):
				t.Fatalf("the held message of revoked partition %d still has a live context", moved)
			}
			kept := 1 - moved
			if strategy == "cooperative-sticky" {
				select {
				case <-held[kept].Context().Done():
					t.Errorf("cooperative rebalance cancelled the message of partition %d, which did not move", kept)
				default:
				}
				require.True(t, held[kept].Ack())
			} else {
				<-held[kept].Context().Done() // eager: everything is revoked
			}
		})
	}
}

// produceTo writes one record straight to partition p and returns its UUID.
func produceTo(t testing.TB, brokers []string, topic string, p int32) string {
	t.Helper()
	sc := sarama.NewConfig()
	sc.Producer.Return.Successes = true
	sc.Producer.Partitioner = sarama.NewManualPartitioner
	prod, err := sarama.NewSyncProducer(brokers, sc)
	require.NoError(t, err)
	defer func() { _ = prod.Close() }()
	msg := message.NewMessage(watermill.NewUUID(), []byte("x"))
	pm, err := kafka.DefaultMarshaler{}.Marshal(topic, msg)
	require.NoError(t, err)
	pm.Partition = p
	_, _, err = prod.SendMessage(pm)
	require.NoError(t, err)
	return msg.UUID
}
