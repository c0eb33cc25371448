package kafka_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/internal/testenv"
)

// TestSubscriber_ReadAheadIsBoundedAndResumes holds the first record of a
// partition unacked: the subscriber reads ahead up to MaxReadAheadBytes
// and then stops fetching the partition (kfake sees no fetch beyond what
// one response brought), instead of reading the whole backlog into memory.
// Once the record is acked fetching resumes and every record arrives, in
// order.
func TestSubscriber_ReadAheadIsBoundedAndResumes(t *testing.T) {
	t.Parallel()
	cluster := testenv.NewKafkaCluster(t)
	brokers := cluster.ListenAddrs()
	topic := testenv.KafkaTopic(t, brokers, 1)

	const n = 4000 // about 4.4 MB: more than a fetch response and the default read-ahead
	pub := newPublisher(t, testPublisherConfig(brokers))
	body := make([]byte, 1024)
	batch := make([]*message.Message, 0, 500)
	for range n {
		msg := message.NewMessage(watermill.NewUUID(), body)
		bus.SetPartitionKey(msg, "k")
		batch = append(batch, msg)
		if len(batch) == cap(batch) {
			require.NoError(t, pub.Publish(topic, batch...))
			batch = batch[:0]
		}
	}

	// The highest offset the consumer asked kfake for on this topic.
	var fetchedFrom atomic.Int64
	fetchedFrom.Store(-1)
	cluster.ControlKey(int16(kmsg.Fetch), func(req kmsg.Request) (kmsg.Response, error, bool) {
		cluster.KeepControl()
		for _, tp := range req.(*kmsg.FetchRequest).Topics {
			if tp.Topic != topic {
				continue
			}
			for _, p := range tp.Partitions {
				if p.FetchOffset > fetchedFrom.Load() {
					fetchedFrom.Store(p.FetchOffset)
				}
			}
		}
		return nil, nil, false
	})

	cfg := testSubscriberConfig(brokers, groupName(t))
	cfg.MaxInFlight = 1
	cfg.MaxReadAheadBytes = 32 << 10
	sub := newSubscriber(t, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	msgs, err := sub.Subscribe(ctx, topic)
	require.NoError(t, err)

	first := receive(t, msgs, 30*time.Second, "first record")
	time.Sleep(time.Second) // time for several fetches (FetchMaxWait is 100 ms) if fetching went on
	held := fetchedFrom.Load()
	assert.Less(t, held, int64(n/2),
		"with the first record unacked the subscriber must stop fetching after about one response, not read the backlog")

	first.Ack()
	want := int64(1)
	for want < n {
		msg := receive(t, msgs, 30*time.Second, "records after the first one is acked")
		d, ok := bus.DeliveryOf(msg)
		require.True(t, ok)
		require.Equal(t, want, d.Offset, "records of one key arrive in offset order")
		msg.Ack()
		want++
	}
	assert.Greater(t, fetchedFrom.Load(), held, "fetching resumed")
}
