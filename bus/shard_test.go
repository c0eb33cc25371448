package bus_test

import (
	"fmt"
	"hash/fnv"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/omnibus-go/omnibus/bus"
)

// The shard of a key is part of what is stored: these values must never
// change, or a release would move keys to other shards under a running
// group.
func TestShardOf_IsTheDocumentedHashAndNeverChanges(t *testing.T) {
	fixed := map[string]int{"": 5, "order-1": 5, "order-42": 4, "customer-7": 1, "ключ": 1}
	for key, want := range fixed {
		assert.Equal(t, want, bus.ShardOf(key, 8), "key %q", key)
		h := fnv.New32a()
		_, _ = h.Write([]byte(key))
		assert.Equal(t, int(h.Sum32()%8), bus.ShardOf(key, 8), "key %q is FNV-1a 32 mod 8", key)
	}
	assert.Equal(t, 0, bus.ShardOf("anything", 1))
}

func TestShardOf_SpreadsKeys(t *testing.T) {
	counts := make([]int, 16)
	for i := range 16000 {
		counts[bus.ShardOf(fmt.Sprintf("key-%d", i), 16)]++
	}
	for s, n := range counts {
		assert.InDelta(t, 1000, n, 200, "shard %d", s)
	}
}

func TestShardOf_RefusesAShardCountOutOfRange(t *testing.T) {
	assert.Panics(t, func() { bus.ShardOf("k", 0) })
	assert.Panics(t, func() { bus.ShardOf("k", bus.MaxShards+1) })
}
