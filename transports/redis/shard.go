package redis

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/omnibus-go/omnibus/bus"
)

// Sharding (Shards > 1): a topic is Shards streams, shard i of stream s
// named s + ":shard:{i}", and a message goes to the shard of its partition
// key (bus.ShardOf). The keys that belong to one shard (its lease and its
// lease epoch, per group) start with the shard's stream name, so whatever
// {hash tag} Redis Cluster reads in them lies in that common prefix: a
// shard's keys share a slot, and the Lua scripts that check a lease before
// reading or acknowledging run on one node. For a topic without braces the
// tag is the shard number, which spreads a topic's shards over the nodes.

// DefaultShards is the shard count of a topic: one stream, today's layout.
const DefaultShards = 1

// DefaultShardLease is how long a consumer owns a shard without renewing
// its lease.
const DefaultShardLease = 10 * time.Second

// MinShardLease is the shortest shard lease accepted.
const MinShardLease = 100 * time.Millisecond

// shardStream names shard i of stream.
func shardStream(stream string, i int) string {
	return stream + ":shard:{" + strconv.Itoa(i) + "}"
}

// shardsKey names the key that records the shard count of stream's topic.
func shardsKey(stream string) string { return stream + ":shards" }

// membersKey names the sorted set of the live consumers of group on stream's
// shards, scored by when their membership expires (Redis server time, ms).
func membersKey(stream, group string) string { return stream + ":members:" + group }

// ownerKey names the lease of group on a shard stream: "<epoch> <consumer>".
func ownerKey(shard, group string) string { return shard + ":owner:" + group }

// epochKey names the counter of group's leases on a shard stream: every
// lease taken gets the next number, the fencing token.
func epochKey(shard, group string) string { return shard + ":epoch:" + group }

// ErrShardCount is the error of a publisher or subscriber whose shard count
// differs from the one recorded for the topic.
var ErrShardCount = errors.New("shard count differs from the topic's recorded count")

// shardCountScript records the shard count of a topic on first use and
// returns the recorded count. KEYS[1]: the count key; ARGV[1]: our count.
var shardCountScript = redis.NewScript(`
redis.call('SET', KEYS[1], ARGV[1], 'NX')
return tonumber(redis.call('GET', KEYS[1]))
`)

// checkShardCount records n as the shard count of stream's topic when none
// is recorded, and refuses any other count: re-hashing keys to other
// shards under a running group would break their order.
func checkShardCount(ctx context.Context, client redis.UniversalClient, topic, stream string, n int) error {
	got, err := shardCountScript.Run(ctx, client, []string{shardsKey(stream)}, n).Int()
	if err != nil {
		return classify(fmt.Errorf("read the shard count of stream %q: %w", stream, err))
	}
	if got == n {
		return nil
	}
	return &ShardCountError{Topic: topic, Configured: n, Recorded: got, Key: shardsKey(stream)}
}

// ShardCountError is a shard count (redis.shards, Shards) that differs from
// the one recorded for a topic. It matches ErrShardCount and
// bus.ErrInvalidConfig.
type ShardCountError struct {
	Topic                string
	Configured, Recorded int
	// Key is the Redis key that records the topic's count.
	Key string
}

func (e *ShardCountError) Error() string {
	return (&bus.ConfigError{Field: "redis.shards", Reason: fmt.Sprintf(
		"%d, but topic %q was created with %d shards (recorded in %q): %v. Keys would move to other shards and lose their order. "+
			"To change it, stop the publishers, let every consumer group drain the topic, then delete %q (and the old streams) and start with the new count",
		e.Configured, e.Topic, e.Recorded, e.Key, ErrShardCount, e.Key)}).Error()
}

// Is makes a ShardCountError match ErrShardCount and bus.ErrInvalidConfig.
func (e *ShardCountError) Is(target error) bool {
	return target == ErrShardCount || target == bus.ErrInvalidConfig
}

// shardCounts remembers the streams whose shard count has been checked. It
// is read on every Publish from many goroutines and written once per
// stream: a sync.Map reads such keys without a lock (a mutex here was one
// lock every concurrent Publish call took).
type shardCounts struct {
	checked sync.Map // stream → struct{}
}

func (c *shardCounts) check(ctx context.Context, client redis.UniversalClient, topic, stream string, n int) error {
	if _, ok := c.checked.Load(stream); ok {
		return nil
	}
	if err := checkShardCount(ctx, client, topic, stream, n); err != nil {
		return err
	}
	c.checked.Store(stream, struct{}{})
	return nil
}

// membersScript renews a consumer's membership and returns the live
// members, sorted. KEYS[1]: the members key; ARGV: consumer, lease (ms),
// leave ("1" removes the consumer instead).
var membersScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if ARGV[3] == '1' then
  redis.call('ZREM', KEYS[1], ARGV[1])
else
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
  redis.call('PEXPIRE', KEYS[1], 10 * tonumber(ARGV[2]))
end
return redis.call('ZRANGE', KEYS[1], 0, -1)
`)

// acquireScript takes a free shard lease. KEYS: owner key, epoch key; ARGV:
// consumer, lease (ms). It returns the new fencing token, or 0 when another
// consumer holds the lease.
var acquireScript = redis.NewScript(`
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local epoch = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], epoch .. ' ' .. ARGV[1], 'PX', ARGV[2])
return epoch
`)

// renewScript extends a lease that is still ours. KEYS: owner key; ARGV:
// "<token> <consumer>", lease (ms). It returns 1, or 0 when the lease is
// gone or someone else's.
var renewScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
`)

