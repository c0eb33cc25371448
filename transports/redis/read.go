package redis

import (
	"context"
	"errors"
	"time"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/redis/go-redis/v9"
)

// readLoop moves entries into the subscription: idle entries reclaimed with
// XAUTOCLAIM (at start and every ClaimInterval, until a scan of the pending
// list is complete) and new entries read with XREADGROUP, as many as there
// are free slots. One goroutine does both so neither starves the other of
// slots; a due reclaim runs at most BlockTime late.
func (sub *subscription) readLoop() {
	defer sub.loops.Done()
	var claimTick <-chan time.Time
	claiming := sub.cfg.ClaimInterval >= 0
	if sub.fence != nil {
		// A shard subscription first takes over all its shard's pending
		// entries (a previous owner's), in stream order, then reads new
		// ones; nobody else reads the shard meanwhile, so it never
		// reclaims again.
		claiming = true
	} else if claiming {
		t := time.NewTicker(sub.cfg.ClaimInterval)
		defer t.Stop()
		claimTick = t.C
	}
	cursor := "0-0"
	readBackoff, claimBackoff := newBackoff(), newBackoff()
	var acc *acceptor
	if sub.fence == nil {
		acc = sub.startAcceptor()
		defer acc.stop()
	}
	full := false // the last read filled its batch: more is likely waiting
	for sub.ctx.Err() == nil {
		n := sub.acquire(sub.cfg.BatchSize)
		if n == 0 {
			return
		}
		select {
		case <-claimTick:
			claiming = true
		default:
		}
		if claiming {
			// A reclaim sorts out what it takes back against what the
			// subscription holds: every entry read before it is accepted.
			acc.sync()
			used, next, err := sub.claimIdle(cursor, n)
			n -= used
			switch {
			case errors.Is(err, errFenced):
				sub.release(n)
				sub.fenced()
				return
			case err != nil:
				sub.readFailed("reclaim", err, claimBackoff)
				claiming, cursor = false, "0-0" // try again at the next tick
			case next == "0-0":
				claimBackoff.reset()
				claiming, cursor = false, "0-0"
			default:
				claimBackoff.reset()
				cursor = next
			}
			if n == 0 {
				continue
			}
			if sub.fence != nil && claiming {
				sub.release(n) // the takeover is not complete: nothing new yet
				continue
			}
		}
		if sub.fence != nil {
			sub.readShard(n, readBackoff)
			continue
		}
		entries, err := sub.readNew(n, claiming, full)
		if errors.Is(err, redis.Nil) {
			sub.release(n)
			readBackoff.reset()
			full = false
			continue
		}
		if err != nil {
			sub.release(n)
			sub.readFailed("read", err, readBackoff)
			full = false
			continue
		}
		readBackoff.reset()
		full = len(entries) == n
		acc.add(entries, n)
	}
}

// readNew reads up to n new entries. After a full batch, or while there is
// more to reclaim, it does not block; after a full batch it reads the reply
// raw (see readRaw). The read runs to its end even when the subscription
// stops, so the entries it moves into our pending list are known and handed
// back.
func (sub *subscription) readNew(n int, claiming, full bool) ([]streamEntry, error) {
	ctx := context.WithoutCancel(sub.ctx)
	if full {
		return readRaw(ctx, sub.client, sub.cfg.ConsumerGroup, sub.cfg.Consumer, sub.stream, n)
	}
	block := sub.cfg.BlockTime
	if claiming {
		block = -1 // more to reclaim: do not wait for new entries
	}
	res, err := sub.client.XReadGroup(ctx, &redis.XReadGroupArgs{
		Group:    sub.cfg.ConsumerGroup,
		Consumer: sub.cfg.Consumer,
		Streams:  []string{sub.stream, ">"},
		Count:    int64(n),
		Block:    block,
	}).Result()
	if err != nil {
		return nil, err
	}
	return entriesOf(res), nil
}

// acceptor accepts the entries of a subscription's reads in a goroutine of
// its own, in the order read, so that the next read is under way while a
// batch is decoded and handed out.
type acceptor struct {
	sub   *subscription
	queue chan readBatch
	done  chan struct{}
}

// readBatch is one read's entries and the slots it held: one for each entry,
// the rest to release. A batch with synced set carries nothing: synced is
// closed once every batch before it is accepted.
type readBatch struct {
	entries []streamEntry
	slots   int
	synced  chan struct{}
}

func (sub *subscription) startAcceptor() *acceptor {
	a := &acceptor{sub: sub, queue: make(chan readBatch, 1), done: make(chan struct{})}
	go a.run()
	return a
}

func (a *acceptor) run() {
	defer close(a.done)
	for b := range a.queue {
		if b.synced != nil {
			close(b.synced)
			continue
		}
		for _, e := range b.entries {
			a.sub.accept(e, 1)
		}
		a.sub.release(b.slots - len(b.entries))
	}
}

// add queues a read's entries.
func (a *acceptor) add(entries []streamEntry, slots int) {
	a.queue <- readBatch{entries: entries, slots: slots}
}

