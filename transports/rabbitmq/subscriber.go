package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/internal/handout"
)

// Subscriber receives a topic's messages as one consumer of a group. Each
// of the topic's shard queues has one active consumer in the group at a time
// (RabbitMQ's single-active-consumer); a message is acked after its handler
// acks it, and messages of one partition key are handed out one at a time,
// in queue order. See the package documentation.
type Subscriber struct {
	cfg    SubscriberConfig
	logger *slog.Logger
	topo   *topology

	closeCtx    context.Context
	closeCancel context.CancelFunc

	mu     sync.Mutex
	closed bool
	subs   sync.WaitGroup

	stats stats
}

// Stats counts what a Subscriber has done since it was created.
type Stats struct {
	Delivered, Acked, Nacked, DeadLettered int64
	// Fenced counts the sessions a subscription ended because it could not
	// be sure it still held its queues (its connection lost or too quiet);
	// what it held is redelivered by RabbitMQ to the next consumer.
	Fenced int64
	// AcksLost counts acks that did not reach RabbitMQ (the connection was
	// gone): those messages are delivered again.
	AcksLost int64
}

type stats struct {
	delivered, acked, nacked, deadLettered, fenced, acksLost atomic.Int64
}

// Stats returns the Subscriber's counters.
func (s *Subscriber) Stats() Stats {
	return Stats{
		Delivered: s.stats.delivered.Load(), Acked: s.stats.acked.Load(), Nacked: s.stats.nacked.Load(),
		DeadLettered: s.stats.deadLettered.Load(), Fenced: s.stats.fenced.Load(), AcksLost: s.stats.acksLost.Load(),
	}
}

// NewSubscriber validates cfg; each Subscribe opens its own connection.
func NewSubscriber(cfg SubscriberConfig, logger *slog.Logger) (*Subscriber, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Subscriber{
		cfg:         cfg,
		logger:      bus.LoggerOrNop(logger).With("component", "rabbitmq_subscriber", "consumer_group", cfg.ConsumerGroup, "consumer", cfg.Consumer),
		topo:        newTopology(cfg.ConnectionConfig),
		closeCtx:    ctx,
		closeCancel: cancel,
	}, nil
}

// Consumer is the name this Subscriber's consumers carry.
func (s *Subscriber) Consumer() string { return s.cfg.Consumer }

// SubscribeInitialize declares topic's exchange and the group's queues, so
// that what is published from now on is kept for the group.
func (s *Subscriber) SubscribeInitialize(topic string) error {
	if err := bus.ValidateTopic(topic); err != nil {
		return err
	}
	conn, err := dial(s.cfg.ConnectionConfig)
	if err != nil {
		return err
	}
	defer conn.Close()
	_, err = s.topo.group(context.Background(), conn, topic, s.cfg.ConsumerGroup)
	return err
}

// Subscribe declares topic's exchange and the group's queues and consumes
// them until ctx ends or the Subscriber closes; then the channel is closed.
// A lost connection is reopened; what it held is redelivered.
func (s *Subscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	if err := bus.ValidateTopic(topic); err != nil {
		return nil, err
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, ErrClosed
	}
	s.subs.Add(1)
	s.mu.Unlock()
	// Declare now, so that a wrong shard count fails Subscribe.
	if err := s.SubscribeInitialize(topic); err != nil {
		s.subs.Done()
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(s.closeCtx, cancel)
	sub := &subscription{
		s: s, cfg: &s.cfg, topic: topic, exchange: exchangeName(s.cfg.ExchangePrefix, topic),
		ctx: ctx, out: make(chan *message.Message),
		logger: s.logger.With("topic", topic),
	}
	go func() {
		defer s.subs.Done()
		defer stop()
		defer cancel()
		sub.run()
	}()
	return sub.out, nil
}

// Close stops every subscription and closes their connections: RabbitMQ
// hands what they held to the group's next consumer. Idempotent.
func (s *Subscriber) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	s.closeCancel()
	s.subs.Wait()
	return nil
}

