package redis

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"
)

// ack queues id for the next XACK.
func (sub *subscription) ack(id string) {
	sub.ackMu.Lock()
	sub.acks = append(sub.acks, id)
	sub.acked[id] = struct{}{}
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
		sub.ackMu.Lock()
		ids := sub.acks
		sub.acks = nil
		sub.ackMu.Unlock()
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
			sub.ackMu.Unlock()
			return fmt.Errorf("ack %d entries of stream %q: %w", len(ids), sub.stream, err)
		}
	}
}

// ackConfirmed forgets acked ids whose XACK Redis has answered (or refused
// for good): a reclaim that begins from now on cannot return them. A reclaim
// already running may, so it forgets them when it ends.
func (sub *subscription) ackConfirmed(ids []string) {
	sub.ackMu.Lock()
	defer sub.ackMu.Unlock()
	if sub.reclaiming {
		sub.ackedLate = append(sub.ackedLate, ids...)
		return
	}
	for _, id := range ids {
		delete(sub.acked, id)
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
		for _, id := range sub.ackedLate {
			delete(sub.acked, id)
		}
		sub.ackedLate = nil
	}
}

// ours reports whether a reclaimed entry is one this subscription holds or
// has acked, taken back from itself. It looks at held first: an entry leaves
// held only after its ack is queued, so it is in one or the other.
func (sub *subscription) ours(id string) bool {
	sub.mu.Lock()
	_, held := sub.held[id]
	sub.mu.Unlock()
	if held {
		return true
	}
	sub.ackMu.Lock()
	defer sub.ackMu.Unlock()
	_, acked := sub.acked[id]
	return acked
}

// xack acknowledges ids: with XACK, or for a shard subscription only while
// its lease is ours (errFenced otherwise).
func (sub *subscription) xack(ctx context.Context, ids []string) error {
	if sub.fence == nil {
		return sub.client.XAck(ctx, sub.stream, sub.cfg.ConsumerGroup, ids...).Err()
	}
	argv := make([]any, 0, 2+len(ids))
	argv = append(argv, sub.cfg.ConsumerGroup, sub.fence.value)
	for _, id := range ids {
		argv = append(argv, id)
	}
	n, err := fencedAckScript.Run(ctx, sub.client, []string{sub.stream, sub.fence.key}, argv...).Int64()
	if err != nil {
		return err
	}
	if n < 0 {
		return errFenced
	}
	return nil
}
