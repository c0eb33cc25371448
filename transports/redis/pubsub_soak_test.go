//go:build soak

package redis_test

import "testing"

// TestSoak_PubSubRedisClusterFullSize runs the universal suite against the
// Redis Cluster at full size; TestPubSub_RedisCluster runs it in short mode
// to keep `make test` within its budget.
func TestSoak_PubSubRedisClusterFullSize(t *testing.T) {
	t.Parallel()
	runUniversalSuite(t, newClusterEnv(t), false)
}