// subscription consumes one topic for one Subscribe call, one session (a
// connection and its consumers) at a time.
type subscription struct {
	s        *Subscriber
	cfg      *SubscriberConfig
	topic    string
	exchange string
	ctx      context.Context
	out      chan *message.Message
	logger   *slog.Logger
}

func (sub *subscription) run() {
	defer close(sub.out)
	wait := 100 * time.Millisecond
	for sub.ctx.Err() == nil {
		err := sub.session()
		if sub.ctx.Err() != nil {
			return
		}
		sub.logger.Warn("rabbitmq session ended; reconnecting", "error", err, "in", wait)
		select {
		case <-time.After(wait):
		case <-sub.ctx.Done():
			return
		}
		wait = min(2*wait, 5*time.Second)
	}
}

// session is one connection: it consumes every shard queue of the group
// until the connection fails, the lease lapses or the subscription stops.
func (sub *subscription) session() error {
	conn, err := dial(sub.cfg.ConnectionConfig)
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(sub.ctx)
	defer cancel()
	ss := &session{sub: sub, conn: conn, ctx: ctx, cancel: cancel, keys: map[string][]*entry{}}
	if _, err := sub.s.topo.group(ctx, conn, sub.topic, sub.cfg.ConsumerGroup); err != nil {
		return err
	}
	if ss.ch, err = conn.Channel(); err != nil {
		return classify(err)
	}
	if err := ss.ch.Qos(sub.cfg.Prefetch, 0, false); err != nil {
		return classify(err)
	}
	if ss.dl, err = conn.Channel(); err != nil {
		return classify(err)
	}
	if err := ss.dl.Confirm(false); err != nil {
		return classify(err)
	}
	ss.dlReturns = ss.dl.NotifyReturn(make(chan amqp.Return, 1))
	if err := ss.renew(); err != nil {
		return err
	}
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))

	// Consume the shards starting at a random one: consumers subscribing at
	// the same moment may then share the shards (usually one is active on
	// all of them and the others stand by; see the package documentation).
	first := rand.IntN(sub.cfg.Shards)
	for j := range sub.cfg.Shards {
		i := (first + j) % sub.cfg.Shards
		queue := shardQueue(sub.exchange, sub.cfg.ConsumerGroup, i)
		deliveries, err := ss.ch.Consume(queue, sub.cfg.Consumer+"."+strconv.Itoa(i), false, false, false, false, nil)
		if err != nil {
			return classify(fmt.Errorf("consume %q: %w", queue, err))
		}
		ss.workers.Go(func() { ss.read(queue, deliveries) })
	}
	ss.workers.Go(ss.renewLoop)

	var end error
	select {
	case e := <-closed:
		end = amqp.ErrClosed
		if e != nil {
			end = e
		}
		ss.fence() // RabbitMQ gives the queues to the next consumer
	case <-ctx.Done():
		end = ctx.Err()
	}
	cancel()
	_ = conn.Close() // RabbitMQ requeues whatever this session held
	ss.workers.Wait()
	return end
}

// session is one connection's consumption of a topic.
type session struct {
	sub    *subscription
	conn   *amqp.Connection
	ch     *amqp.Channel // consumers and acks
	dl     *amqp.Channel // dead letters, in confirm mode
	ctx    context.Context
	cancel context.CancelFunc

	dlMu      sync.Mutex
	dlReturns chan amqp.Return

	// leaseUntil is when the session stops handing out: the time its last
	// successful round trip to RabbitMQ was sent, plus Heartbeat. A process
	// paused past it (SIGSTOP, a long GC) hands out nothing when it wakes:
	// by then RabbitMQ may have closed its connection and given its queues
	// to another consumer.
	leaseUntil atomic.Int64

	workers sync.WaitGroup

	mu   sync.Mutex
	keys map[string][]*entry // keys with a message out, and the ones waiting behind it
}

// entry is one delivery this session holds.
type entry struct {
	d        amqp.Delivery
	msg      *message.Message
	queue    string
	key      string
	attempts int // counted attempts spent: RabbitMQ's redeliveries plus our counted failures
	first    time.Time
}

