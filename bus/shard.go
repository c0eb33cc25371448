package bus

import (
	"context"
	"fmt"
)

// MaxShards bounds the shard count of a sharded topic (ShardOf's shards).
const MaxShards = 1024

// ShardOf returns the shard, in [0, shards), of a partition key: the 32-bit
// FNV-1a hash of the key's bytes modulo shards. Every transport that spreads
// a topic over shards by key (the Redis transport's key-sharded streams)
// uses it, in publishers and subscribers alike, so that a key lives in one
// shard; the function is part of the stored layout and never changes
// between releases. It panics when shards is not in [1, MaxShards]; callers
// validate their configuration first.
func ShardOf(key string, shards int) int {
	if shards < 1 || shards > MaxShards {
		panic(fmt.Sprintf("bus.ShardOf: %d shards, want 1 to %d", shards, MaxShards))
	}
	const (
		offset32 = 2166136261
		prime32  = 16777619
	)
	h := uint32(offset32)
	for i := 0; i < len(key); i++ {
		h ^= uint32(key[i])
		h *= prime32
	}
	return int(h % uint32(shards))
}

// ShardStatus is one shard of a sharded topic as a consumer group sees it.
type ShardStatus struct {
	// Shard is the shard's number, from 0.
	Shard int `json:"shard"`
	// Stream names where the shard lives in the broker.
	Stream string `json:"stream"`
	// Owner is the consumer that holds the shard's lease; "" when none does.
	Owner string `json:"owner"`
	// Lag is how many of the shard's messages the group has not been handed
	// yet; -1 when the broker cannot tell.
	Lag int64 `json:"lag"`
	// Pending is how many were handed out and not yet acknowledged; -1
	// when the broker cannot tell (what a consumer holds lives in its
	// memory).
	Pending int64 `json:"pending"`
	// Leases is how many times a consumer of the group took the shard's
	// lease: it grows with every rebalance, takeover and restart.
	Leases int64 `json:"leases"`
}

// ShardReporter is implemented by brokers that spread topics over shards
// owned by one consumer of a group at a time (the redis broker with
// redis.shards above 1). ShardStatus returns nil for a topic that is not
// sharded.
type ShardReporter interface {
	ShardStatus(ctx context.Context, topic, group string) ([]ShardStatus, error)
}

// ShardStatus reports the shards of topic for group when the broker shards
// topics (see ShardReporter): nil, nil when it does not. It waits for the
// broker's connection.
func (b *Conn) ShardStatus(ctx context.Context, topic, group string) ([]ShardStatus, error) {
	if err := b.WaitBroker(ctx); err != nil {
		return nil, err
	}
	br, err := b.broker.current()
	if err != nil {
		return nil, err
	}
	r, ok := br.(ShardReporter)
	if !ok {
		return nil, nil
	}
	return r.ShardStatus(ctx, topic, group)
}
