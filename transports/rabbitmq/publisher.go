package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/omnibus-go/omnibus/bus"
)

// publishChunk is how many messages of one call are published before their
// confirms are awaited.
const publishChunk = 512

// maxInFlight bounds the messages of one channel awaiting their confirm.
const maxInFlight = 4096

// Publisher publishes to RabbitMQ with publisher confirms: Publish returns
// once the broker has every message (persistent, in durable quorum queues),
// and a message that no queue takes is an error (mandatory), never a drop.
// Messages of one partition key go to one shard queue, in order.
type Publisher struct {
	cfg    PublisherConfig
	logger *slog.Logger
	topo   *topology

	mu     sync.Mutex
	conn   *amqp.Connection
	closed bool
	chans  []*pubChannel // up to Channels, shared by concurrent Publish calls

	next    atomic.Uint64 // round robin over chans
	unkeyed atomic.Uint64
}

// pubChannel is a channel in confirm mode, shared by concurrent Publish
// calls: each publishes its messages under mu (so a call's messages go out
// in order) and waits for its own confirms. Returns are matched to their
// caller by message-id.
type pubChannel struct {
	ch      *amqp.Channel
	conn    *amqp.Connection
	mu      sync.Mutex // serializes publishing; guards returned
	returns chan amqp.Return
	// returned holds the returns drained from returns, by message-id,
	// until their caller looks.
	returned map[string]amqp.Return
	// inFlight bounds the messages published and not yet checked, and so
	// the returns that can wait in returns (its capacity): the connection's
	// reader never blocks on it.
	inFlight chan struct{}
}

// takeReturn reports whether the message id was returned (no queue took
// it). A return comes before the confirm of its message, from the same
// connection reader, so once the confirm is in, the return is queued.
func (pc *pubChannel) takeReturn(id string) (amqp.Return, bool) {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	for {
		select {
		case r := <-pc.returns:
			pc.returned[r.MessageId] = r
			continue
		default:
		}
		break
	}
	r, ok := pc.returned[id]
	delete(pc.returned, id)
	return r, ok
}

// NewPublisher validates cfg; it connects on the first Publish.
func NewPublisher(cfg PublisherConfig, logger *slog.Logger) (*Publisher, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Publisher{
		cfg:    cfg,
		logger: bus.LoggerOrNop(logger).With("component", "rabbitmq_publisher"),
		topo:   newTopology(cfg.ConnectionConfig),
	}, nil
}

// Publish publishes msgs to topic's exchange, each to the shard queue of its
// partition key in every group, and returns when RabbitMQ has confirmed
// them all. A broker that cannot be reached or does not confirm is a
// transient error (no attempt spent); a message no queue takes is a counted
// one.
func (p *Publisher) Publish(topic string, msgs ...*message.Message) error {
	if err := bus.ValidateTopic(topic); err != nil {
		return err
	}
	if len(msgs) == 0 {
		return nil
	}
	ctx := context.Background()
	if msgs[0].Context() != nil {
		ctx = msgs[0].Context()
	}
	conn, err := p.connection()
	if err != nil {
		return err
	}
	exchange, err := p.topo.exchange(ctx, conn, topic)
	if err != nil {
		return err
	}
	for _, g := range p.cfg.Groups {
		if _, err := p.topo.group(ctx, conn, topic, g); err != nil {
			return err
		}
	}
	pc, err := p.channel(conn)
	if err != nil {
		return err
	}
	for start := 0; start < len(msgs); start += publishChunk {
		chunk := msgs[start:min(start+publishChunk, len(msgs))]
		if err := p.publish(ctx, pc, exchange, topic, chunk); err != nil {
			var amqpErr *amqp.Error
			if errors.As(err, &amqpErr) && amqpErr.Code == amqp.NotFound {
				p.topo.forget(exchange) // deleted under us: declare it again
				err = bus.Transient(err)
			}
			if pc.ch.IsClosed() {
				p.drop(pc)
			}
			return err
		}
	}
	return nil
}