// renew makes a round trip to RabbitMQ and extends the lease from the time
// it was sent.
func (ss *session) renew() error {
	sent := time.Now()
	if _, err := ss.ch.QueueDeclarePassive(shardQueue(ss.sub.exchange, ss.sub.cfg.ConsumerGroup, 0), true, false, false, false, nil); err != nil {
		return classify(fmt.Errorf("renew: %w", err))
	}
	ss.leaseUntil.Store(sent.Add(ss.sub.cfg.Heartbeat).UnixNano())
	return nil
}

func (ss *session) renewLoop() {
	t := time.NewTicker(ss.sub.cfg.Heartbeat / 4)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-ss.ctx.Done():
			return
		}
		if err := ss.renew(); err != nil {
			ss.sub.logger.Warn("rabbitmq round trip failed; ending the session", "error", err)
			ss.fence()
			return
		}
	}
}

// send hands msg to the consumer and reports whether it did: not once the
// session ends or its connection is closed, nor once its lease has lapsed,
// before or while msg waits for the consumer to take it (a process paused
// past its lease hands out nothing when it wakes, whether or not renewLoop
// has run since).
func (ss *session) send(msg *message.Message) bool {
	var t handout.Timer
	left := func() time.Duration {
		if ss.conn.IsClosed() {
			return 0
		}
		return time.Duration(ss.leaseUntil.Load() - time.Now().UnixNano())
	}
	return handout.Send(ss.sub.out, msg, left, ss.ctx.Done(), nil, &t)
}

// fence ends the session: its connection closes, RabbitMQ redelivers what
// it held to the shard's next consumer.
func (ss *session) fence() {
	if ss.ctx.Err() == nil {
		ss.sub.s.stats.fenced.Add(1)
	}
	ss.cancel()
	_ = ss.conn.Close()
}

// read takes one shard queue's deliveries and starts each key's head.
func (ss *session) read(queue string, deliveries <-chan amqp.Delivery) {
	for {
		var d amqp.Delivery
		var ok bool
		select {
		case d, ok = <-deliveries:
			if !ok {
				return
			}
		case <-ss.ctx.Done():
			return
		}
		msg, err := decode(d)
		if err != nil {
			ss.deadLetter(&entry{d: d, queue: queue, attempts: deliveryCount(d), msg: message.NewMessage(d.MessageId, d.Body)},
				bus.DeadLetterReasonUndecodable, err.Error(), bus.ClassPermanent)
			continue
		}
		e := &entry{d: d, msg: msg, queue: queue, key: bus.PartitionKey(msg), attempts: deliveryCount(d)}
		if e.key != "" {
			ss.mu.Lock()
			q, busy := ss.keys[e.key]
			ss.keys[e.key] = append(q, e)
			ss.mu.Unlock()
			if busy {
				continue // handed out when the one before it is done
			}
		}
		ss.workers.Go(func() { ss.handle(e) })
	}
}

// handle hands e out until it is acked, given up on, or the session ends,
// then does the same with the entries of its key that wait behind it.
func (ss *session) handle(e *entry) {
	for e != nil && ss.ctx.Err() == nil {
		for ss.handOut(e) {
		}
		e = ss.next(e)
	}
}

// next forgets done, the head of its key, and returns the entry behind it.
func (ss *session) next(done *entry) *entry {
	if done.key == "" {
		return nil
	}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	q := ss.keys[done.key][1:]
	if len(q) == 0 {
		delete(ss.keys, done.key)
		return nil
	}
	ss.keys[done.key] = q
	return q[0]
}

