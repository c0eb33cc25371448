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
		block := sub.cfg.BlockTime
		if claiming {
			block = -1 // more to reclaim: do not wait for new entries
		}
		// The read runs to its end even when the subscription stops, so the
		// entries it moves into our pending list are known and handed back.
		res, err := sub.client.XReadGroup(context.WithoutCancel(sub.ctx), &redis.XReadGroupArgs{
			Group:    sub.cfg.ConsumerGroup,
			Consumer: sub.cfg.Consumer,
			Streams:  []string{sub.stream, ">"},
			Count:    int64(n),
			Block:    block,
		}).Result()
		if errors.Is(err, redis.Nil) {
			sub.release(n)
			readBackoff.reset()
			continue
		}
		if err != nil {
			sub.release(n)
			sub.readFailed("read", err, readBackoff)
			continue
		}
		readBackoff.reset()
		got := 0
		for _, xs := range res {
			for _, xm := range xs.Messages {
				got++
				sub.accept(xm, 1)
			}
		}
		sub.release(n - got)
	}
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
func (sub *subscription) accept(xm redis.XMessage, count int64) {
	if xm.Values == nil {
		sub.reportTrimmed(xm.ID, "read")
		sub.release(1)
		return
	}
	msg, err := sub.cfg.Marshaler.Unmarshal(xm.Values)
	if err != nil {
		sub.s.stats.undecodable.Add(1)
		sub.logger.Error("undecodable entry; moving it to the dead-letter stream",
			"entry_id", xm.ID, "dead_letter_stream", sub.deadLetter, "error", err)
		if err := sub.writeDeadLetter(xm.ID, xm.Values, DeadLetterReasonUndecodable, err.Error(), bus.ClassPermanent, count); err != nil {
			// Left pending: it is reclaimed and tried again after ClaimIdle.
			sub.logger.Error("write dead letter", "entry_id", xm.ID, "error", err)
		} else {
			sub.ack(xm.ID)
		}
		sub.release(1)
		return
	}
	e := &entry{id: xm.ID, fields: xm.Values, msg: msg, key: bus.PartitionKey(msg), count: count}

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
	got := 0
	if streams, err := read.Result(); err == nil {
		for _, xs := range streams {
			for _, xm := range xs.Messages {
				got++
				sub.accept(xm, 1)
			}
		}
	}
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
