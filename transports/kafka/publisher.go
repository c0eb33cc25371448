package kafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/omnibus-go/omnibus/bus"
)

// Publisher publishes messages to Kafka through one shared sarama
// AsyncProducer. Records of concurrent Publish calls are batched together
// (see PublisherConfig.Linger and BatchBytes); each Publish returns when the
// brokers have acknowledged all of its own messages, or with the first error.
// Messages of one Publish call that share a key are written in the order
// given (the producer is idempotent by default, so retries keep that order).
//
// Errors are classified for bus.ClassOf, per error: network failures and
// the cluster's state (no leader, not enough replicas, timeouts, throttling,
// authorization) are transient, so a relay spends no attempts on them; a
// batch the broker rejects for what it carries (too large, invalid or
// corrupt record, policy violation) is counted, so a record the broker keeps
// rejecting reaches its attempt budget; a message the Subscriber could not
// decode, a record above MaxMessageBytes and an invalid topic name are
// permanent.
//
// A Publisher is safe for concurrent use.
type Publisher struct {
	cfg       PublisherConfig
	log       *slog.Logger
	client    sarama.Client
	ownClient bool
	producer  sarama.AsyncProducer

	mu     sync.RWMutex // shared while feeding the producer, exclusive in Close
	closed bool

	drained   sync.WaitGroup
	closeOnce sync.Once
	closeErr  error
}

var _ message.Publisher = (*Publisher)(nil)

// NewPublisher connects to the brokers and returns a Publisher. A nil
// logger means no logging.
func NewPublisher(cfg PublisherConfig, logger *slog.Logger) (*Publisher, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	p := &Publisher{cfg: cfg, log: bus.LoggerOrNop(logger).With("component", "kafka_publisher")}
	if cfg.Client != nil {
		p.client = cfg.Client
	} else {
		sc, err := cfg.saramaConfig()
		if err != nil {
			return nil, err
		}
		client, err := sarama.NewClient(cfg.Brokers, sc)
		if err != nil {
			return nil, bus.Transient(fmt.Errorf("connect to kafka brokers %v: %w", cfg.Brokers, err))
		}
		p.client, p.ownClient = client, true
	}
	producer, err := sarama.NewAsyncProducerFromClient(p.client)
	if err != nil {
		if p.ownClient {
			_ = p.client.Close()
		}
		return nil, bus.Transient(fmt.Errorf("start kafka producer: %w", err))
	}
	p.producer = producer
	p.drained.Add(2)
	go p.drainSuccesses()
	go p.drainErrors()
	return p, nil
}

// pending tracks the records of one Publish call.
type pending struct {
	left atomic.Int64
	done chan struct{}

	mu  sync.Mutex
	err error
}

func newPending(n int) *pending {
	b := &pending{done: make(chan struct{})}
	b.left.Store(int64(n))
	return b
}

func (b *pending) settle(n int, err error) {
	if err != nil {
		b.mu.Lock()
		if b.err == nil {
			b.err = err
		}
		b.mu.Unlock()
	}
	if b.left.Add(-int64(n)) == 0 {
		close(b.done)
	}
}

func (b *pending) result() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.err
}

func (p *Publisher) drainSuccesses() {
	defer p.drained.Done()
	for pm := range p.producer.Successes() {
		if b, ok := pm.Metadata.(*pending); ok {
			b.settle(1, nil)
		}
	}
}

func (p *Publisher) drainErrors() {
	defer p.drained.Done()
	for pe := range p.producer.Errors() {
		err := classifyProduceError(pe.Msg.Topic, pe.Err)
		p.log.Debug("kafka produce failed", "topic", pe.Msg.Topic, "error", pe.Err)
		if b, ok := pe.Msg.Metadata.(*pending); ok {
			b.settle(1, err)
		}
	}
}

// Publish writes msgs to topic and returns when every one of them is
// acknowledged, or with the first error. A message that cannot be marshaled
// (with DefaultMarshaler: one the Subscriber could not decode, see
// ErrUnencodable) or a nil message fails the call before anything of it is
// sent, with a permanent error naming the field. Publish stops
// waiting, with a transient error, when the context of the first message
// ends (the Timeout middleware bounds a publish this way); records already
// handed to the producer may still be written.
func (p *Publisher) Publish(topic string, msgs ...*message.Message) error {
	if len(msgs) == 0 {
		return nil
	}
	ctx := context.Background()
	if msgs[0] != nil {
		ctx = msgs[0].Context()
	}
	return p.publish(ctx, topic, msgs)
}

func (p *Publisher) publish(ctx context.Context, topic string, msgs []*message.Message) error {
	if len(msgs) == 0 {
		return nil
	}
	if err := ValidateTopic(topic); err != nil {
		return bus.Permanent(fmt.Errorf("publish to kafka: %w", err))
	}
	records := make([]*sarama.ProducerMessage, len(msgs))
	for i, msg := range msgs {
		if msg == nil {
			return bus.Permanent(fmt.Errorf("publish to kafka topic %q: message %d of %d is nil: %w", topic, i+1, len(msgs), ErrUnencodable))
		}
		pm, err := p.cfg.Marshaler.Marshal(topic, msg)
		if err != nil {
			return bus.Permanent(fmt.Errorf("publish to kafka topic %q: marshal message %q: %w", topic, msg.UUID, err))
		}
		pm.Topic = topic
		records[i] = pm
	}
	return p.send(ctx, topic, records)
}

// send hands records to the producer and waits for their acknowledgements,
// or for ctx. Records already handed over when ctx ends are still produced.
func (p *Publisher) send(ctx context.Context, topic string, records []*sarama.ProducerMessage) error {
	b := newPending(len(records))
	for _, pm := range records {
		pm.Metadata = b
	}
	p.mu.RLock()
	if p.closed {
		p.mu.RUnlock()
		return bus.Transient(fmt.Errorf("publish to kafka topic %q: %w", topic, ErrClosed))
	}
	for i, pm := range records {
		select {
		case p.producer.Input() <- pm:
		case <-ctx.Done():
			b.settle(len(records)-i, contextEnded(topic, ctx.Err()))
			p.mu.RUnlock()
			return b.result()
		}
	}
	p.mu.RUnlock()
	select {
	case <-b.done:
		return b.result()
	case <-ctx.Done():
		return contextEnded(topic, ctx.Err())
	}
}

// contextEnded classifies a Publish that stopped waiting because its context
// ended. A deadline means the publish was attempted and timed out: counted,
// like any failure of an attempted message (DESIGN §3), so a record that
// always times out reaches its budget. A cancellation (the relay shutting
// down) says nothing about the record: transient.
func contextEnded(topic string, err error) error {
	wrapped := fmt.Errorf("publish to kafka topic %q: %w", topic, err)
	if errors.Is(err, context.DeadlineExceeded) {
		return wrapped
	}
	return bus.Transient(wrapped)
}

// Close flushes the records handed to the producer, waits for their
// acknowledgements (so no Publish is left waiting) and closes the client
// unless the caller owns it. It is idempotent; Publish after Close fails
// with ErrClosed.
func (p *Publisher) Close() error {
	p.closeOnce.Do(func() {
		p.mu.Lock()
		p.closed = true
		p.mu.Unlock()
		p.producer.AsyncClose()
		p.drained.Wait()
		if p.ownClient {
			if err := p.client.Close(); err != nil {
				p.closeErr = fmt.Errorf("close kafka client: %w", err)
			}
		}
	})
	return p.closeErr
}
