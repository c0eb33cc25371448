package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jackc/pgx/v5"
	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/internal/testenv"
)

// shardStand is the scale-out stand of issues 28 and 30: messages
// published with the broker's omnibus publisher (bus.OpenBroker of the same
// config) into a topic of 8 shards, stored by 3 `omnibus ingest` processes
// into one inbox. Every few seconds one process is SIGKILLed and restarted;
// once one is SIGSTOPped for 4 leases and resumed.
type shardStand struct {
	broker   string        // redis (default), rabbitmq or nats
	duration time.Duration // how long messages are published
	messages int
	keys     int
	lease    time.Duration // redis.shard_lease, rabbitmq.heartbeat, nats.shard_lease
	cluster  bool          // the 3-node Redis Cluster of `make services` instead of the single server
}

// The short form runs in `make test`; the soak runs it for minutes.
func TestIngest_ShardedRedisKeepsKeyOrderAcrossKillsAndAPause(t *testing.T) {
	t.Parallel()
	runShardStand(t, shardStand{duration: 12 * time.Second, messages: 3000, keys: 60, lease: time.Second})
}

// The same on RabbitMQ: 8 single-active-consumer queues per group, the
// heartbeat as the lease.
func TestIngest_ShardedRabbitMQKeepsKeyOrderAcrossKillsAndAPause(t *testing.T) {
	t.Parallel()
	runShardStand(t, shardStand{broker: "rabbitmq", duration: 12 * time.Second, messages: 3000, keys: 60, lease: time.Second})
}

// The same on NATS JetStream: 8 shard subjects, leases and positions in a
// key-value bucket.
func TestIngest_ShardedNATSKeepsKeyOrderAcrossKillsAndAPause(t *testing.T) {
	t.Parallel()
	runShardStand(t, shardStand{broker: "nats", duration: 12 * time.Second, messages: 3000, keys: 60, lease: time.Second})
}

// The same on Redis Cluster, configured with redis.cluster_addrs.
func TestIngest_ShardedRedisClusterKeepsKeyOrderAcrossKillsAndAPause(t *testing.T) {
	t.Parallel()
	runShardStand(t, shardStand{duration: 12 * time.Second, messages: 3000, keys: 60, lease: time.Second, cluster: true})
}

