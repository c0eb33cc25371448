package kafkabench

import (
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/omnibus-go/omnibus/bench/internal/rounds"
	"github.com/omnibus-go/omnibus/internal/testenv"
)

// BenchmarkPublish publishes 20,000 keyed messages of payloadBytes from 64
// goroutines, one message per Publish call (the outbox relay's shape), with
// each publisher in turn, each to a fresh topic of 8 partitions. With 64
// messages outstanding at any time this measures the broker's round trip
// more than the client; franz-go's figure shows what any client gets.
func BenchmarkPublish(b *testing.B) { benchPublish(b, 1, 20000) }

// BenchmarkPublishBatch is BenchmarkPublish with 50 messages per Publish
// call and 100,000 messages per publisher (a call of ours takes a few
// milliseconds, so fewer would measure mostly the start). watermill-kafka
// sends the messages of a call one after another, each waiting for its
// acknowledgement; ours sends them together and waits once.
func BenchmarkPublishBatch(b *testing.B) { benchPublish(b, 50, 100000) }

// benchPublish publishes perOp messages per round with each publisher,
// perCall per Publish call; each metric is the median of rounds.N rounds per
// iteration.
func benchPublish(b *testing.B, perCall, perOp int) {
	brokers := testenv.Kafka(b)
	body := payload()
	runs := []struct {
		pub  message.Publisher
		name string
	}{
		{pub: newOurPublisher(b, brokers), name: "omnibus"},
		{pub: newTheirPublisher(b, brokers), name: "watermill"},
		// Not a competitor: franz-go's client (pipelined, idempotent) in
		// the same shape shows what the broker allows any client.
		{pub: newFranzPublisher(b, brokers), name: "franz-go"},
	}

	var m rounds.Medians
	b.ResetTimer()
	for i := range b.N * rounds.N {
		rate := map[string]float64{}
		for j := range runs {
			r := &runs[(i+j)%len(runs)] // rotate which goes first
			b.StopTimer()
			topic := testenv.KafkaTopic(b, brokers, partitions)
			b.StartTimer()
			elapsed := publishConcurrently(b, r.pub, topic, perOp, perCall, body)
			rate[r.name] = float64(perOp) / elapsed.Seconds()
			if n := recordsIn(b, brokers, topic); n != int64(perOp) {
				b.Fatalf("%s: topic holds %d records, want %d", r.name, n, perOp)
			}
		}
		m.Add("omnibus-msgs/s", rate["omnibus"])
		m.Add("watermill-msgs/s", rate["watermill"])
		m.Add("omnibus/watermill-x", rate["omnibus"]/rate["watermill"])
		m.Add("franz-go-msgs/s", rate["franz-go"])
		m.Add("franz-go/watermill-x", rate["franz-go"]/rate["watermill"])
	}
	b.StopTimer()
	m.Report(b)
}
