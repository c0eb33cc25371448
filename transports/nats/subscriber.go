package nats

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/omnibus-go/omnibus/bus"
)

// Subscriber receives a topic's messages as one consumer of a group. The
// topic's shards are shared out among the group's live consumers; each
// shard is read by the holder of its lease, from the position the group
// recorded, and a message is settled after its handler acks it. Messages
// of one partition key are handed out one at a time, in stream order. See
// the package documentation.
type Subscriber struct {
	cfg    SubscriberConfig
	logger *slog.Logger
	topo   *topology

	closeCtx    context.Context
	closeCancel context.CancelFunc

	mu     sync.Mutex
	closed bool
	nc     *natsgo.Conn
	js     jetstream.JetStream
	kv     jetstream.KeyValue
	subs   sync.WaitGroup

	stats stats
}

// Stats counts what a Subscriber has done since it was created.
type Stats struct {
	Delivered, Acked, Nacked, DeadLettered int64
	// ShardsTaken, ShardsReleased and ShardsLost count the shard leases
	// this Subscriber took, gave back, and found taken by another consumer
	// (or could not renew in time).
	ShardsTaken, ShardsReleased, ShardsLost int64
}

type stats struct {
	delivered, acked, nacked, deadLettered, taken, released, lost atomic.Int64
}

// Stats returns the Subscriber's counters.
func (s *Subscriber) Stats() Stats {
	return Stats{
		Delivered: s.stats.delivered.Load(), Acked: s.stats.acked.Load(), Nacked: s.stats.nacked.Load(),
		DeadLettered: s.stats.deadLettered.Load(), ShardsTaken: s.stats.taken.Load(),
		ShardsReleased: s.stats.released.Load(), ShardsLost: s.stats.lost.Load(),
	}
}

// NewSubscriber validates cfg; it connects on the first Subscribe.
func NewSubscriber(cfg SubscriberConfig, logger *slog.Logger) (*Subscriber, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Subscriber{
		cfg:         cfg,
		logger:      bus.LoggerOrNop(logger).With("component", "nats_subscriber", "consumer_group", cfg.ConsumerGroup, "consumer", cfg.Consumer),
		topo:        newTopology(cfg.ConnectionConfig),
		closeCtx:    ctx,
		closeCancel: cancel,
	}, nil
}

// Consumer is this Subscriber's name in its group.
func (s *Subscriber) Consumer() string { return s.cfg.Consumer }

// client returns the JetStream client and the lease bucket, connecting
// when there is none.
func (s *Subscriber) client(ctx context.Context) (jetstream.JetStream, jetstream.KeyValue, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, nil, ErrClosed
	}
	if s.js != nil {
		return s.js, s.kv, nil
	}
	nc, err := dial(s.cfg.ConnectionConfig, "omnibus consumer "+s.cfg.ConsumerGroup+"/"+s.cfg.Consumer)
	if err != nil {
		return nil, nil, err
	}
	js, err := jetstream.New(nc, jetstream.WithDefaultTimeout(s.cfg.Timeout))
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	kv, err := bucket(ctx, js, s.cfg.ConnectionConfig)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	s.nc, s.js, s.kv = nc, js, kv
	return js, kv, nil
}

// SubscribeInitialize creates topic's stream, so that what is published
// from now on is kept; a group that has never read the topic starts at the
// stream's first message.
func (s *Subscriber) SubscribeInitialize(topic string) error {
	b, err := base(s.cfg.SubjectPrefix, topic)
	if err != nil {
		return err
	}
	js, _, err := s.client(context.Background())
	if err != nil {
		return err
	}
	_, err = s.topo.stream(context.Background(), js, topic, b)
	return err
}

