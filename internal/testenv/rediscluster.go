package testenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// DefaultRedisClusterAddrs is used when OMNIBUS_TEST_REDIS_CLUSTER_ADDRS is
// not set: the three nodes `make services` starts.
const DefaultRedisClusterAddrs = "127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003"

// RedisClusterAddrs returns the seed addresses of the Redis Cluster tests
// use, from OMNIBUS_TEST_REDIS_CLUSTER_ADDRS (comma separated).
func RedisClusterAddrs() []string {
	s := os.Getenv("OMNIBUS_TEST_REDIS_CLUSTER_ADDRS")
	if strings.TrimSpace(s) == "" {
		s = DefaultRedisClusterAddrs
	}
	var addrs []string
	for a := range strings.SplitSeq(s, ",") {
		if a = strings.TrimSpace(a); a != "" {
			addrs = append(addrs, a)
		}
	}
	return addrs
}

var (
	clusterOnce   sync.Once
	clusterClient *redis.ClusterClient
	clusterErr    error
)

// RedisCluster returns a Redis Cluster client shared by every test of the
// package. Tests never close it. It fails the test, with instructions, when
// the cluster cannot be reached or does not report cluster_state:ok.
func RedisCluster(t testing.TB) *redis.ClusterClient {
	t.Helper()
	clusterOnce.Do(func() {
		c := redis.NewClusterClient(redisClusterOptions(RedisClusterAddrs(), 512))
		if err := checkRedisCluster(c); err != nil {
			_ = c.Close()
			clusterErr = err
			return
		}
		clusterClient = c
	})
	if clusterErr != nil {
		failRedisCluster(t, RedisClusterAddrs(), clusterErr)
	}
	return clusterClient
}

// NewRedisClusterClient opens a cluster client of its own for the test and
// closes it when the test ends.
func NewRedisClusterClient(t testing.TB) *redis.ClusterClient {
	t.Helper()
	addrs := RedisClusterAddrs()
	c := redis.NewClusterClient(redisClusterOptions(addrs, 32))
	if err := checkRedisCluster(c); err != nil {
		_ = c.Close()
		failRedisCluster(t, addrs, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// RedisClusterPrefix returns a key prefix unique to the test
// ("omnibus:test:<name>:") and deletes, on every master of the cluster, the
// keys that start with it when the test ends.
func RedisClusterPrefix(t testing.TB) string {
	t.Helper()
	prefix := "omnibus:test:" + Name(t) + ":"
	c := RedisCluster(t)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		// Name yields only [a-z0-9_], so the prefix holds no glob characters.
		err := c.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
			iter := node.Scan(ctx, 0, prefix+"*", 500).Iterator()
			for iter.Next(ctx) {
				// One key at a time: keys of one node can still sit in
				// different slots, and a multi-key UNLINK across slots is
				// refused.
				if err := node.Unlink(ctx, iter.Val()).Err(); err != nil {
					return fmt.Errorf("delete key %q on %s: %w", iter.Val(), node.Options().Addr, err)
				}
			}
			return iter.Err()
		})
		if err != nil {
			t.Logf("delete keys with prefix %q from the Redis Cluster: %v", prefix, err)
		}
	})
	return prefix
}

func redisClusterOptions(addrs []string, poolSize int) *redis.ClusterOptions {
	return &redis.ClusterOptions{
		Addrs:    addrs,
		PoolSize: poolSize,
	}
}

// checkRedisCluster asks every seed node for CLUSTER INFO: a node that does
// not answer, or a cluster whose state is not ok (slots not all served), is
// an error.
func checkRedisCluster(c *redis.ClusterClient) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	info, err := c.ClusterInfo(ctx).Result()
	if err != nil {
		return fmt.Errorf("cluster info: %w", err)
	}
	if !strings.Contains(info, "cluster_state:ok") {
		return errors.New("cluster info does not report cluster_state:ok")
	}
	return c.ForEachShard(ctx, func(ctx context.Context, node *redis.Client) error {
		if err := node.Ping(ctx).Err(); err != nil {
			return fmt.Errorf("ping %s: %w", node.Options().Addr, err)
		}
		return nil
	})
}

func failRedisCluster(t testing.TB, addrs []string, err error) {
	t.Helper()
	t.Fatalf("Redis Cluster is not reachable at %s: %v\n"+
		"Start it with `make services` (or set OMNIBUS_TEST_REDIS_CLUSTER_ADDRS to the nodes of a cluster you run).",
		strings.Join(addrs, ","), err)
}
