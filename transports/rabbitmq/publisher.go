package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/omnibus-go/omnibus/bus"
)

// publishChunk bounds the messages awaiting confirmation on one channel, and
// so the returns that can be waiting in its return queue.
const publishChunk = 512

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
	idle   []*pubChannel

	unkeyed atomic.Uint64
}

// pubChannel is a channel in confirm mode with its return queue.
type pubChannel struct {
	ch      *amqp.Channel
	conn    *amqp.Connection
	returns chan amqp.Return
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
			_ = pc.ch.Close()
			var amqpErr *amqp.Error
			if errors.As(err, &amqpErr) && amqpErr.Code == amqp.NotFound {
				p.topo.forget(exchange) // deleted under us: declare it again
				err = bus.Transient(err)
			}
			return err
		}
	}
	p.release(pc)
	return nil
}

func (p *Publisher) publish(ctx context.Context, pc *pubChannel, exchange, topic string, msgs []*message.Message) error {
	confirms := make([]*amqp.DeferredConfirmation, 0, len(msgs))
	for _, msg := range msgs {
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
		dc, err := pc.ch.PublishWithDeferredConfirmWithContext(ctx, exchange, routingKey(shard), true, false, pub)
		if err != nil {
			return classify(fmt.Errorf("publish %s to %q: %w", msg.UUID, topic, err))
		}
		confirms = append(confirms, dc)
	}
	for i, dc := range confirms {
		ok, err := dc.WaitContext(ctx)
		if err != nil {
			return classify(fmt.Errorf("publish %s to %q: wait for the confirm: %w", msgs[i].UUID, topic, err))
		}
		if !ok {
			return classify(fmt.Errorf("publish %s to %q: %w", msgs[i].UUID, topic, errNotConfirmed))
		}
	}
	// A return comes before the confirm of its message, from the same
	// connection reader: every return of this chunk is queued by now.
	for {
		select {
		case r := <-pc.returns:
			return fmt.Errorf("publish %s to %q: no queue took it (%d %s): declare the consumer group's queues first (subscribe, or list the group in rabbitmq.groups)",
				r.MessageId, topic, r.ReplyCode, r.ReplyText)
		default:
			return nil
		}
	}
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
	conn, err := dial(p.cfg.ConnectionConfig, nil)
	if err != nil {
		return nil, err
	}
	p.conn, p.idle = conn, nil
	return conn, nil
}

// channel takes an idle confirm channel of conn or opens one.
func (p *Publisher) channel(conn *amqp.Connection) (*pubChannel, error) {
	p.mu.Lock()
	for len(p.idle) > 0 {
		pc := p.idle[len(p.idle)-1]
		p.idle = p.idle[:len(p.idle)-1]
		if pc.conn == conn && !pc.ch.IsClosed() {
			p.mu.Unlock()
			return pc, nil
		}
	}
	p.mu.Unlock()
	ch, err := conn.Channel()
	if err != nil {
		return nil, classify(fmt.Errorf("open a channel: %w", err))
	}
	if err := ch.Confirm(false); err != nil {
		_ = ch.Close()
		return nil, classify(fmt.Errorf("put a channel in confirm mode: %w", err))
	}
	return &pubChannel{ch: ch, conn: conn, returns: ch.NotifyReturn(make(chan amqp.Return, publishChunk))}, nil
}

// release keeps pc for the next Publish, up to Channels of them.
func (p *Publisher) release(pc *pubChannel) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || len(p.idle) >= p.cfg.Channels || pc.conn != p.conn {
		_ = pc.ch.Close()
		return
	}
	p.idle = append(p.idle, pc)
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

// dial connects with cfg. seen, when set, is called on every read from the
// server (heartbeats included): a Subscriber's fence.
func dial(cfg ConnectionConfig, seen func()) (*amqp.Connection, error) {
	conn, err := amqp.DialConfig(cfg.URL, amqp.Config{
		Heartbeat:       cfg.Heartbeat,
		TLSClientConfig: cfg.TLS,
		Locale:          "en_US",
		Dial: func(network, addr string) (net.Conn, error) {
			c, err := net.DialTimeout(network, addr, 10*time.Second)
			if err != nil || seen == nil {
				return c, err
			}
			return &seenConn{Conn: c, seen: seen}, nil
		},
	})
	if err != nil {
		return nil, classify(fmt.Errorf("connect to RabbitMQ at %s: %w", redactURL(cfg.URL), err))
	}
	return conn, nil
}

// seenConn calls seen whenever the server sent something.
type seenConn struct {
	net.Conn
	seen func()
}

func (c *seenConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 {
		c.seen()
	}
	return n, err
}
