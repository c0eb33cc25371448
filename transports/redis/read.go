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
	if claiming {
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
	if _, dup := sub.held[e.id]; dup {
		// Reclaimed from ourselves: we hold it already.
		sub.mu.Unlock()
		sub.release(1)
		return
	}
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
