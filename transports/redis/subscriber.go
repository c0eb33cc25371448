package redis

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/omnibus-go/omnibus/bus"
	"github.com/redis/go-redis/v9"
)

// Subscriber reads Redis streams as a member of a consumer group. It
// implements watermill's message.Subscriber and message.SubscribeInitializer.
//
// Each Subscribe call starts a subscription to one stream that reads with
// XREADGROUP (COUNT BatchSize), hands out up to MaxInFlight messages at
// once, acknowledges acked messages with batched XACKs, and reclaims entries
// left idle in the group's pending list (by a consumer that died) with
// XAUTOCLAIM. Every message carries a bus.Delivery in its context; its
// Attempts come from the delivery count in the pending list.
//
// A nacked message is redelivered after the retry time of its
// bus.Settlement (or NackDelay), by the same subscription, without leaving
// the pending list: if the process dies meanwhile another consumer reclaims
// it after ClaimIdle. A settlement with GiveUp copies the entry to the
// dead-letter stream with the reason and acknowledges it. Nothing else
// dead-letters a message: a plain Nack is redelivered, however often.
//
// Delivery is at-least-once. Messages are not ordered unless OrderByKey is
// set, and then only per key within one subscription (see the package
// documentation).
type Subscriber struct {
	cfg    SubscriberConfig
	client redis.UniversalClient
	owned  bool
	logger *slog.Logger

	closeCtx    context.Context
	closeCancel context.CancelFunc

	mu      sync.Mutex
	closed  bool
	streams map[string]struct{}
	subs    sync.WaitGroup
	once    sync.Once
	closeEr error

	stats stats

	// crowdEvery is how often a subscription that orders by key lists the
	// consumers of its group (crowd.go); tests shorten it.
	crowdEvery time.Duration
}

// Stats counts what a Subscriber has done since it was created.
type Stats struct {
	// Delivered is the number of messages handed out, redeliveries included.
	Delivered int64
	// Acked and Nacked count the messages acked and nacked by handlers.
	Acked  int64
	Nacked int64
	// Reclaimed is the number of idle entries taken over with XAUTOCLAIM.
	Reclaimed int64
	// DeadLettered is the number of entries copied to a dead-letter stream
	// (given up on, or undecodable) and acknowledged.
	DeadLettered int64
	// Undecodable is the number of entries the Marshaler could not decode
	// (they are dead-lettered too).
	Undecodable int64
	// ShardsTaken, ShardsReleased and ShardsLost count the shard leases
	// this Subscriber took, gave back (rebalancing, closing) and lost
	// (paused or cut off past its lease), with Shards > 1: how often its
	// groups rebalanced.
	ShardsTaken, ShardsReleased, ShardsLost int64
	// TrimmedPending is the number of pending entries found to have been
	// trimmed from their stream (by MAXLEN or XTRIM) before they were acked.
	// Their data is gone; each one is logged with its id. A growing count
	// means trimming outruns a consumer group.
	TrimmedPending int64
}

type stats struct {
	delivered, acked, nacked, reclaimed, deadLettered, undecodable, trimmed atomic.Int64
	shardsTaken, shardsReleased, shardsLost                                 atomic.Int64
}

// NewSubscriber checks cfg and returns a Subscriber. A nil logger means no
// logging.
func NewSubscriber(cfg SubscriberConfig, logger *slog.Logger) (*Subscriber, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	client, owned, err := cfg.connection().open()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Subscriber{
		cfg:    cfg,
		client: client,
		owned:  owned,
		logger: bus.LoggerOrNop(logger).With(
			"component", "redis_subscriber",
			"consumer_group", cfg.ConsumerGroup,
			"consumer", cfg.Consumer,
		),
		closeCtx:    ctx,
		closeCancel: cancel,
		streams:     make(map[string]struct{}),
		crowdEvery:  defaultCrowdEvery,
	}, nil
}

// Consumer returns the consumer name the Subscriber reads as.
func (s *Subscriber) Consumer() string { return s.cfg.Consumer }