// sync returns once every batch added before it is accepted; a shard
// subscription, which accepts as it reads, has no acceptor.
func (a *acceptor) sync() {
	if a == nil {
		return
	}
	synced := make(chan struct{})
	a.queue <- readBatch{synced: synced}
	<-synced
}

// stop accepts what is queued and ends the acceptor.
func (a *acceptor) stop() {
	close(a.queue)
	<-a.done
}

// readFailed logs err, recreates the group if it vanished, and waits before
// the next try.
func (sub *subscription) readFailed(op string, err error, b *backoff) {
	if sub.ctx.Err() != nil {
		return
	}
	if redis.HasErrorPrefix(err, "NOGROUP") {
		sub.logger.Warn("consumer group or stream missing; recreating it", "op", op, "error", err)
		if err := sub.s.ensureGroup(sub.ctx, sub.stream); err == nil {
			return
		}
	} else {
		sub.logger.Warn("redis call failed; will retry", "op", op, "error", err)
	}
	sleep(sub.ctx, b.next())
}

// accept takes over an entry read or claimed into our pending list; the
// caller has taken a slot for it.
func (sub *subscription) accept(se streamEntry, count int64) {
	if se.fields == nil {
		sub.reportTrimmed(se.id, "read")
		sub.release(1)
		return
	}
	msg, err := sub.decode(se.fields)
	if err != nil {
		sub.s.stats.undecodable.Add(1)
		sub.logger.Error("undecodable entry; moving it to the dead-letter stream",
			"entry_id", se.id, "dead_letter_stream", sub.deadLetter, "error", err)
		if err := sub.writeDeadLetter(se.id, se.fields, DeadLetterReasonUndecodable, err.Error(), bus.ClassPermanent, count); err != nil {
			// Left pending: it is reclaimed and tried again after ClaimIdle.
			sub.logger.Error("write dead letter", "entry_id", se.id, "error", err)
		} else {
			sub.ack(se.id)
		}
		sub.release(1)
		return
	}
	e := &entry{id: se.id, fields: se.fields, msg: msg, key: bus.PartitionKey(msg), count: count}

	sub.mu.Lock()
	e.touched = time.Now()
	sub.held[e.id] = e
	if sub.cfg.OrderByKey && e.key != "" {
		if q, busy := sub.keys[e.key]; busy {
			sub.keys[e.key] = append(q, e)
			sub.mu.Unlock()
			return
		}
		sub.keys[e.key] = nil
	}
	sub.mu.Unlock()
	sub.start(e)
}

// readShard reads up to n new entries of a shard (the caller holds n slots)
// while its lease is ours: the read runs in a MULTI under WATCH of the
// lease key, after checking the lease's value, so a lease taken or ended in
// between aborts it. When there is nothing new it waits, with a plain XREAD
// that changes nothing in the group, for an entry after the last one.
func (sub *subscription) readShard(n int, b *backoff) {
	if !sub.fence.valid() {
		sub.release(n)
		sub.fenced()
		return
	}
	ctx := context.WithoutCancel(sub.ctx)
	var read *redis.XStreamSliceCmd
	var last *redis.XMessageSliceCmd
	err := sub.client.Watch(ctx, func(tx *redis.Tx) error {
		v, err := tx.Get(ctx, sub.fence.key).Result()
		if errors.Is(err, redis.Nil) || (err == nil && v != sub.fence.value) {
			return errFenced
		}
		if err != nil {
			return err
		}
		_, err = tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
			read = p.XReadGroup(ctx, &redis.XReadGroupArgs{
				Group: sub.cfg.ConsumerGroup, Consumer: sub.cfg.Consumer,
				Streams: []string{sub.stream, ">"}, Count: int64(n), Block: -1,
			})
			last = p.XRevRangeN(ctx, sub.stream, "+", "-", 1)
			return nil
		})
		return err
	}, sub.fence.key)
	switch {
	case errors.Is(err, errFenced):
		sub.release(n)
		sub.fenced()
		return
	case errors.Is(err, redis.TxFailedErr):
		sub.release(n) // the lease key changed (a renewal, or lost): look again
		return
	case err != nil && !errors.Is(err, redis.Nil):
		sub.release(n)
		sub.readFailed("read", err, b)
		return
	}
	b.reset()
	var entries []streamEntry
	if streams, err := read.Result(); err == nil {
		entries = entriesOf(streams)
	}
	for _, e := range entries {
		sub.accept(e, 1)
	}
	got := len(entries)
	sub.release(n - got)
	if got > 0 {
		return
	}
	after := "0-0"
	if msgs, err := last.Result(); err == nil && len(msgs) > 0 {
		after = msgs[0].ID
	}
	block := min(sub.cfg.BlockTime, sub.cfg.ShardLease/4)
	err = sub.client.XRead(sub.ctx, &redis.XReadArgs{Streams: []string{sub.stream, after}, Count: 1, Block: block}).Err()
	if err != nil && !errors.Is(err, redis.Nil) && sub.ctx.Err() == nil {
		sub.readFailed("wait", err, b)
	}
}

// fenced stops a shard subscription whose lease is lost: it hands out,
// acknowledges and hands back nothing more of the shard.
func (sub *subscription) fenced() {
	if sub.fence == nil {
		return
	}
	sub.fence.lose()
	sub.cancel()
}