// releaseScript deletes a lease that is still ours. KEYS: owner key; ARGV:
// "<token> <consumer>".
var releaseScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
return redis.call('DEL', KEYS[1])
`)

// fencedAckScript acknowledges entries only while the lease is ours.
// KEYS: stream, owner key; ARGV: group, "<token> <consumer>", ids…. It
// returns the number acknowledged, or -1 when the lease is not ours.
var fencedAckScript = redis.NewScript(`
if redis.call('GET', KEYS[2]) ~= ARGV[2] then return -1 end
return redis.call('XACK', KEYS[1], ARGV[1], unpack(ARGV, 3))
`)

// errFenced says a shard's lease is no longer this consumer's.
var errFenced = errors.New("the shard's lease is no longer this consumer's")

// fence is a subscription's hold on a shard: its lease key, its token, and
// until when the lease is surely ours by the local clock (the time a
// renewal was sent, plus the lease). Everything the subscription hands out
// or acknowledges is checked against it: locally before a handoff, in Redis
// with each read (under WATCH), claim and XACK (in Lua).
type fence struct {
	key   string // owner key
	value string // "<token> <consumer>"
	token int64

	mu    sync.Mutex
	until time.Time
	lost  bool
}

func (f *fence) valid() bool {
	if f == nil {
		return true
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return !f.lost && time.Now().Before(f.until)
}

// left is how long the lease is surely ours from now, as far as this
// consumer knows now (0 once lost): a renewal may extend it.
func (f *fence) left() time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.lost {
		return 0
	}
	return max(time.Until(f.until), 0)
}

func (f *fence) extend(until time.Time) {
	f.mu.Lock()
	if until.After(f.until) {
		f.until = until
	}
	f.mu.Unlock()
}

func (f *fence) lose() {
	f.mu.Lock()
	f.lost = true
	f.mu.Unlock()
}

// ownerOf splits a lease value into its token and consumer.
func ownerOf(value string) (token int64, consumer string) {
	t, c, _ := strings.Cut(value, " ")
	token, _ = strconv.ParseInt(t, 10, 64)
	return token, c
}

// ShardStatus reports every shard of topic's stream (StreamPrefix + topic)
// for group: its owner (the consumer holding its lease, "" for none), its
// lag (entries not yet delivered to the group, from XINFO GROUPS; -1 when
// Redis cannot tell) and its pending entries. It returns nil when the topic
// has no recorded shard count above 1.
func ShardStatus(ctx context.Context, client redis.UniversalClient, stream, group string) ([]bus.ShardStatus, error) {
	n, err := client.Get(ctx, shardsKey(stream)).Int()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the shard count of stream %q: %w", stream, err)
	}
	if n <= 1 {
		return nil, nil
	}
	out := make([]bus.ShardStatus, n)
	for i := range n {
		shard := shardStream(stream, i)
		st := bus.ShardStatus{Shard: i, Stream: shard, Lag: -1}
		owner, err := client.Get(ctx, ownerKey(shard, group)).Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			return nil, fmt.Errorf("read the owner of shard %q: %w", shard, err)
		}
		_, st.Owner = ownerOf(owner)
		st.Leases, err = client.Get(ctx, epochKey(shard, group)).Int64()
		if err != nil && !errors.Is(err, redis.Nil) {
			return nil, fmt.Errorf("read the lease count of shard %q: %w", shard, err)
		}
		groups, err := client.XInfoGroups(ctx, shard).Result()
		if err != nil && !noSuchKey(err) {
			return nil, fmt.Errorf("read the groups of shard %q: %w", shard, err)
		}
		for _, g := range groups {
			if g.Name == group {
				st.Lag, st.Pending = g.Lag, g.Pending
			}
		}
		out[i] = st
	}
	return out, nil
}

// DeleteTopic deletes everything the transport keeps for the topic whose
// stream is stream (StreamPrefix + topic): the stream, its dead-letter
// stream (the default name), its recorded shard count, and, for a sharded
// topic, every shard with its consumer groups' leases, lease counters and
// memberships. It is for tests, demos and an operator changing a topic's
// shard count after draining it; entries not yet handled are lost.
func DeleteTopic(ctx context.Context, client redis.UniversalClient, stream string) error {
	keys := []string{stream, stream + DefaultDeadLetterSuffix, shardsKey(stream)}
	n, err := client.Get(ctx, shardsKey(stream)).Int()
	if err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("read the shard count of stream %q: %w", stream, err)
	}
	if n <= 1 {
		n = 0 // one stream: no shards
	}
	for i := range n {
		shard := shardStream(stream, i)
		groups, err := client.XInfoGroups(ctx, shard).Result()
		if err != nil && !noSuchKey(err) {
			return fmt.Errorf("read the groups of shard %q: %w", shard, err)
		}
		for _, g := range groups {
			keys = append(keys, ownerKey(shard, g.Name), epochKey(shard, g.Name), membersKey(stream, g.Name))
		}
		keys = append(keys, shard)
	}
	// One key per command: on Redis Cluster they live in different slots.
	for _, k := range keys {
		if err := client.Del(ctx, k).Err(); err != nil {
			return fmt.Errorf("delete %q: %w", k, err)
		}
	}
	return nil
}

// noSuchKey says err is Redis's reply for a stream that does not exist.
func noSuchKey(err error) bool { return strings.Contains(err.Error(), "no such key") }