// Stats returns the Subscriber's counters.
func (s *Subscriber) Stats() Stats {
	return Stats{
		Delivered:      s.stats.delivered.Load(),
		Acked:          s.stats.acked.Load(),
		Nacked:         s.stats.nacked.Load(),
		Reclaimed:      s.stats.reclaimed.Load(),
		DeadLettered:   s.stats.deadLettered.Load(),
		Undecodable:    s.stats.undecodable.Load(),
		TrimmedPending: s.stats.trimmed.Load(),
		ShardsTaken:    s.stats.shardsTaken.Load(),
		ShardsReleased: s.stats.shardsReleased.Load(),
		ShardsLost:     s.stats.shardsLost.Load(),
	}
}

// SubscribeInitialize creates the consumer group of topic's stream (and the
// stream) if missing; with Shards > 1 it checks the topic's shard count and
// creates the group of every shard.
func (s *Subscriber) SubscribeInitialize(topic string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return s.prepare(ctx, topic, s.cfg.StreamPrefix+topic)
}

// prepare checks the shard count of topic (recording it on first use) and
// creates the consumer group of its stream, or of each of its shards.
func (s *Subscriber) prepare(ctx context.Context, topic, stream string) error {
	if err := checkShardCount(ctx, s.client, topic, stream, s.cfg.Shards); err != nil {
		return err
	}
	if s.cfg.Shards <= 1 {
		return s.ensureGroup(ctx, stream)
	}
	for i := range s.cfg.Shards {
		if err := s.ensureGroup(ctx, shardStream(stream, i)); err != nil {
			return err
		}
	}
	return nil
}

// Subscribe creates the consumer group if missing and starts reading
// topic's stream. The channel is closed when ctx is done or the Subscriber
// is closed, after the subscription has stopped: its acks are flushed and
// the entries it still held are handed back to the group (made claimable
// at once, or when their retry is due).
func (s *Subscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	stream := s.cfg.StreamPrefix + topic
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, ErrClosed
	}
	s.subs.Add(1)
	if s.cfg.Shards > 1 {
		for i := range s.cfg.Shards {
			s.streams[shardStream(stream, i)] = struct{}{}
		}
		s.mu.Unlock()
		out, err := s.subscribeSharded(ctx, topic, stream)
		if err != nil {
			s.subs.Done()
		}
		return out, err
	}
	s.streams[stream] = struct{}{}
	s.mu.Unlock()

	if err := s.prepare(ctx, topic, stream); err != nil {
		s.subs.Done()
		return nil, err
	}
	sub := newSubscription(ctx, s, topic, stream)
	go sub.run()
	return sub.out, nil
}

func (s *Subscriber) ensureGroup(ctx context.Context, stream string) error {
	err := s.client.XGroupCreateMkStream(ctx, stream, s.cfg.ConsumerGroup, "0").Err()
	if err != nil && !redis.HasErrorPrefix(err, "BUSYGROUP") {
		return classify(fmt.Errorf("create consumer group %q on stream %q: %w", s.cfg.ConsumerGroup, stream, err))
	}
	return nil
}

// Close stops every subscription and waits for them: blocked reads return
// within BlockTime, acks are flushed, held entries are handed back to the
// group. It then removes this consumer from the groups it read if it has no
// pending entries left, and closes the client only if the Subscriber opened
// it from Addr; a caller's Client stays usable. Close is idempotent.
func (s *Subscriber) Close() error {
	s.once.Do(func() {
		s.mu.Lock()
		s.closed = true
		s.mu.Unlock()
		s.closeCancel()
		s.subs.Wait()
		s.deleteConsumer()
		if s.owned {
			s.closeEr = s.client.Close()
		}
	})
	return s.closeEr
}

func (s *Subscriber) deleteConsumer() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for stream := range s.streams {
		err := deleteConsumerScript.Run(ctx, s.client, []string{stream}, s.cfg.ConsumerGroup, s.cfg.Consumer).Err()
		if err != nil {
			s.logger.Debug("remove consumer from group", "stream", stream, "error", err)
		}
	}
}
