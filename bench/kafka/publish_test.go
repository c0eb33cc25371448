package kafkabench

import (
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/omnibus-go/omnibus/internal/testenv"
)

// publishPerOp is how many messages one iteration publishes, per
// implementation.
const publishPerOp = 20000

// BenchmarkPublish publishes publishPerOp keyed messages of payloadBytes from
// 64 goroutines, one message per Publish call, with each publisher in turn,
// each to a fresh topic of 8 partitions.
func BenchmarkPublish(b *testing.B) { benchPublish(b, 1) }

// BenchmarkPublishBatch is BenchmarkPublish with 50 messages per Publish
// call (the shape of a relay that publishes a fetched batch at once).
// watermill-kafka sends the messages of a call one after another, each
// waiting for its acknowledgement; ours sends them together.
func BenchmarkPublishBatch(b *testing.B) { benchPublish(b, 50) }

func benchPublish(b *testing.B, perCall int) {
	brokers := testenv.Kafka(b)
	body := payload()
	ours := newOurPublisher(b, brokers)
	theirs := newTheirPublisher(b, brokers)

	var oursRate, theirsRate float64
	b.ResetTimer()
	for i := range b.N {
		runs := []struct {
			rate *float64
			pub  message.Publisher
			name string
		}{{&oursRate, ours, "omnibus"}, {&theirsRate, theirs, "watermill"}}
		if i%2 == 1 {
			runs[0], runs[1] = runs[1], runs[0]
		}
		for _, r := range runs {
			b.StopTimer()
			topic := testenv.KafkaTopic(b, brokers, partitions)
			b.StartTimer()
			elapsed := publishConcurrently(b, r.pub, topic, publishPerOp, perCall, body)
			*r.rate += publishPerOp / elapsed.Seconds()
			if n := recordsIn(b, brokers, topic); n != publishPerOp {
				b.Fatalf("%s: topic holds %d records, want %d", r.name, n, publishPerOp)
			}
		}
	}
	b.StopTimer()
	n := float64(b.N)
	b.ReportMetric(oursRate/n, "omnibus-msgs/s")
	b.ReportMetric(theirsRate/n, "watermill-msgs/s")
	b.ReportMetric(oursRate/theirsRate, "omnibus/watermill-x")
}
