package redisbench

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/omnibus-go/omnibus/bench/internal/rounds"
	"github.com/omnibus-go/omnibus/bus"
	omniredis "github.com/omnibus-go/omnibus/transports/redis"
)

const (
	// shards of every sharded topic of these benchmarks.
	shards = 8
	// shardLease of their consumers.
	shardLease = time.Second
	// shardKeys is how many partition keys messages are spread over.
	shardKeys = 1000
)

// BenchmarkShardedConsume measures scaling out: shardedMessages messages
// published at once into a topic of 8 shards, consumed by 1, 2 and 4
// consumers of one group, each handling its messages one at a time (as a
// Watermill router's handler does) for 1 ms each. Timing starts once the
// consumers have split the shards. It reports each rate and
// 4-consumers/1-consumer-x (target: at least 3).
func BenchmarkShardedConsume(b *testing.B) {
	const shardedMessages = 3000
	admin := newClient(b)
	body := payload()
	rates := map[int]float64{}
	b.ResetTimer()
	for range b.N {
		for _, consumers := range []int{1, 2, 4} {
			b.StopTimer()
			prefix := streamName(b, admin, "shards") + ":"
			pub := shardedPublisher(b, admin, prefix)
			subs := make([]message.Subscriber, consumers)
			var handled atomic.Int64
			var wg sync.WaitGroup
			for i := range subs {
				subs[i] = shardedSubscriber(b, newClient(b), prefix)
				msgs, err := subs[i].Subscribe(context.Background(), "orders")
				if err != nil {
					b.Fatal(err)
				}
				wg.Go(func() {
					for msg := range msgs {
						time.Sleep(time.Millisecond)
						msg.Ack()
						handled.Add(1)
					}
				})
			}
			waitForOwners(b, admin, prefix+"orders", consumers)
			b.StartTimer()
			start := time.Now()
			publishKeyed(b, pub, "orders", shardedMessages, body)
			for handled.Load() < shardedMessages {
				time.Sleep(time.Millisecond)
			}
			rates[consumers] += shardedMessages / time.Since(start).Seconds()
			b.StopTimer()
			for _, s := range subs {
				_ = s.Close()
			}
			wg.Wait()
			_ = pub.Close()
			deleteShards(admin, prefix+"orders")
			b.StartTimer()
		}
	}
	b.StopTimer()
	n := float64(b.N)
	for _, c := range []int{1, 2, 4} {
		b.ReportMetric(rates[c]/n, fmt.Sprintf("%d-consumers-msgs/s", c))
	}
	b.ReportMetric(rates[4]/rates[1], "4/1-consumers-x")
}

// BenchmarkShardingCost is what sharding costs one consumer: messagesPerOp
// messages published beforehand, consumed by one subscriber that acks each
// at once, from a topic of 8 shards and from one stream (shards: 1), five
// times each in alternation per iteration. It reports the medians and
// sharded/single-% of the medians (target: at least 90).
func BenchmarkShardingCost(b *testing.B) {
	admin := newClient(b)
	body := payload()
	var sharded, single []float64
	b.ResetTimer()
	for i := range b.N {
		for j := range 10 {
			count := 1
			if (i+j)%2 == 0 {
				count = shards
			}
			b.StopTimer()
			prefix := streamName(b, admin, "cost") + ":"
			pub, err := omniredis.NewPublisher(omniredis.PublisherConfig{Client: admin, StreamPrefix: prefix, Shards: count}, nil)
			if err != nil {
				b.Fatal(err)
			}
			publishKeyed(b, pub, "orders", messagesPerOp, body)
			_ = pub.Close()
			sub, err := omniredis.NewSubscriber(omniredis.SubscriberConfig{
				Client: newClient(b), StreamPrefix: prefix, ConsumerGroup: "bench", OrderByKey: true,
				Shards: count, ShardLease: shardLease,
			}, nil)
			if err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
			rate := messagesPerOp / consume(b, fmt.Sprintf("%d shards", count), sub, "orders").Seconds()
			b.StopTimer()
			_ = sub.Close()
			deleteShards(admin, prefix+"orders")
			b.StartTimer()
			if count == 1 {
				single = append(single, rate)
			} else {
				sharded = append(sharded, rate)
			}
		}
	}
	b.StopTimer()
	b.ReportMetric(rounds.Median(sharded), "sharded-msgs/s")
	b.ReportMetric(rounds.Median(single), "single-msgs/s")
	b.ReportMetric(100*rounds.Median(sharded)/rounds.Median(single), "sharded/single-%")
}