// Subscribe joins the group on topic and hands out the messages of the
// shards this consumer holds until ctx ends or the Subscriber closes; then
// it gives its shards back and closes the channel.
func (s *Subscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	b, err := base(s.cfg.SubjectPrefix, topic)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, ErrClosed
	}
	s.subs.Add(1)
	s.mu.Unlock()
	js, kv, err := s.client(ctx)
	if err != nil {
		s.subs.Done()
		return nil, err
	}
	stream, err := s.topo.stream(ctx, js, topic, b)
	if err != nil {
		s.subs.Done()
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	g := &group{
		s: s, js: js, kv: kv, topic: topic, base: b, stream: stream,
		logger: s.logger.With("topic", topic, "stream", stream),
		ctx:    ctx, cancel: cancel,
		out:  make(chan *message.Message),
		seen: map[string]seenRev{},
		held: map[int]*shard{},
	}
	go g.run()
	return g.out, nil
}

// Close gives back every shard, leaves the groups and closes the
// connection. Idempotent.
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
	if s.nc != nil {
		s.nc.Close()
	}
	return nil
}

// record is a shard's lease in the bucket: who holds it, and the group's
// position in the shard.
type record struct {
	// Owner is the consumer holding the lease; "" when it was given back.
	Owner string `json:"owner"`
	// Floor is the stream sequence up to which the group has settled every
	// message of the shard: its next owner reads from Floor+1.
	Floor uint64 `json:"floor"`
	// Stuck counts the owners that ended without giving the shard back
	// (died, or lost their lease) while Floor stayed where it is: the
	// message after Floor may be what kills them.
	Stuck int `json:"stuck"`
	// Leases counts the times the lease was taken.
	Leases int64 `json:"leases"`
}

func (r record) bytes() []byte {
	b, _ := json.Marshal(r)
	return b
}

func parseRecord(b []byte) (record, error) {
	var r record
	err := json.Unmarshal(b, &r)
	return r, err
}

// seenRev is when this consumer first saw a key at a revision: a lease or
// membership whose revision has not changed for ShardLease on this
// consumer's clock has lapsed. No clocks are compared between machines.
type seenRev struct {
	rev   uint64
	since time.Time
}

// group is one Subscribe call: it keeps this consumer's membership of the
// group alive, works out its share of the shards, takes their leases and
// runs a shard reader per shard it holds.
//
// Shares are computed alike by every member from the sorted list of live
// members: shard i belongs to members[i mod len(members)]. Views may differ
// for a moment while members come and go; the leases keep ownership
// exclusive meanwhile, and a shard moves only when its lease is free.
type group struct {
	s      *Subscriber
	js     jetstream.JetStream
	kv     jetstream.KeyValue
	topic  string
	base   string
	stream string
	logger *slog.Logger

	ctx    context.Context
	cancel context.CancelFunc
	out    chan *message.Message

	// Used by the run goroutine only.
	seen map[string]seenRev
	held map[int]*shard

	releasing sync.WaitGroup
}

func (g *group) run() {
	defer g.s.subs.Done()
	stop := context.AfterFunc(g.s.closeCtx, g.cancel)
	defer stop()
	defer g.cancel()
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-g.ctx.Done():
			g.stop()
			return
		}
		g.balance()
		t.Reset(g.s.cfg.ShardLease / 4)
	}
}

