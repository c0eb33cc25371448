package testenv

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// DefaultRedisAddr is used when OMNIBUS_TEST_REDIS_ADDR is not set.
const DefaultRedisAddr = "127.0.0.1:6379"

// RedisAddr returns the address of the Redis server tests use.
func RedisAddr() string {
	if a := os.Getenv("OMNIBUS_TEST_REDIS_ADDR"); a != "" {
		return a
	}
	return DefaultRedisAddr
}

var (
	redisOnce   sync.Once
	redisClient *redis.Client
	redisErr    error
)

// Redis returns a client shared by every test of the package. Tests never
// close it; it lives as long as the test binary. Its pool is large enough
// for many subscribers blocking in XREADGROUP at once.
func Redis(t testing.TB) *redis.Client {
	t.Helper()
	redisOnce.Do(func() {
		c := redis.NewClient(redisOptions(512))
		if err := pingRedis(c); err != nil {
			_ = c.Close()
			redisErr = err
			return
		}
		redisClient = c
	})
	if redisErr != nil {
		failRedis(t, redisErr)
	}
	return redisClient
}

// NewRedisClient opens a client of its own for the test and closes it when
// the test ends. Use it where the test must know nobody else uses the client
// (for instance to check that a component leaves it open).
func NewRedisClient(t testing.TB) *redis.Client {
	t.Helper()
	c := redis.NewClient(redisOptions(32))
	if err := pingRedis(c); err != nil {
		_ = c.Close()
		failRedis(t, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// RedisPrefix returns a key prefix unique to the test ("omnibus:test:<name>:")
// and deletes every key that starts with it when the test ends. Build stream
// names from it so tests run in parallel against one server.
func RedisPrefix(t testing.TB) string {
	t.Helper()
	prefix := "omnibus:test:" + Name(t) + ":"
	c := Redis(t)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		// Name yields only [a-z0-9_], so the prefix holds no glob characters.
		iter := c.Scan(ctx, 0, prefix+"*", 500).Iterator()
		var keys []string
		for iter.Next(ctx) {
			keys = append(keys, iter.Val())
		}
		if err := iter.Err(); err != nil {
			t.Logf("scan keys with prefix %q: %v", prefix, err)
			return
		}
		for len(keys) > 0 {
			n := min(len(keys), 500)
			if err := c.Unlink(ctx, keys[:n]...).Err(); err != nil {
				t.Logf("delete keys with prefix %q: %v", prefix, err)
				return
			}
			keys = keys[n:]
		}
	})
	return prefix
}

func redisOptions(poolSize int) *redis.Options {
	return &redis.Options{
		Addr:     RedisAddr(),
		PoolSize: poolSize,
	}
}

func pingRedis(c *redis.Client) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return c.Ping(ctx).Err()
}

func failRedis(t testing.TB, err error) {
	t.Helper()
	t.Fatalf("Redis is not reachable at %s: %v\n"+
		"Start it with `make services` (or set OMNIBUS_TEST_REDIS_ADDR to a server you run).",
		RedisAddr(), err)
}