func (p *Publisher) publish(ctx context.Context, pc *pubChannel, exchange, topic string, msgs []*message.Message) error {
	pubs := make([]amqp.Publishing, len(msgs))
	routes := make([]string, len(msgs))
	for i, msg := range msgs {
		pub, err := publishing(msg)
		if err != nil {
			return fmt.Errorf("publish to %q: %w", topic, err)
		}
		shard := 0
		if key := bus.PartitionKey(msg); key != "" {
			shard = bus.ShardOf(key, p.cfg.Shards)
		} else if p.cfg.Shards > 1 {
			shard = int(p.unkeyed.Add(1) % uint64(p.cfg.Shards))
		}
		pubs[i], routes[i] = pub, routingKey(shard)
	}
	for range msgs {
		pc.inFlight <- struct{}{}
	}
	defer func() {
		for range msgs {
			<-pc.inFlight
		}
	}()
	confirms := make([]*amqp.DeferredConfirmation, 0, len(msgs))
	pc.mu.Lock()
	for i := range pubs {
		dc, err := pc.ch.PublishWithDeferredConfirmWithContext(ctx, exchange, routes[i], true, false, pubs[i])
		if err != nil {
			pc.mu.Unlock()
			return classify(fmt.Errorf("publish %s to %q: %w", msgs[i].UUID, topic, err))
		}
		confirms = append(confirms, dc)
	}
	pc.mu.Unlock()
	for i, dc := range confirms {
		ok, err := dc.WaitContext(ctx)
		if err != nil {
			return classify(fmt.Errorf("publish %s to %q: wait for the confirm: %w", msgs[i].UUID, topic, err))
		}
		if !ok {
			return classify(fmt.Errorf("publish %s to %q: %w", msgs[i].UUID, topic, errNotConfirmed))
		}
	}
	for _, msg := range msgs {
		if r, returned := pc.takeReturn(msg.UUID); returned {
			return fmt.Errorf("publish %s to %q: no queue took it (%d %s): declare the consumer group's queues first (subscribe, or list the group in rabbitmq.groups)",
				msg.UUID, topic, r.ReplyCode, r.ReplyText)
		}
	}
	return nil
}

// connection returns the live connection, dialling when there is none.
func (p *Publisher) connection() (*amqp.Connection, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, ErrClosed
	}
	if p.conn != nil && !p.conn.IsClosed() {
		return p.conn, nil
	}
	conn, err := dial(p.cfg.ConnectionConfig)
	if err != nil {
		return nil, err
	}
	p.conn, p.chans = conn, nil
	return conn, nil
}

// channel returns one of conn's shared confirm channels, opening them up to
// Channels.
func (p *Publisher) channel(conn *amqp.Connection) (*pubChannel, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conn != conn {
		return nil, bus.Transient(amqp.ErrClosed)
	}
	if len(p.chans) >= p.cfg.Channels {
		return p.chans[p.next.Add(1)%uint64(len(p.chans))], nil
	}
	ch, err := conn.Channel()
	if err != nil {
		return nil, classify(fmt.Errorf("open a channel: %w", err))
	}
	if err := ch.Confirm(false); err != nil {
		_ = ch.Close()
		return nil, classify(fmt.Errorf("put a channel in confirm mode: %w", err))
	}
	pc := &pubChannel{ch: ch, conn: conn, returned: map[string]amqp.Return{},
		returns:  ch.NotifyReturn(make(chan amqp.Return, maxInFlight)),
		inFlight: make(chan struct{}, maxInFlight)}
	p.chans = append(p.chans, pc)
	return pc, nil
}

// drop forgets a channel the server closed (after a refused publish).
func (p *Publisher) drop(pc *pubChannel) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, c := range p.chans {
		if c == pc {
			p.chans = append(p.chans[:i], p.chans[i+1:]...)
			return
		}
	}
}

// Close closes the connection. Publish calls in flight fail.
func (p *Publisher) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	if p.conn != nil && !p.conn.IsClosed() {
		return p.conn.Close()
	}
	return nil
}

// dial connects with cfg.
func dial(cfg ConnectionConfig) (*amqp.Connection, error) {
	conn, err := amqp.DialConfig(cfg.URL, amqp.Config{
		Heartbeat:       cfg.Heartbeat,
		TLSClientConfig: cfg.TLS.Clone(), // amqp091 sets its ServerName
		Locale:          "en_US",
		Dial:            amqp.DefaultDial(10 * time.Second),
	})
	if err != nil {
		return nil, classify(fmt.Errorf("connect to RabbitMQ at %s: %w", redactURL(cfg.URL), err))
	}
	return conn, nil
}
