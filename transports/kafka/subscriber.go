package kafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/omnibus-go/omnibus/bus"
)

// Subscriber consumes Kafka topics as a member of a consumer group.
//
// Within a partition, records with different keys are handed out
// concurrently, up to SubscriberConfig.MaxInFlight at once, while the records
// of one key are handed out one at a time, in offset order: the next only
// after the previous one is acked or dead-lettered. Records without a key
// are not ordered among themselves. An offset is committed only when it and
// every earlier offset of its partition are acked; acks beyond the first
// unacked record travel in the commit metadata, so a member that takes the
// partition over skips them instead of delivering them again.
//
// Each message's context carries a bus.Delivery (counted attempts spent,
// partition, offset). A Nack is settled as the message's bus.Settlement says:
// with GiveUp the record is published to the dead-letter topic with the
// reason in its headers and counts as acked; otherwise it is delivered again,
// as a fresh message, at the settlement's RetryAt (or after NackDelay), still
// ahead of the later records of its key. Counted failures (and a Nack without
// a settlement) spend an attempt, transient ones do not. The count lives in
// process: a record that changes owner in a rebalance starts again at 0.
//
// When a rebalance revokes a partition (or the subscription ends), the
// contexts of its in-flight messages are cancelled and their acks are no
// longer awaited; they are delivered again by the next owner.
type Subscriber struct {
	cfg SubscriberConfig
	log *slog.Logger

	mu         sync.Mutex
	closed     bool
	clientBusy bool // the caller's client serves a subscription
	subs       map[*subscription]struct{}
	wg         sync.WaitGroup

	dlqMu sync.Mutex
	dlq   *Publisher

	closeOnce sync.Once
	closeErr  error
}

var _ message.Subscriber = (*Subscriber)(nil)

// NewSubscriber returns a Subscriber. It connects when Subscribe is called.
// A nil logger means no logging.
func NewSubscriber(cfg SubscriberConfig, logger *slog.Logger) (*Subscriber, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Subscriber{
		cfg:  cfg,
		log:  bus.LoggerOrNop(logger).With("component", "kafka_subscriber", "consumer_group", cfg.ConsumerGroup),
		subs: make(map[*subscription]struct{}),
	}, nil
}

// subscription is one Subscribe call: one member of the consumer group.
type subscription struct {
	s      *Subscriber
	topic  string
	log    *slog.Logger
	ctx    context.Context
	cancel context.CancelFunc

	client    sarama.Client
	ownClient bool
	group     sarama.ConsumerGroup
	out       chan *message.Message
}

// Subscribe joins the consumer group for topic and returns the channel its
// messages arrive on. Each call is a separate group member with its own
// connection. The channel is closed when ctx ends or the Subscriber is
// closed; the contexts of messages still in flight are then cancelled.
func (s *Subscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	if topic == "" {
		return nil, errors.New("kafka: subscribe: empty topic")
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, ErrClosed
	}
	if s.cfg.Client != nil {
		if s.clientBusy {
			s.mu.Unlock()
			return nil, fmt.Errorf("kafka: subscribe to %q: the caller's client already serves a subscription (a sarama client serves one consumer group at a time)", topic)
		}
		s.clientBusy = true
	}
	s.mu.Unlock()

	sub, err := s.newSubscription(ctx, topic)
	if err != nil {
		s.releaseClient()
		return nil, err
	}

	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		sub.cancel()
		_ = sub.group.Close()
		if sub.ownClient {
			_ = sub.client.Close()
		}
		s.releaseClient()
		return nil, ErrClosed
	}
	s.subs[sub] = struct{}{}
	s.wg.Add(1)
	s.mu.Unlock()

	go sub.run()
	return sub.out, nil
}

func (s *Subscriber) releaseClient() {
	if s.cfg.Client == nil {
		return
	}
	s.mu.Lock()
	s.clientBusy = false
	s.mu.Unlock()
}

func (s *Subscriber) newSubscription(ctx context.Context, topic string) (*subscription, error) {
	sub := &subscription{
		s:     s,
		topic: topic,
		log:   s.log.With("topic", topic),
		out:   make(chan *message.Message),
	}
	if s.cfg.Client != nil {
		sub.client = s.cfg.Client
	} else {
		sc, err := s.cfg.saramaConfig()
		if err != nil {
			return nil, err
		}
		client, err := sarama.NewClient(s.cfg.Brokers, sc)
		if err != nil {
			return nil, bus.Transient(fmt.Errorf("kafka: subscribe to %q: connect to brokers %v: %w", topic, s.cfg.Brokers, err))
		}
		sub.client, sub.ownClient = client, true
	}
	group, err := sarama.NewConsumerGroupFromClient(s.cfg.ConsumerGroup, sub.client)
	if err != nil {
		if sub.ownClient {
			_ = sub.client.Close()
		}
		return nil, fmt.Errorf("kafka: subscribe to %q: join consumer group %q: %w", topic, s.cfg.ConsumerGroup, err)
	}
	sub.group = group
	sub.ctx, sub.cancel = context.WithCancel(ctx)
	return sub, nil
}

