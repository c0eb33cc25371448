package bus

import "fmt"

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