func runShardStand(t *testing.T, st shardStand) {
	root, err := filepath.Abs("../..")
	require.NoError(t, err)
	bin := filepath.Join(t.TempDir(), "omnibus")
	build := exec.Command("go", "build", "-o", bin, "./cmd/omnibus")
	build.Dir = root
	out, err := build.CombinedOutput()
	require.NoError(t, err, "go build ./cmd/omnibus: %s", out)

	pool := testenv.Postgres(t)
	table := "ib_shards_" + strings.ToLower(watermill.NewShortUUID()[:10])
	t.Cleanup(func() { testenv.DropPostgresPrefix(t, table) })
	const topic, group = "orders", "stand"
	env := map[string]string{
		"OMNIBUS_POSTGRES_URL":               testenv.PostgresURL(),
		"OMNIBUS_INBOX_TABLE":                table,
		"OMNIBUS_INBOX_TOPICS":               topic,
		"OMNIBUS_INBOX_CONSUMER_GROUP":       group,
		"OMNIBUS_OBSERVABILITY_METRICS_ADDR": "-",
		"OMNIBUS_OBSERVABILITY_LOG_LEVEL":    "warn",
	}
	switch {
	case st.broker == "rabbitmq":
		env["OMNIBUS_BROKER"] = "rabbitmq"
		env["OMNIBUS_RABBITMQ_URL"] = testenv.RabbitMQ(t)
		env["OMNIBUS_RABBITMQ_EXCHANGE_PREFIX"] = testenv.RabbitMQPrefix(t)
		env["OMNIBUS_RABBITMQ_SHARDS"] = "8"
		env["OMNIBUS_RABBITMQ_HEARTBEAT"] = st.lease.String()
		env["OMNIBUS_RABBITMQ_QUEUE_EXPIRES"] = "1m"
	case st.broker == "nats":
		env["OMNIBUS_BROKER"] = "nats"
		env["OMNIBUS_NATS_URL"] = testenv.NATS(t)
		env["OMNIBUS_NATS_SUBJECT_PREFIX"] = testenv.NATSPrefix(t)
		env["OMNIBUS_NATS_SHARDS"] = "8"
		env["OMNIBUS_NATS_SHARD_LEASE"] = st.lease.String()
	case st.cluster:
		testenv.RedisCluster(t) // fails with how to start it when it is down
		env["OMNIBUS_BROKER"] = "redis"
		env["OMNIBUS_REDIS_CLUSTER_ADDRS"] = strings.Join(testenv.RedisClusterAddrs(), ",")
		env["OMNIBUS_REDIS_STREAM_PREFIX"] = testenv.RedisClusterPrefix(t)
	default:
		env["OMNIBUS_BROKER"] = "redis"
		env["OMNIBUS_REDIS_ADDR"] = testenv.RedisAddr()
		env["OMNIBUS_REDIS_STREAM_PREFIX"] = testenv.RedisPrefix(t)
	}
	if st.broker == "" {
		env["OMNIBUS_REDIS_SHARDS"] = "8"
		env["OMNIBUS_REDIS_SHARD_LEASE"] = st.lease.String()
	}
	environ := func() []string {
		var list []string
		for _, kv := range os.Environ() {
			if !strings.HasPrefix(kv, "OMNIBUS_") {
				list = append(list, kv)
			}
		}
		for k, v := range env {
			list = append(list, k+"="+v)
		}
		return list
	}
	migrate := exec.Command(bin, "migrate")
	migrate.Env = environ()
	out, err = migrate.CombinedOutput()
	require.NoError(t, err, "omnibus migrate: %s", out)

	// The ingest processes.
	logs := t.TempDir()
	var mu sync.Mutex
	procs := make([]*exec.Cmd, 3)
	start := func(i int) {
		cmd := exec.Command(bin, "ingest")
		cmd.Env = environ()
		f, err := os.OpenFile(filepath.Join(logs, fmt.Sprintf("ingest-%d.log", i)), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
		require.NoError(t, err)
		cmd.Stdout, cmd.Stderr = f, f
		require.NoError(t, cmd.Start())
		go func() { _ = cmd.Wait(); _ = f.Close() }()
		procs[i] = cmd
	}
	for i := range procs {
		start(i)
	}
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		for _, p := range procs {
			_ = p.Process.Signal(syscall.SIGCONT)
			_ = p.Process.Kill()
		}
		if t.Failed() {
			for i := range procs {
				b, _ := os.ReadFile(filepath.Join(logs, fmt.Sprintf("ingest-%d.log", i)))
				t.Logf("ingest %d log:\n%s", i, tail(string(b), 4000))
			}
		}
	})

	// The publisher: the same configuration, through bus.OpenBroker.
	cfg, err := bus.ParseConfigEnv(nil, nil)
	require.NoError(t, err)
	require.NoError(t, cfg.ApplyEnv(func(k string) (string, bool) { v, ok := env[k]; return v, ok }))
	conn, err := bus.OpenBroker(t.Context(), cfg)
	require.NoError(t, err)
	defer conn.Close()
	pub := conn.Publisher()

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	published := make(chan error, 1)
	go func() {
		pace := st.duration / time.Duration(st.messages)
		for i := range st.messages {
			msg := message.NewMessage(watermill.NewUUID(), []byte(strconv.Itoa(i)))
			bus.SetPartitionKey(msg, "key-"+strconv.Itoa(i%st.keys))
			if err := publishRetrying(ctx, pub, topic, msg); err != nil {
				published <- err
				return
			}
			time.Sleep(pace)
		}
		published <- nil
	}()

	// The chaos: kills and restarts, and one pause of 4 leases.
	chaos := make(chan struct{})
	go func() {
		defer close(chaos)
		paused := false
		deadline := time.Now().Add(st.duration)
		for time.Now().Before(deadline) {
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Duration(1500+rand.IntN(1500)) * time.Millisecond):
			}
			mu.Lock()
			i := rand.IntN(len(procs))
			if !paused {
				paused = true
				p := procs[i].Process
				mu.Unlock()
				_ = p.Signal(syscall.SIGSTOP)
				time.Sleep(4 * st.lease)
				_ = p.Signal(syscall.SIGCONT)
				continue
			}
			_ = procs[i].Process.Kill()
			time.Sleep(100 * time.Millisecond)
			start(i)
			mu.Unlock()
		}
	}()

	require.NoError(t, <-published)
	<-chaos
	var stored int
	require.Eventually(t, func() bool {
		stored = countRows(t, pool, table)
		return stored >= st.messages
	}, 90*time.Second, 250*time.Millisecond, "the inbox holds %d of %d messages", stored, st.messages)

	// Exactly once, and every key in publish order.
	rows, err := pool.Query(t.Context(), `SELECT partition_key, convert_from(payload, 'UTF8'), message_id FROM `+
		pgx.Identifier{table}.Sanitize()+` ORDER BY id`)
	require.NoError(t, err)
	defer rows.Close()
	last := map[string]int{}
	ids := map[string]bool{}
	var reordered []string
	n := 0
	for rows.Next() {
		var key, payload, id string
		require.NoError(t, rows.Scan(&key, &payload, &id))
		seq, err := strconv.Atoi(payload)
		require.NoError(t, err)
		require.False(t, ids[id], "message %s stored twice", id)
		ids[id] = true
		if prev, ok := last[key]; ok && seq < prev {
			reordered = append(reordered, fmt.Sprintf("%s: %d after %d", key, seq, prev))
		}
		last[key] = seq
		n++
	}
	require.NoError(t, rows.Err())
	assert.Equal(t, st.messages, n, "every message stored exactly once")
	assert.Empty(t, reordered, "messages stored after a later one of their key")

	if st.broker == "rabbitmq" {
		return
	}
	// `omnibus inbox stats` shows each shard's owner, lag and pending entries.
	var stats string
	require.Eventually(t, func() bool {
		cmd := exec.Command(bin, "inbox", "stats")
		cmd.Env = environ()
		b, err := cmd.CombinedOutput()
		require.NoError(t, err, "omnibus inbox stats: %s", b)
		stats = string(b)
		owned := 0
		for _, line := range strings.Split(stats, "\n") {
			// Pending is "?" on NATS: a consumer holds it in memory.
			if f := strings.Fields(line); len(f) == 4 && f[0] != "shard" && f[1] != "-" && f[2] == "0" && (f[3] == "0" || f[3] == "?") {
				owned++
			}
		}
		return owned == 8
	}, 20*time.Second, 200*time.Millisecond, "every shard owned, no lag, nothing pending:\n%s", stats)
	assert.Contains(t, stats, "shards of topic orders, group "+group)
}

// publishRetrying publishes msg, retrying transient failures (the broker
// connection starting) as a relay would.
func publishRetrying(ctx context.Context, pub message.Publisher, topic string, msg *message.Message) error {
	for {
		err := pub.Publish(topic, msg)
		if err == nil || bus.ClassOf(err) != bus.ClassTransient {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func countRows(t *testing.T, pool *pgxpool.Pool, table string) int {
	var n int
	require.NoError(t, pool.QueryRow(t.Context(), `SELECT count(*) FROM `+pgx.Identifier{table}.Sanitize()).Scan(&n))
	return n
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}
