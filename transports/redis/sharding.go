package redis

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// shardGroup is a Subscribe call on a sharded topic: it keeps this
// consumer's membership of the group alive, works out which shards are its
// share, takes their leases, runs one shard subscription per shard it owns
// and gives back the shards that are no longer its share.
//
// Shares are computed alike by every member from the sorted list of live
// members: shard i belongs to member i mod len(members). Views may differ
// for a moment while members come and go; the leases keep ownership
// exclusive meanwhile, and a shard moves only when its lease is free.
type shardGroup struct {
	s      *Subscriber
	topic  string
	stream string
	logger *slog.Logger

	ctx    context.Context
	cancel context.CancelFunc
	out    chan *message.Message

	mu   sync.Mutex
	held map[int]*subscription // by shard, the running shard subscriptions

	releasing sync.WaitGroup // shards being given back
}

func (s *Subscriber) subscribeSharded(ctx context.Context, topic, stream string) (<-chan *message.Message, error) {
	if err := s.prepare(ctx, topic, stream); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	g := &shardGroup{
		s:      s,
		topic:  topic,
		stream: stream,
		logger: s.logger.With("topic", topic, "stream", stream, "shards", s.cfg.Shards),
		ctx:    ctx,
		cancel: cancel,
		out:    make(chan *message.Message),
		held:   make(map[int]*subscription),
	}
	go g.run()
	return g.out, nil
}

func (g *shardGroup) run() {
	defer g.s.subs.Done()
	stop := context.AfterFunc(g.s.closeCtx, g.cancel)
	defer stop()
	defer g.cancel()

	every := g.s.cfg.ShardLease / 3
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
		t.Reset(every)
	}
}

// balance renews this consumer's membership and leases, gives back the
// shards that are no longer its share and takes the free ones that are.
func (g *shardGroup) balance() {
	cfg := &g.s.cfg
	leaseMS := cfg.ShardLease.Milliseconds()
	ctx, cancel := context.WithTimeout(g.ctx, cfg.ShardLease/3)
	defer cancel()

	// Renew first: a lease is worth more than a membership.
	g.mu.Lock()
	held := make(map[int]*subscription, len(g.held))
	for i, sub := range g.held {
		held[i] = sub
	}
	g.mu.Unlock()
	for i, sub := range held {
		select {
		case <-sub.done: // stopped on its own: it found its lease lost
			g.lost(i, sub, "the shard subscription found its lease lost")
			continue
		default:
		}
		sent := time.Now()
		ok, err := renewScript.Run(ctx, g.s.client, []string{sub.fence.key}, sub.fence.value, leaseMS).Int()
		switch {
		case err != nil:
			g.logger.Warn("renewing a shard lease failed; will retry", "shard", i, "error", err)
		case ok == 1:
			sub.fence.extend(sent.Add(cfg.ShardLease))
		default:
			g.lost(i, sub, "another consumer holds its lease")
		}
	}

	members, err := membersScript.Run(ctx, g.s.client, []string{membersKey(g.stream, cfg.ConsumerGroup)},
		cfg.Consumer, leaseMS, "0").StringSlice()
	if err != nil {
		if g.ctx.Err() == nil {
			g.logger.Warn("renewing the group membership failed; will retry", "error", err)
		}
		return
	}
	share := shareOf(cfg.Consumer, members, cfg.Shards)

	g.mu.Lock()
	for i, sub := range g.held {
		if !share[i] {
			delete(g.held, i)
			g.release(i, sub)
		}
	}
	var free []int
	for i := range cfg.Shards {
		if _, ok := g.held[i]; share[i] && !ok {
			free = append(free, i)
		}
	}
	g.mu.Unlock()

	for _, i := range free {
		shard := shardStream(g.stream, i)
		key := ownerKey(shard, cfg.ConsumerGroup)
		sent := time.Now()
		token, err := acquireScript.Run(ctx, g.s.client, []string{key, epochKey(shard, cfg.ConsumerGroup)}, cfg.Consumer, leaseMS).Int64()
		if err != nil {
			if g.ctx.Err() == nil {
				g.logger.Warn("taking a shard lease failed; will retry", "shard", i, "error", err)
			}
			continue
		}
		if token == 0 {
			continue // still its previous owner's, until it gives it back or its lease ends
		}
		f := &fence{key: key, value: fmt.Sprintf("%d %s", token, cfg.Consumer), token: token, until: sent.Add(cfg.ShardLease)}
		g.start(i, shard, f)
	}
}

// shareOf returns the shards of consumer: shard i is members[i mod
// len(members)]'s, members sorted.
func shareOf(consumer string, members []string, shards int) map[int]bool {
	members = slices.Clone(members)
	slices.Sort(members)
	share := make(map[int]bool)
	if len(members) == 0 {
		return share
	}
	for i := range shards {
		if members[i%len(members)] == consumer {
			share[i] = true
		}
	}
	return share
}

// start runs a shard subscription of shard i under lease f.
func (g *shardGroup) start(i int, shard string, f *fence) {
	sub := newSubscription(g.ctx, g.s, g.topic, shard)
	sub.out = g.out
	sub.fence = f
	sub.done = make(chan struct{})
	sub.logger = sub.logger.With("shard", i, "lease_token", f.token)
	g.mu.Lock()
	g.held[i] = sub
	g.mu.Unlock()
	g.s.stats.shardsTaken.Add(1)
	sub.logger.Info("took a shard")
	go sub.run()
}

// lost forgets shard i, whose lease is no longer ours: its subscription
// stops without acknowledging or handing back anything.
func (g *shardGroup) lost(i int, sub *subscription, why string) {
	g.mu.Lock()
	if g.held[i] == sub {
		delete(g.held, i)
	}
	g.mu.Unlock()
	sub.fenced()
	g.s.stats.shardsLost.Add(1)
	sub.logger.Warn("lost a shard: " + why + "; its next owner delivers what this consumer had not acknowledged")
}

// release gives shard i back: its subscription stops (flushing its
// acknowledgements and handing back what it held, under the lease), then the
// lease is deleted so the shard's next owner can take it at once.
func (g *shardGroup) release(i int, sub *subscription) {
	g.s.stats.shardsReleased.Add(1)
	g.releasing.Add(1)
	go func() {
		defer g.releasing.Done()
		sub.cancel()
		<-sub.done
		if !sub.fence.valid() {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
		defer cancel()
		if err := releaseScript.Run(ctx, g.s.client, []string{sub.fence.key}, sub.fence.value).Err(); err != nil {
			sub.logger.Warn("giving back a shard lease failed; it ends on its own", "error", err)
			return
		}
		sub.logger.Info("gave back a shard")
	}()
}

// stop gives back every shard and leaves the group, then closes out.
func (g *shardGroup) stop() {
	g.mu.Lock()
	for i, sub := range g.held {
		delete(g.held, i)
		g.release(i, sub)
	}
	g.mu.Unlock()
	g.releasing.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	cfg := &g.s.cfg
	err := membersScript.Run(ctx, g.s.client, []string{membersKey(g.stream, cfg.ConsumerGroup)},
		cfg.Consumer, cfg.ShardLease.Milliseconds(), "1").Err()
	if err != nil {
		g.logger.Debug("leaving the group's members", "error", err)
	}
	close(g.out)
}
