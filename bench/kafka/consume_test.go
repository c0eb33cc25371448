package kafkabench

import (
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/omnibus-go/omnibus/internal/testenv"
)

// BenchmarkConsumeInOrder consumes a topic of 8 partitions with each
// subscriber in turn, a fresh consumer group each time, acking every
// message at once, in order per partition: ours with MaxInFlight 1 (strict
// partition order, like watermill-kafka). 100,000 messages, so a pass
// (about a third of a second for ours) measures more than the start.
func BenchmarkConsumeInOrder(b *testing.B) {
	const n = 100000
	brokers := testenv.Kafka(b)
	b.StopTimer()
	topic := fillTopic(b, brokers, n)
	b.StartTimer()
	benchConsume(b, topic, n, 1, func(_ *message.Message, ack func()) { ack() })
}

// BenchmarkConsumeKeyedSlowHandler consumes with a handler that takes 1 ms,
// each message handled in its own goroutine (as Watermill's router does):
// ours runs different keys of a partition concurrently (MaxInFlight 64),
// watermill-kafka hands out one message per partition at a time.
func BenchmarkConsumeKeyedSlowHandler(b *testing.B) {
	const n = 10000
	brokers := testenv.Kafka(b)
	b.StopTimer()
	topic := fillTopic(b, brokers, n)
	b.StartTimer()
	benchConsume(b, topic, n, 64, func(_ *message.Message, ack func()) {
		go func() {
			time.Sleep(time.Millisecond) // the handler's work
			ack()
		}()
	})
}

func benchConsume(b *testing.B, topic string, n, maxInFlight int, handle func(*message.Message, func())) {
	brokers := testenv.Kafka(b)
	var oursRate, theirsRate float64
	for i := range b.N {
		runs := []struct {
			rate *float64
			sub  func() message.Subscriber
		}{
			{&oursRate, func() message.Subscriber { return newOurSubscriber(b, brokers, maxInFlight) }},
			{&theirsRate, func() message.Subscriber { return newTheirSubscriber(b, brokers) }},
		}
		if i%2 == 1 {
			runs[0], runs[1] = runs[1], runs[0]
		}
		for _, r := range runs {
			sub := r.sub()
			elapsed := consume(b, sub, topic, n, handle)
			*r.rate += float64(n) / elapsed.Seconds()
			b.StopTimer()
			_ = sub.Close()
			b.StartTimer()
		}
	}
	b.StopTimer()
	k := float64(b.N)
	b.ReportMetric(oursRate/k, "omnibus-msgs/s")
	b.ReportMetric(theirsRate/k, "watermill-msgs/s")
	b.ReportMetric(oursRate/theirsRate, "omnibus/watermill-x")
}