// run consumes until the subscription ends, then leaves the group and
// closes the output channel.
func (sub *subscription) run() {
	s := sub.s
	defer s.wg.Done()

	errsDone := make(chan struct{})
	go func() {
		defer close(errsDone)
		for err := range sub.group.Errors() {
			sub.log.Warn("kafka consumer group error", "error", err)
		}
	}()

	handler := &groupHandler{sub: sub}
	backoff := 100 * time.Millisecond
	for sub.ctx.Err() == nil {
		err := sub.group.Consume(sub.ctx, []string{sub.topic}, handler)
		if sub.ctx.Err() != nil || errors.Is(err, sarama.ErrClosedConsumerGroup) {
			break
		}
		if err == nil {
			// A rebalance ended the session (eager strategies); rejoin.
			backoff = 100 * time.Millisecond
			continue
		}
		sub.log.Warn("kafka consumer group session failed; rejoining", "error", err, "backoff", backoff)
		if !sleepCtx(sub.ctx, backoff) {
			break
		}
		backoff = min(2*backoff, 5*time.Second)
	}
	sub.cancel()

	// Consume has returned, so every ConsumeClaim has: nothing sends on out.
	if err := sub.group.Close(); err != nil {
		sub.log.Debug("kafka consumer group close", "error", err)
	}
	<-errsDone
	if sub.ownClient {
		if err := sub.client.Close(); err != nil {
			sub.log.Debug("kafka client close", "error", err)
		}
	}
	close(sub.out)

	s.mu.Lock()
	delete(s.subs, sub)
	s.mu.Unlock()
	s.releaseClient()
}

// groupHandler runs one partitionWorker per claimed partition.
type groupHandler struct{ sub *subscription }

func (h *groupHandler) Setup(sess sarama.ConsumerGroupSession) error {
	h.sub.log.Debug("kafka partitions assigned", "claims", sess.Claims(), "generation", sess.GenerationID())
	return nil
}

func (h *groupHandler) Cleanup(sess sarama.ConsumerGroupSession) error {
	h.sub.log.Debug("kafka session ended", "generation", sess.GenerationID())
	return nil
}

func (h *groupHandler) ConsumeClaim(sess sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	newPartitionWorker(h.sub, sess, claim).run()
	return nil
}

// deadLetterPublisher returns the publisher dead letters go through,
// creating it on first use.
func (s *Subscriber) deadLetterPublisher() (*Publisher, error) {
	s.dlqMu.Lock()
	defer s.dlqMu.Unlock()
	if s.dlq != nil {
		return s.dlq, nil
	}
	p, err := NewPublisher(PublisherConfig{
		ConnectionConfig: s.cfg.ConnectionConfig,
		Client:           s.cfg.Client,
		// A dead letter copies a record its topic accepted, whatever its
		// size: the brokers' limit for the dead-letter topic decides, not a
		// local one that would refuse it on every try while its partition
		// waits. One record per request, so that the dead letters of several
		// partitions are not batched past that limit.
		MaxMessageBytes: int(sarama.MaxRequestSize) - 1, // the largest sarama allows
		Tune:            func(c *sarama.Config) { c.Producer.Flush.MaxMessages = 1 },
	}, s.log)
	if err != nil {
		return nil, fmt.Errorf("start dead-letter publisher: %w", err)
	}
	s.dlq = p
	return p, nil
}

// Close ends every subscription (cancelling the contexts of messages in
// flight), leaves the consumer group, and closes the clients the Subscriber
// created. It waits for its goroutines and is idempotent. A caller's Client
// stays open.
func (s *Subscriber) Close() error {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closed = true
		for sub := range s.subs {
			sub.cancel()
		}
		s.mu.Unlock()
		s.wg.Wait()

		s.dlqMu.Lock()
		if s.dlq != nil {
			s.closeErr = s.dlq.Close()
		}
		s.dlqMu.Unlock()
	})
	return s.closeErr
}

// sleepCtx waits for d or for ctx, reporting whether d elapsed.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
