package nats

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/omnibus-go/omnibus/bus"
)

// Publisher publishes to JetStream: Publish returns once the stream has
// stored every message (a JetStream acknowledgement for each), and a message
// published again with the same UUID within the duplicate window is stored
// once. Messages of one partition key go to one shard subject, in order.
// Concurrent Publish calls share the connection and its pending
// acknowledgements.
type Publisher struct {
	cfg    PublisherConfig
	logger *slog.Logger
	topo   *topology

	mu     sync.Mutex
	ncs    []*natsgo.Conn
	jss    []jetstream.JetStream
	closed bool
	next   atomic.Uint64

	unkeyed atomic.Uint64
}

// NewPublisher validates cfg; it connects on the first Publish.
func NewPublisher(cfg PublisherConfig, logger *slog.Logger) (*Publisher, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Publisher{
		cfg:    cfg,
		logger: bus.LoggerOrNop(logger).With("component", "nats_publisher"),
		topo:   newTopology(cfg.ConnectionConfig),
	}, nil
}

// Publish stores msgs in topic's stream, each on the shard subject of its
// partition key, and returns when JetStream has acknowledged them all. A
// server that cannot be reached or does not answer is a transient error (no
// attempt spent).
func (p *Publisher) Publish(topic string, msgs ...*message.Message) error {
	b, err := base(p.cfg.SubjectPrefix, topic)
	if err != nil {
		return err
	}
	if len(msgs) == 0 {
		return nil
	}
	ctx := context.Background()
	if msgs[0].Context() != nil {
		ctx = msgs[0].Context()
	}
	js, err := p.client()
	if err != nil {
		return err
	}
	stream, err := p.topo.stream(ctx, js, topic, b)
	if err != nil {
		return err
	}
	nms := make([]*natsgo.Msg, len(msgs))
	for i, msg := range msgs {
		shard := 0
		if key := bus.PartitionKey(msg); key != "" {
			shard = bus.ShardOf(key, p.cfg.Shards)
		} else if p.cfg.Shards > 1 {
			shard = int(p.unkeyed.Add(1) % uint64(p.cfg.Shards))
		}
		if nms[i], err = natsMsg(shardSubject(b, shard), msg); err != nil {
			return fmt.Errorf("publish to %q: %w", topic, err)
		}
	}
	acks := make([]jetstream.PubAckFuture, len(nms))
	for i, m := range nms {
		if acks[i], err = js.PublishMsgAsync(m, jetstream.WithStallWait(p.cfg.Timeout)); err != nil {
			return classify(fmt.Errorf("publish %s to %q: %w", msgs[i].UUID, topic, err))
		}
	}
	for i, f := range acks {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			if errors.Is(err, natsgo.ErrNoResponders) || errors.Is(err, jetstream.ErrNoStreamResponse) {
				p.topo.forget(stream) // deleted under us: create it again
			}
			return classify(fmt.Errorf("publish %s to %q: %w", msgs[i].UUID, topic, err))
		case <-ctx.Done():
			return classify(fmt.Errorf("publish %s to %q: wait for the acknowledgement: %w", msgs[i].UUID, topic, ctx.Err()))
		}
	}
	return nil
}

// client returns one of the JetStream clients, round robin, connecting
// when there are none. A call publishes all its messages on one
// connection, so they are stored in the order given.
func (p *Publisher) client() (jetstream.JetStream, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, ErrClosed
	}
	if len(p.jss) == 0 {
		for range p.cfg.Connections {
			nc, err := dial(p.cfg.ConnectionConfig, "omnibus publisher")
			if err != nil {
				p.closeAll()
				return nil, err
			}
			js, err := jetstream.New(nc,
				jetstream.WithPublishAsyncMaxPending(p.cfg.MaxPending),
				jetstream.WithPublishAsyncTimeout(p.cfg.Timeout),
				jetstream.WithDefaultTimeout(p.cfg.Timeout))
			if err != nil {
				nc.Close()
				p.closeAll()
				return nil, err
			}
			p.ncs, p.jss = append(p.ncs, nc), append(p.jss, js)
		}
	}
	return p.jss[p.next.Add(1)%uint64(len(p.jss))], nil
}

func (p *Publisher) closeAll() {
	for _, nc := range p.ncs {
		nc.Close()
	}
	p.ncs, p.jss = nil, nil
}

// Close closes the connection; Publish calls in flight fail.
func (p *Publisher) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	p.closeAll()
	return nil
}

// dial connects with cfg. The connection reconnects by itself for ever;
// requests made while it is away fail as transient errors.
func dial(cfg ConnectionConfig, name string) (*natsgo.Conn, error) {
	opts := []natsgo.Option{
		natsgo.Name(name),
		natsgo.Timeout(cfg.Timeout),
		natsgo.MaxReconnects(-1),
		natsgo.ReconnectWait(250 * time.Millisecond),
	}
	if cfg.TLS != nil {
		opts = append(opts, natsgo.Secure(cfg.TLS.Clone()))
	}
	if cfg.Token != "" {
		opts = append(opts, natsgo.Token(cfg.Token))
	}
	if cfg.CredsFile != "" {
		opts = append(opts, natsgo.UserCredentials(cfg.CredsFile))
	}
	nc, err := natsgo.Connect(cfg.URL, opts...)
	if err != nil {
		return nil, classify(fmt.Errorf("connect to NATS at %s: %w", redactURL(cfg.URL), err))
	}
	return nc, nil
}
