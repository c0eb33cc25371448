package redis_test

import (
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/internal/testenv"
	omniredis "github.com/omnibus-go/omnibus/transports/redis"
)

// The sharding and cluster keys work from YAML and from the environment.
func TestConfig_ShardsAndClusterFromYAMLAndEnv(t *testing.T) {
	cfg, err := testenv.ParseConfig("broker: redis\nredis:\n  cluster_addrs: [127.0.0.1:7001, 127.0.0.1:7002]\n  shards: 8\n  shard_lease: 3s\n", nil)
	require.NoError(t, err)
	r := omniredis.Section(cfg)
	assert.Equal(t, []string{"127.0.0.1:7001", "127.0.0.1:7002"}, r.ClusterAddrs)
	assert.Empty(t, r.Addr, "no default addr beside cluster_addrs")
	assert.Equal(t, 8, r.Shards)
	assert.Equal(t, 3*time.Second, r.ShardLease)

	cfg, err = testenv.ParseConfig("broker: redis\n", map[string]string{
		"OMNIBUS_REDIS_SHARDS": "16", "OMNIBUS_REDIS_SHARD_LEASE": "2s",
		"OMNIBUS_REDIS_CLUSTER_ADDRS": "127.0.0.1:7001,127.0.0.1:7003",
	})
	require.NoError(t, err)
	r = omniredis.Section(cfg)
	assert.Equal(t, 16, r.Shards)
	assert.Equal(t, 2*time.Second, r.ShardLease)
	assert.Equal(t, []string{"127.0.0.1:7001", "127.0.0.1:7003"}, r.ClusterAddrs)

	cfg, err = testenv.ParseConfig("broker: redis\n", nil)
	require.NoError(t, err)
	r = omniredis.Section(cfg)
	assert.Equal(t, omniredis.DefaultShards, r.Shards)
	assert.Equal(t, omniredis.DefaultAddr, r.Addr)
}

func TestConfig_BadShardingAndClusterValuesNameTheKey(t *testing.T) {
	for _, tc := range []struct{ yaml, key, reason string }{
		{"redis:\n  shards: 1025\n", "redis.shards", "not between 1 and 1024"},
		{"redis:\n  shards: -2\n", "redis.shards", "not between 1 and 1024"},
		{"redis:\n  shard_lease: 10ms\n", "redis.shard_lease", "shorter than 100ms"},
		{"redis:\n  addr: 127.0.0.1:6379\n  cluster_addrs: [127.0.0.1:7001]\n", "redis.cluster_addrs", "together with redis.addr"},
		{"redis:\n  cluster_addrs: [nonsense]\n", "redis.cluster_addrs[0]", "not host:port"},
	} {
		_, err := testenv.ParseConfig("broker: redis\n"+tc.yaml, nil)
		require.Error(t, err, tc.yaml)
		assert.ErrorIs(t, err, bus.ErrInvalidConfig)
		assert.Contains(t, err.Error(), tc.key+":", tc.yaml)
		assert.Contains(t, err.Error(), tc.reason, tc.yaml)
	}
}

// broker: redis with redis.cluster_addrs opens a cluster client: sharded
// streams spread over the nodes.
func TestBroker_ClusterAddrsOpensAClusterClient(t *testing.T) {
	e := newClusterEnv(t)
	cfg, err := testenv.ParseConfig("broker: redis\n", map[string]string{
		"OMNIBUS_REDIS_CLUSTER_ADDRS": strings.Join(testenv.RedisClusterAddrs(), ","),
		"OMNIBUS_REDIS_STREAM_PREFIX": e.prefix, "OMNIBUS_REDIS_SHARDS": "8",
	})
	require.NoError(t, err)
	b, err := bus.OpenBroker(t.Context(), cfg)
	require.NoError(t, err)
	defer b.Close()
	e.publish(withKey(b.Publisher()), "spread", 64)
	nodes := map[string]bool{}
	for i := range 8 {
		stream := e.prefix + "spread:shard:{" + strconv.Itoa(i) + "}"
		n, err := e.client.XLen(t.Context(), stream).Result()
		require.NoError(t, err)
		assert.Positive(t, n, "shard %d holds entries", i)
		node, err := e.client.(*goredis.ClusterClient).MasterForKey(t.Context(), stream)
		require.NoError(t, err)
		nodes[node.Options().Addr] = true
	}
	assert.Greater(t, len(nodes), 1, "the shards of a topic spread over the cluster's nodes")
}
