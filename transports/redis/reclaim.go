package redis

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"
)

// claimIdle takes over up to n entries idle for ClaimIdle in the group's
// pending list, scanning it from cursor. The caller holds n slots; claimIdle
// keeps one for each entry it takes over and reports how many it used, and
// the cursor to continue from ("0-0" when the scan is complete). A shard
// subscription takes over every pending entry of its shard, idle or not,
// and only while its lease is ours (errFenced otherwise).
func (sub *subscription) claimIdle(cursor string, n int) (used int, next string, err error) {
	keys, minIdle, check := []string{sub.stream}, sub.cfg.ClaimIdle.Milliseconds(), ""
	if sub.fence != nil {
		keys, minIdle, check = append(keys, sub.fence.key), 0, sub.fence.value
	}
	// Acks answered from here until the claimed entries are sorted out
	// below may be of entries this reclaim takes back (ours).
	ends := sub.reclaimBegins()
	defer ends()
	raw, err := autoClaimScript.Run(sub.ctx, sub.client, keys,
		sub.cfg.ConsumerGroup, sub.cfg.Consumer, minIdle, cursor, n, check).Result()
	if redis.HasErrorPrefix(err, "FENCED") {
		return 0, "", errFenced
	}
	if err != nil {
		return 0, "", fmt.Errorf("reclaim idle entries of stream %q: %w", sub.stream, err)
	}
	next, claimed, counts, trimmed, err := parseAutoClaim(raw)
	if err != nil {
		return 0, "", err
	}
	for _, id := range trimmed {
		sub.reportTrimmed(id, "reclaim")
	}
	ids := make([]string, len(claimed))
	for i, se := range claimed {
		ids[i] = se.id
	}
	ours := sub.ours(ids)
	for i, se := range claimed {
		if ours[i] {
			// Taken back from ourselves: held, or acked with its XACK on
			// its way (which removes it from the pending list again).
			sub.release(1)
			continue
		}
		sub.s.stats.reclaimed.Add(1)
		sub.logger.Debug("reclaimed idle entry", "entry_id", se.id, "deliveries", counts[i])
		sub.accept(se, counts[i])
	}
	return len(claimed), next, nil
}

func parseAutoClaim(raw any) (next string, entries []streamEntry, counts []int64, trimmed []string, err error) {
	bad := func(what string) error { return fmt.Errorf("unexpected XAUTOCLAIM reply: %s", what) }
	parts, ok := raw.([]any)
	if !ok || len(parts) < 3 {
		return "", nil, nil, nil, bad("not a 3-4 element array")
	}
	if next, ok = parts[0].(string); !ok {
		return "", nil, nil, nil, bad("cursor")
	}
	claimed, _ := parts[1].([]any)
	cs, _ := parts[2].([]any)
	if len(cs) != len(claimed) {
		return "", nil, nil, nil, bad("counts")
	}
	for i, e := range claimed {
		pair, ok := e.([]any)
		if !ok || len(pair) != 2 {
			return "", nil, nil, nil, bad("entry")
		}
		id, _ := pair[0].(string)
		flat, _ := pair[1].([]any)
		f := make(fields, 0, len(flat))
		for j := 0; j+1 < len(flat); j += 2 {
			f = append(f, fieldText(flat[j]), fieldText(flat[j+1]))
		}
		c, _ := cs[i].(int64)
		entries = append(entries, streamEntry{id: id, fields: f})
		counts = append(counts, c)
	}
	if len(parts) > 3 {
		ids, _ := parts[3].([]any)
		for _, id := range ids {
			if s, ok := id.(string); ok {
				trimmed = append(trimmed, s)
			}
		}
	}
	return next, entries, counts, trimmed, nil
}

func (sub *subscription) reportTrimmed(id, op string) {
	sub.s.stats.trimmed.Add(1)
	sub.logger.Error("pending entry was trimmed from the stream before it was acked; its data is lost to this group",
		"entry_id", id, "op", op)
}

// touchLoop resets the idle time of the entries the subscription holds, so
// other consumers do not reclaim them while a handler runs or a retry waits.
func (sub *subscription) touchLoop() {
	defer sub.loops.Done()
	every := max(sub.cfg.ClaimIdle/3, time.Millisecond)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-sub.ctx.Done():
			return
		}
		var args []claimArg
		var entries []*entry
		now := time.Now()
		sub.mu.Lock()
		for _, e := range sub.held {
			if !e.lost && now.Sub(e.touched) >= every {
				args = append(args, claimArg{id: e.id})
				entries = append(entries, e)
			}
		}
		sub.mu.Unlock()
		if len(args) == 0 {
			continue
		}
		res, err := sub.claimOwn(sub.ctx, args)
		if err != nil {
			if sub.ctx.Err() == nil {
				sub.logger.Warn("redis call failed; will retry", "op", "touch", "error", err)
			}
			continue
		}
		sub.mu.Lock()
		for i, e := range entries {
			switch res[i] {
			case claimLost:
				e.lost = true
				sub.logger.Warn("held entry was reclaimed by another consumer (this one stalled longer than ClaimIdle)", "entry_id", e.id)
			case claimTrimmed:
				e.touched = now
				sub.mu.Unlock()
				sub.reportTrimmed(e.id, "touch")
				sub.mu.Lock()
			default:
				e.touched = now
			}
		}
		sub.mu.Unlock()
	}
}

const (
	claimLost    = -1
	claimTrimmed = -2
)

type claimArg struct {
	id    string
	idle  time.Duration
	delta int64
}

// claimOwn runs claimOwnScript over args, in chunks.
func (sub *subscription) claimOwn(ctx context.Context, args []claimArg) ([]int64, error) {
	out := make([]int64, 0, len(args))
	for chunk := range slices.Chunk(args, ackChunk) {
		argv := make([]any, 0, 2+3*len(chunk))
		argv = append(argv, sub.cfg.ConsumerGroup, sub.cfg.Consumer)
		for _, a := range chunk {
			argv = append(argv, a.id, a.idle.Milliseconds(), a.delta)
		}
		res, err := claimOwnScript.Run(ctx, sub.client, []string{sub.stream}, argv...).Int64Slice()
		if err != nil {
			return nil, fmt.Errorf("claim own entries of stream %q: %w", sub.stream, err)
		}
		if len(res) != len(chunk) {
			return nil, fmt.Errorf("claim own entries of stream %q: %d results for %d entries", sub.stream, len(res), len(chunk))
		}
		out = append(out, res...)
	}
	return out, nil
}