// BenchmarkShardTakeover is the time from a consumer's death (its client
// closed: it neither renews nor gives anything back) to its shards flowing
// again through the other consumer of the group, with a lease of 1 s. It
// reports takeover-s and takeover/lease-x (target: at most 2).
func BenchmarkShardTakeover(b *testing.B) {
	admin := newClient(b)
	body := payload()
	var total time.Duration
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		prefix := streamName(b, admin, "takeover") + ":"
		pub := shardedPublisher(b, admin, prefix)
		survivor := shardedSubscriber(b, newClient(b), prefix)
		victimClient := redis.NewClient(&redis.Options{Addr: redisAddr()})
		victim := shardedSubscriber(b, victimClient, prefix)
		got := make(chan struct{}, 1)
		var wantUUID atomic.Value
		wantUUID.Store("")
		for _, s := range []message.Subscriber{survivor, victim} {
			msgs, err := s.Subscribe(context.Background(), "orders")
			if err != nil {
				b.Fatal(err)
			}
			go func() {
				for msg := range msgs {
					if msg.UUID == wantUUID.Load().(string) {
						got <- struct{}{}
					}
					msg.Ack()
				}
			}()
		}
		waitForOwners(b, admin, prefix+"orders", 2)
		// A key of one of the victim's shards.
		st, err := omniredis.ShardStatus(context.Background(), admin, prefix+"orders", "bench")
		if err != nil {
			b.Fatal(err)
		}
		key := ""
		for k := 0; key == "" && k < 10000; k++ {
			candidate := fmt.Sprintf("key-%d", k)
			if st[bus.ShardOf(candidate, shards)].Owner == victim.(*omniredis.Subscriber).Consumer() {
				key = candidate
			}
		}
		b.StartTimer()
		start := time.Now()
		_ = victimClient.Close() // dead: no renewal, no give-back
		msg := message.NewMessage(watermill.NewUUID(), body)
		bus.SetPartitionKey(msg, key)
		wantUUID.Store(msg.UUID)
		if err := pub.Publish("orders", msg); err != nil {
			b.Fatal(err)
		}
		select {
		case <-got:
		case <-time.After(30 * time.Second):
			b.Fatal("the dead consumer's shard did not flow again within 30 s")
		}
		total += time.Since(start)
		b.StopTimer()
		_ = survivor.Close()
		_ = victim.Close()
		_ = pub.Close()
		deleteShards(admin, prefix+"orders")
		b.StartTimer()
	}
	b.StopTimer()
	mean := total / time.Duration(b.N)
	b.ReportMetric(mean.Seconds(), "takeover-s")
	b.ReportMetric(mean.Seconds()/shardLease.Seconds(), "takeover/lease-x")
}

func shardedPublisher(b *testing.B, c *redis.Client, prefix string) *omniredis.Publisher {
	pub, err := omniredis.NewPublisher(omniredis.PublisherConfig{Client: c, StreamPrefix: prefix, Shards: shards}, nil)
	if err != nil {
		b.Fatal(err)
	}
	return pub
}

func shardedSubscriber(b *testing.B, c *redis.Client, prefix string) message.Subscriber {
	sub, err := omniredis.NewSubscriber(omniredis.SubscriberConfig{
		Client: c, StreamPrefix: prefix, ConsumerGroup: "bench", OrderByKey: true,
		Shards: shards, ShardLease: shardLease,
	}, nil)
	if err != nil {
		b.Fatal(err)
	}
	return sub
}

// publishKeyed publishes n messages over shardKeys keys, in calls of 500.
func publishKeyed(b *testing.B, pub message.Publisher, topic string, n int, body []byte) {
	for done := 0; done < n; done += 500 {
		msgs := make([]*message.Message, 0, 500)
		for i := done; i < min(done+500, n); i++ {
			msg := message.NewMessage(watermill.NewUUID(), body)
			bus.SetPartitionKey(msg, fmt.Sprintf("key-%d", i%shardKeys))
			msgs = append(msgs, msg)
		}
		if err := pub.Publish(topic, msgs...); err != nil {
			b.Fatal(err)
		}
	}
}

// waitForOwners waits until every shard of stream is owned and consumers
// distinct consumers own them.
func waitForOwners(b *testing.B, admin *redis.Client, stream string, consumers int) {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		st, err := omniredis.ShardStatus(context.Background(), admin, stream, "bench")
		if err != nil {
			b.Fatal(err)
		}
		owners := map[string]bool{}
		for _, s := range st {
			if s.Owner != "" {
				owners[s.Owner] = true
			}
		}
		if len(st) == shards && len(owners) == consumers && ownedAll(st) {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	b.Fatalf("the %d consumers did not split the %d shards of %s within 30 s", consumers, shards, stream)
}

func ownedAll(st []bus.ShardStatus) bool {
	for _, s := range st {
		if s.Owner == "" {
			return false
		}
	}
	return true
}

// deleteShards deletes a sharded topic's keys (streams, count, leases).
func deleteShards(admin *redis.Client, stream string) {
	ctx := context.Background()
	iter := admin.Scan(ctx, 0, stream+"*", 1000).Iterator()
	for iter.Next(ctx) {
		_ = admin.Unlink(ctx, iter.Val()).Err()
	}
}