// handOut delivers e once; it returns true when e is due again.
func (ss *session) handOut(e *entry) (again bool) {
	sub := ss.sub
	now := time.Now()
	if e.first.IsZero() {
		e.first = now
	}
	msg := e.msg.Copy() // a message is acked or nacked once
	ctx, cancel := context.WithCancel(context.WithoutCancel(ss.ctx))
	defer cancel()
	ctx = bus.WithDelivery(ctx, bus.Delivery{
		Attempts:         e.attempts,
		FirstDeliveredAt: e.first,
		DeliveredAt:      now,
		Source:           e.queue,
		Topic:            sub.topic,
		ID:               strconv.FormatUint(e.d.DeliveryTag, 10),
		DeadLetter:       deadLetterQueue(sub.exchange, sub.cfg.ConsumerGroup),
	})
	msg.SetContext(ctx)
	if !ss.send(msg) {
		if ss.ctx.Err() == nil {
			ss.fence() // the lease lapsed or the connection closed (an ending session closes it itself)
		}
		return false
	}
	sub.s.stats.delivered.Add(1)
	select {
	case <-msg.Acked():
		sub.s.stats.acked.Add(1)
		if err := e.d.Ack(false); err != nil {
			sub.s.stats.acksLost.Add(1)
			sub.logger.Info("ack did not reach RabbitMQ; the message is delivered again", "message_id", e.d.MessageId, "error", err)
		}
		return false
	case <-msg.Nacked():
		sub.s.stats.nacked.Add(1)
		r := bus.RedeliveryOf(ctx, sub.cfg.NackDelay)
		if r.GiveUp {
			ss.deadLetter(e, bus.DeadLetterReasonGaveUp, r.Settlement.Error, r.Settlement.Class)
			return false
		}
		if r.Counted {
			e.attempts++
		}
		select {
		case <-time.After(time.Until(r.Due)):
			return true
		case <-ss.ctx.Done():
			return false
		}
	case <-ss.ctx.Done():
		return false
	}
}

// deadLetter copies e to the group's dead-letter queue with the reason and
// acks it; while RabbitMQ refuses the copy, e stays unacked and the session
// ends, so it is delivered again.
func (ss *session) deadLetter(e *entry, reason, errText string, class bus.Class) {
	sub := ss.sub
	pub := amqp.Publishing{MessageId: e.d.MessageId, Body: e.d.Body, DeliveryMode: amqp.Persistent, Timestamp: time.Now(), Headers: amqp.Table{}}
	for k, v := range e.d.Headers {
		if !isBrokerHeader(k) && !strings.HasPrefix(k, bus.DeadLetterPrefix) {
			pub.Headers[k] = v
		}
	}
	pub.Headers[bus.KeyDeadLetterReason] = reason
	pub.Headers[bus.KeyDeadLetterError] = errText
	pub.Headers[bus.KeyDeadLetterClass] = class.String()
	pub.Headers[bus.KeyDeadLetterAttempts] = strconv.Itoa(e.attempts + 1)
	pub.Headers[bus.KeyDeadLetterTopic] = sub.topic
	pub.Headers[bus.KeyDeadLetterGroup] = sub.cfg.ConsumerGroup
	pub.Headers[bus.KeyDeadLetterAt] = time.Now().UTC().Format(time.RFC3339Nano)
	queue := deadLetterQueue(sub.exchange, sub.cfg.ConsumerGroup)

	ss.dlMu.Lock()
	err := func() error {
		dc, err := ss.dl.PublishWithDeferredConfirmWithContext(ss.ctx, "", queue, true, false, pub)
		if err != nil {
			return err
		}
		if ok, err := dc.WaitContext(ss.ctx); err != nil || !ok {
			return errors.Join(err, errNotConfirmed)
		}
		select {
		case r := <-ss.dlReturns:
			return fmt.Errorf("dead-letter queue %q refused it: %d %s", queue, r.ReplyCode, r.ReplyText)
		default:
			return nil
		}
	}()
	ss.dlMu.Unlock()
	if err != nil {
		sub.logger.Warn("could not dead-letter a message; it is delivered again", "message_id", e.d.MessageId, "queue", queue, "error", err)
		ss.fence()
		return
	}
	sub.s.stats.deadLettered.Add(1)
	sub.logger.Warn("message dead-lettered", "message_id", e.d.MessageId, "queue", queue, "reason", reason, "error", errText)
	if err := e.d.Ack(false); err != nil {
		sub.s.stats.acksLost.Add(1)
	}
}
