package redis

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/redis/go-redis/v9"
)

// settle applies the settlement of a nacked entry. It returns true when the
// entry is due for redelivery, false when it is finished with.
func (sub *subscription) settle(e *entry, st bus.Settlement, ok bool) bool {
	r := bus.RedeliveryFor(st, ok, sub.cfg.NackDelay)
	if r.GiveUp {
		return sub.giveUp(e, st)
	}
	due, counted := r.Due, r.Counted
	sub.mu.Lock()
	e.waiting, e.dueAt, e.counted = true, due, counted
	sub.mu.Unlock()
	sub.logger.Debug("nacked; redelivering later", "entry_id", e.id, "retry_at", due, "counted", counted)

	if !sleep(sub.ctx, time.Until(due)) {
		sub.finish(e, false)
		return false
	}
	// Redeliver: a counted failure adds one to the delivery count in the
	// pending list, a transient one leaves it; either way the idle time is
	// reset so nobody reclaims the entry while it is out again.
	var delta int64
	if counted {
		delta = 1
	}
	b := newBackoff()
	for {
		res, err := sub.claimOwn(sub.ctx, []claimArg{{id: e.id, delta: delta}})
		if err == nil {
			switch n := res[0]; {
			case n == claimLost:
				sub.logger.Info("nacked entry was reclaimed by another consumer; leaving it to them", "entry_id", e.id)
				sub.finish(e, true)
				return false
			case n == claimTrimmed:
				sub.reportTrimmed(e.id, "redeliver")
				e.count += delta // still handed out, from memory
			default:
				e.count = n
			}
			break
		}
		if sub.ctx.Err() != nil {
			sub.finish(e, false)
			return false
		}
		sub.logger.Warn("redis call failed; will retry", "op", "redeliver", "entry_id", e.id, "error", err)
		if !sleep(sub.ctx, b.next()) {
			sub.finish(e, false)
			return false
		}
	}
	sub.mu.Lock()
	e.waiting = false
	e.touched = time.Now()
	sub.mu.Unlock()
	return true
}

// giveUp copies e to the dead-letter stream and acks it, retrying the copy
// every NackDelay while Redis refuses it.
func (sub *subscription) giveUp(e *entry, st bus.Settlement) bool {
	sub.mu.Lock()
	e.waiting, e.dueAt, e.counted = true, time.Now(), true
	sub.mu.Unlock()
	for {
		err := sub.writeDeadLetter(e.id, e.fields, DeadLetterReasonGaveUp, st.Error, st.Class, e.count)
		if err == nil {
			sub.logger.Info("gave up on entry; moved it to the dead-letter stream",
				"entry_id", e.id, "event_id", e.msg.UUID, "dead_letter_stream", sub.deadLetter,
				"deliveries", e.count, "reason", st.Error)
			sub.ack(e.id)
			sub.finish(e, true)
			return false
		}
		sub.logger.Error("write dead letter; will retry", "entry_id", e.id, "error", err)
		if !sleep(sub.ctx, sub.cfg.NackDelay) {
			sub.finish(e, false)
			return false
		}
	}
}

// writeDeadLetter copies the entry id (its fields) to the dead-letter
// stream with the reason fields, replacing any an earlier dead-lettering left.
func (sub *subscription) writeDeadLetter(id string, f fields, reason, errText string, class bus.Class, deliveries int64) error {
	if errText == "" {
		errText = "given up"
	}
	values := make([]any, 0, len(f)+18)
	for i := 0; i+1 < len(f); i += 2 {
		if strings.HasPrefix(f[i], FieldMetadataPrefix+bus.DeadLetterPrefix) {
			continue
		}
		values = append(values, f[i], f[i+1])
	}
	values = append(values,
		FieldMetadataPrefix+KeyDeadLetterReason, reason,
		FieldMetadataPrefix+KeyDeadLetterError, errText,
		FieldMetadataPrefix+KeyDeadLetterClass, class.String(),
		FieldMetadataPrefix+KeyDeadLetterAttempts, strconv.FormatInt(deliveries, 10),
		FieldMetadataPrefix+KeyDeadLetterStream, sub.stream,
		FieldMetadataPrefix+KeyDeadLetterID, id,
		FieldMetadataPrefix+KeyDeadLetterGroup, sub.cfg.ConsumerGroup,
		FieldMetadataPrefix+KeyDeadLetterConsumer, sub.cfg.Consumer,
		FieldMetadataPrefix+KeyDeadLetterAt, time.Now().UTC().Format(time.RFC3339Nano),
	)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(sub.ctx), shutdownTimeout)
	defer cancel()
	err := sub.client.XAdd(ctx, &redis.XAddArgs{Stream: sub.deadLetter, Values: values}).Err()
	if err != nil {
		return classify(fmt.Errorf("copy entry %s of stream %q to dead-letter stream %q: %w", id, sub.stream, sub.deadLetter, err))
	}
	sub.s.stats.deadLettered.Add(1)
	return nil
}
