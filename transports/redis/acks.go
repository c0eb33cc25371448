package redis

import (
	"context"
	"fmt"
	"slices"
	"time"
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
			if err = sub.client.XAck(ctx, sub.stream, sub.cfg.ConsumerGroup, chunk...).Err(); err != nil {
				break
			}
		}
		cancel()
		if err != nil {
			sub.ackMu.Lock()
			sub.acks = append(ids, sub.acks...)
			sub.ackMu.Unlock()
			return fmt.Errorf("ack %d entries of stream %q: %w", len(ids), sub.stream, err)
		}
	}
}
