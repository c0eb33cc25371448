// Package brokerbench holds what the broker transports' benchmarks share:
// keyed 128-byte messages, concurrent single-message publishing, and a
// consumer with a 1 ms handler acked in a goroutine per message.
package brokerbench

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/omnibus-go/omnibus/bus"
)

const (
	// Goroutines publish concurrently, one message per Publish call.
	Goroutines = 64
	// Keys the messages are spread over.
	Keys = 1000
)

// Body is the payload of every message.
var Body = []byte(`{"order":"order-0000","amount":4200,"currency":"EUR","note":"a payload of about 128 bytes, as the other benchmarks use"}`)

// Keyed is message i, keyed "key-<i mod Keys>".
func Keyed(i int) *message.Message {
	msg := message.NewMessage(watermill.NewUUID(), Body)
	bus.SetPartitionKey(msg, fmt.Sprintf("key-%d", i%Keys))
	return msg
}

// PublishConcurrently publishes n messages from Goroutines goroutines, one
// per Publish call, and returns how long it took.
func PublishConcurrently(b *testing.B, pub message.Publisher, topic string, n int) time.Duration {
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range Goroutines {
		wg.Go(func() {
			for i := next.Add(1); i <= int64(n); i = next.Add(1) {
				if err := pub.Publish(topic, Keyed(int(i))); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	return time.Since(start)
}

// Consume reads n messages from sub, each handled for 1 ms and acked in a
// goroutine of its own, as a Watermill router does; it closes sub and
// returns how long the n took.
func Consume(b *testing.B, sub message.Subscriber, topic string, n int) time.Duration {
	msgs, err := sub.Subscribe(context.Background(), topic)
	if err != nil {
		b.Fatal(err)
	}
	var done sync.WaitGroup
	done.Add(n)
	start := time.Now()
	go func() {
		for msg := range msgs {
			go func() {
				time.Sleep(time.Millisecond)
				msg.Ack()
				done.Done()
			}()
		}
	}()
	done.Wait()
	elapsed := time.Since(start)
	_ = sub.Close()
	return elapsed
}
