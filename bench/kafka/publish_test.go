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
	runs := []struct {
		pub  message.Publisher
		name string
		rate float64
	}{
		{pub: newOurPublisher(b, brokers), name: "omnibus"},
		{pub: newTheirPublisher(b, brokers), name: "watermill"},
		// Not a competitor: franz-go's client (pipelined, idempotent) in
		// the same shape shows what the broker allows any client.
		{pub: newFranzPublisher(b, brokers), name: "franz-go"},
	}

	b.ResetTimer()
	for i := range b.N {
		for j := range runs {
			r := &runs[(i+j)%len(runs)] // rotate which goes first
			b.StopTimer()
			topic := testenv.KafkaTopic(b, brokers, partitions)
			b.StartTimer()
			elapsed := publishConcurrently(b, r.pub, topic, publishPerOp, perCall, body)
			r.rate += publishPerOp / elapsed.Seconds()
			if n := recordsIn(b, brokers, topic); n != publishPerOp {
				b.Fatalf("%s: topic holds %d records, want %d", r.name, n, publishPerOp)
			}
		}
	}
	b.StopTimer()
	n := float64(b.N)
	ours, theirs, franz := runs[0].rate, runs[1].rate, runs[2].rate
	b.ReportMetric(ours/n, "omnibus-msgs/s")
	b.ReportMetric(theirs/n, "watermill-msgs/s")
	b.ReportMetric(ours/theirs, "omnibus/watermill-x")
	b.ReportMetric(franz/n, "franz-go-msgs/s")
	b.ReportMetric(franz/theirs, "franz-go/watermill-x")
}
