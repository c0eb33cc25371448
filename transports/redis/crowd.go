package redis

import (
	"context"
	"time"
)

// With one stream per topic (Shards 1) a consumer group hands entries to
// whichever consumer asks, so per-key order (OrderByKey) holds only while
// one consumer reads the stream. A subscription that orders by key watches
// the group and warns when other consumers receive entries of its stream:
// the user scaled out without sharding (docs/receiving.md, "Scaling out on
// Redis").
const (
	// defaultCrowdEvery is how often the group's consumers are listed.
	defaultCrowdEvery = 30 * time.Second
	// crowdRecent is how recently another consumer must have received an
	// entry to count as reading the stream (Redis 7.0 resets a consumer's
	// idle time only when it is delivered entries).
	crowdRecent = time.Minute
	// crowdRepeat is how long a warning is not repeated while the crowd
	// stays.
	crowdRepeat = 10 * time.Minute
)

// crowdLoop runs beside the reader of a single-stream subscription that
// orders by key.
func (sub *subscription) crowdLoop() {
	defer sub.loops.Done()
	t := time.NewTicker(sub.s.crowdEvery)
	defer t.Stop()
	var warned time.Time
	for {
		select {
		case <-t.C:
		case <-sub.ctx.Done():
			return
		}
		others, err := sub.otherReaders(sub.ctx)
		if err != nil || len(others) == 0 {
			continue // a failed listing is only a missed warning
		}
		if !warned.IsZero() && time.Since(warned) < crowdRepeat {
			continue
		}
		warned = time.Now()
		sub.logger.Warn("other consumers of this group receive entries of this stream: with redis.shards 1 a key's messages go to whichever consumer reads next, so per-key order does not hold; set redis.shards above 1 on every publisher and subscriber of the topic (docs/receiving.md, Scaling out on Redis)",
			"consumer_group", sub.cfg.ConsumerGroup, "consumer", sub.cfg.Consumer, "other_consumers", others)
	}
}

// otherReaders returns the consumers of the group, other than this one,
// that were delivered entries of the stream within crowdRecent.
func (sub *subscription) otherReaders(ctx context.Context) ([]string, error) {
	consumers, err := sub.client.XInfoConsumers(ctx, sub.stream, sub.cfg.ConsumerGroup).Result()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, c := range consumers {
		if c.Name != sub.cfg.Consumer && c.Idle < crowdRecent {
			out = append(out, c.Name)
		}
	}
	return out, nil
}
