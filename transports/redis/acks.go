package redis

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"
)

// ack queues id for the next XACK.
func (sub *subscription) ack(id string) {
	sub.ackMu.Lock()
	sub.acks = append(sub.acks, id)
	sub.ackMu.Unlock()
	select {
	case sub.ackSignal <- struct{}{}:
	default:
	}
}

// ackLoop sends the queued acks, all that have piled up since the last XACK
// (and within ackLinger) in one call.
func (sub *subscription) ackLoop() {
	defer close(sub.ackDone)
	b := newBackoff()
	linger := time.NewTimer(0)
	<-linger.C
	for {
		select {
		case <-sub.ackSignal:
		case <-sub.ackStop:
			if err := sub.flushAcks(); err != nil {
				sub.logger.Error("last acks failed; those entries stay pending and will be redelivered", "error", err)
			}
			return
		}
		// Let a small batch grow for a moment: one XACK for many entries
		// costs Redis and us far less than many XACKs.
		sub.ackMu.Lock()
		small := len(sub.acks) < ackChunk
		sub.ackMu.Unlock()
		if small {
			linger.Reset(ackLinger)
			select {
			case <-linger.C:
			case <-sub.ackStop:
				linger.Stop()
			}
		}
		if err := sub.flushAcks(); err != nil {
			sub.logger.Warn("ack failed; will retry", "error", err)
			select {
			case <-time.After(b.next()):
			case <-sub.ackStop:
			}
			select {
			case sub.ackSignal <- struct{}{}:
			default:
			}
			continue
		}
		b.reset()
	}
}

func (sub *subscription) flushAcks() error {
	for {
		ids := sub.takeAcks()
		if len(ids) == 0 {
			return nil
		}
		ctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
		var err error
		for chunk := range slices.Chunk(ids, ackChunk) {
			if err = sub.xack(ctx, chunk); err != nil {
				break
			}
		}
		cancel()
		if err == nil || errors.Is(err, errFenced) {
			sub.ackConfirmed(ids)
		}
		if errors.Is(err, errFenced) {
			// Not ours to acknowledge any more: the shard's next owner
			// delivers these entries again.
			sub.logger.Warn("shard lease lost; leaving the acknowledgements to the shard's next owner", "entries", len(ids))
			sub.fenced()
			continue
		}
		if err != nil {
			sub.ackMu.Lock()
			sub.acks = append(ids, sub.acks...)
			sub.sending = nil
			sub.ackMu.Unlock()
			return fmt.Errorf("ack %d entries of stream %q: %w", len(ids), sub.stream, err)
		}
	}
}

// takeAcks returns the queued acks for an XACK, and keeps them as being
// sent until ackConfirmed (or a failure queues them again).
func (sub *subscription) takeAcks() []string {
	sub.ackMu.Lock()
	defer sub.ackMu.Unlock()
	ids := sub.acks
	sub.acks, sub.sending = nil, ids
	return ids
}

// ackConfirmed forgets the acks being sent, whose XACK Redis has answered
// (or refused for good): a reclaim that begins from now on cannot return
// them. A reclaim already running may, so it keeps them until it ends.
func (sub *subscription) ackConfirmed(ids []string) {
	sub.ackMu.Lock()
	defer sub.ackMu.Unlock()
	sub.sending = nil
	if sub.reclaiming {
		sub.ackedLate = append(sub.ackedLate, ids...)
	}
}

// reclaimBegins marks a reclaim running until the function it returns is
// called; meanwhile ackConfirmed keeps the ids it is given.
func (sub *subscription) reclaimBegins() (ends func()) {
	sub.ackMu.Lock()
	sub.reclaiming = true
	sub.ackMu.Unlock()
	return func() {
		sub.ackMu.Lock()
		defer sub.ackMu.Unlock()
		sub.reclaiming = false
		sub.ackedLate = nil
	}
}

// ours reports which of ids (entries a reclaim took) this subscription
// holds or has acked, taken back from itself. It looks at held first: an
// entry leaves held only after its ack is queued, so it is in one or the
// other, provided the acks are looked at after held. They are gathered once
// per call, and only when some id is not held: acks are many and reclaims
// rare, so an ack pays for no index of its own.
func (sub *subscription) ours(ids []string) []bool {
	mine := make([]bool, len(ids))
	all := true
	sub.mu.Lock()
	for i, id := range ids {
		_, mine[i] = sub.held[id]
		all = all && mine[i]
	}
	sub.mu.Unlock()
	if all {
		return mine
	}
	acked := sub.unconfirmedAcks()
	for i, id := range ids {
		if !mine[i] {
			_, mine[i] = acked[id]
		}
	}
	return mine
}

// unconfirmedAcks returns the ids acked here whose XACK is not confirmed
// yet (queued or being sent), and, while a reclaim runs, those confirmed
// since it began: a reclaim that ran in Redis before an XACK returns the
// entry as if it were idle, and must not hand it out again.
func (sub *subscription) unconfirmedAcks() map[string]struct{} {
	sub.ackMu.Lock()
	defer sub.ackMu.Unlock()
	m := make(map[string]struct{}, len(sub.acks)+len(sub.sending)+len(sub.ackedLate))
	for _, ids := range [][]string{sub.acks, sub.sending, sub.ackedLate} {
		for _, id := range ids {
			m[id] = struct{}{}
		}
	}
	return m
}

// xack acknowledges ids: with XACK, or for a shard subscription only while
// its lease is ours (errFenced otherwise).
//
// The ids go into the command as *string, which go-redis writes as the
// string: boxing each id in an interface cost an allocation per message.
func (sub *subscription) xack(ctx context.Context, ids []string) error {
	if sub.fence == nil {
		args := make([]any, 0, 3+len(ids))
		args = append(args, "xack", sub.stream, sub.cfg.ConsumerGroup)
		args = appendIDs(args, ids)
		cmd := redis.NewIntCmd(ctx, args...)
		_ = sub.client.Process(ctx, cmd)
		return cmd.Err()
	}
	argv := make([]any, 0, 2+len(ids))
	argv = append(argv, sub.cfg.ConsumerGroup, sub.fence.value)
	argv = appendIDs(argv, ids)
	n, err := fencedAckScript.Run(ctx, sub.client, []string{sub.stream, sub.fence.key}, argv...).Int64()
	if err != nil {
		return err
	}
	if n < 0 {
		return errFenced
	}
	return nil
}

// appendIDs appends a pointer to each of ids to args. ids must not change
// until the command that args make has run.
func appendIDs(args []any, ids []string) []any {
	for i := range ids {
		args = append(args, &ids[i])
	}
	return args
}