// balance renews this consumer's membership, gives back the shards that
// are no longer its share and takes the free ones that are.
func (g *group) balance() {
	cfg := &g.s.cfg
	ctx, cancel := context.WithTimeout(g.ctx, cfg.ShardLease/2)
	defer cancel()
	if _, err := g.kv.Put(ctx, memberKey(g.stream, cfg.ConsumerGroup, cfg.Consumer), []byte(cfg.Consumer)); err != nil {
		if g.ctx.Err() == nil {
			g.logger.Warn("renewing the group membership failed; will retry", "error", err)
		}
		return
	}
	entries, err := g.list(ctx)
	if err != nil {
		if g.ctx.Err() == nil {
			g.logger.Warn("reading the group's leases failed; will retry", "error", err)
		}
		return
	}
	now := time.Now()
	for k, e := range entries {
		if s, ok := g.seen[k]; !ok || s.rev != e.Revision() {
			g.seen[k] = seenRev{rev: e.Revision(), since: now}
		}
	}
	for k := range g.seen {
		if _, ok := entries[k]; !ok {
			delete(g.seen, k)
		}
	}
	members := []string{cfg.Consumer}
	prefix := memberKey(g.stream, cfg.ConsumerGroup, "")
	for k := range entries {
		if c, ok := strings.CutPrefix(k, prefix); ok && c != cfg.Consumer && now.Sub(g.seen[k].since) < cfg.ShardLease {
			members = append(members, c)
		}
	}
	share := shareOf(cfg.Consumer, members, cfg.Shards)

	for i, sh := range g.held {
		select {
		case <-sh.done: // ended on its own: lease lost, or the server went away
			delete(g.held, i)
			continue
		default:
		}
		if !share[i] {
			delete(g.held, i)
			g.release(sh)
		}
	}
	for i := range cfg.Shards {
		if _, ok := g.held[i]; ok || !share[i] {
			continue
		}
		key := shardKey(g.stream, cfg.ConsumerGroup, i)
		rec := record{Owner: cfg.Consumer, Leases: 1}
		sent := time.Now()
		var rev uint64
		if e, ok := entries[key]; !ok {
			rev, err = g.kv.Create(ctx, key, rec.bytes())
		} else {
			old, perr := parseRecord(e.Value())
			if perr != nil {
				g.logger.Error("a shard lease record does not parse; the shard is not read until it is repaired", "key", key, "error", perr)
				continue
			}
			free := old.Owner == "" || old.Owner == cfg.Consumer || now.Sub(g.seen[key].since) >= cfg.ShardLease
			if !free {
				continue // its owner's, until it gives it back or stops renewing
			}
			rec = old
			rec.Owner = cfg.Consumer
			rec.Leases++
			if old.Owner != "" && old.Owner != cfg.Consumer {
				rec.Stuck++
				g.logger.Info("taking over a shard whose owner stopped renewing", "shard", i, "previous_owner", old.Owner)
			}
			rev, err = g.kv.Update(ctx, key, rec.bytes(), e.Revision())
		}
		if err != nil {
			if !errors.Is(err, jetstream.ErrKeyExists) && !errors.Is(err, jetstream.ErrKeyRevisionMismatch) && g.ctx.Err() == nil {
				g.logger.Warn("taking a shard lease failed; will retry", "shard", i, "error", err)
			}
			continue // another consumer took it first
		}
		g.held[i] = g.start(i, key, rec, rev, sent)
	}
}

// list reads the group's leases and memberships.
func (g *group) list(ctx context.Context) (map[string]jetstream.KeyValueEntry, error) {
	w, err := g.kv.Watch(ctx, g.stream+"."+g.s.cfg.ConsumerGroup+".>", jetstream.IgnoreDeletes())
	if err != nil {
		return nil, err
	}
	defer func() { _ = w.Stop() }()
	entries := map[string]jetstream.KeyValueEntry{}
	for {
		select {
		case e, ok := <-w.Updates():
			if !ok {
				return nil, errors.New("the watch ended early")
			}
			if e == nil {
				return entries, nil
			}
			entries[e.Key()] = e
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// shareOf returns the shards of consumer: shard i is members[i mod
// len(members)]'s, members sorted.
func shareOf(consumer string, members []string, shards int) map[int]bool {
	members = slices.Clone(members)
	slices.Sort(members)
	share := make(map[int]bool)
	for i := range shards {
		if members[i%len(members)] == consumer {
			share[i] = true
		}
	}
	return share
}

// release gives sh back: it stops reading, waits a while for what it
// handed out to be settled, records the position and frees the lease.
func (g *group) release(sh *shard) {
	g.s.stats.released.Add(1)
	g.releasing.Go(func() {
		sh.stopSoft()
		<-sh.done
	})
}

// stop gives back every shard and leaves the group, then closes out.
func (g *group) stop() {
	for i, sh := range g.held {
		delete(g.held, i)
		g.release(sh)
	}
	g.releasing.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), g.s.cfg.Timeout)
	defer cancel()
	if err := g.kv.Delete(ctx, memberKey(g.stream, g.s.cfg.ConsumerGroup, g.s.cfg.Consumer)); err != nil {
		g.logger.Debug("leaving the group's members", "error", err)
	}
	close(g.out)
}
