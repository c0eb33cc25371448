package processors

import (
	"context"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/internal/prom"
)

// ShardSource reports the shards of a topic for a consumer group;
// *bus.Conn implements it (nil for a broker that does not shard).
type ShardSource interface {
	ShardStatus(ctx context.Context, topic, group string) ([]bus.ShardStatus, error)
}

// DefaultShardStatsInterval is the least time between two reads of the
// shards by a ShardCollector.
const DefaultShardStatsInterval = 15 * time.Second

// ShardCollector exports the shards of a consumer group's topics, on a
// broker that shards topics (redis with redis.shards above 1), as
// Prometheus gauges: who owns each shard, its lag and its pending messages,
// and how often its lease was taken. It reads them at most once per
// interval however often it is scraped; a topic that is not sharded
// exports nothing.
type ShardCollector struct {
	src      ShardSource
	topics   []string
	group    string
	interval time.Duration

	owned, lag, pending, leases *prometheus.Desc

	mu     sync.Mutex
	readAt time.Time
	last   map[string][]bus.ShardStatus
}

// NewShardCollector registers a ShardCollector of group's topics on reg. A
// zero interval means DefaultShardStatsInterval.
func NewShardCollector(reg prometheus.Registerer, src ShardSource, group string, topics []string, interval time.Duration) (*ShardCollector, error) {
	if interval <= 0 {
		interval = DefaultShardStatsInterval
	}
	labels := []string{"topic", "consumer_group", "shard"}
	c := &ShardCollector{
		src: src, topics: topics, group: group, interval: interval,
		owned: prometheus.NewDesc("omnibus_shard_owner", "1 for the consumer holding the shard's lease (owner=\"\" when none does).",
			append(labels, "owner"), nil),
		lag: prometheus.NewDesc("omnibus_shard_lag_messages", "Messages of the shard not yet handed to the group (-1 when the broker cannot tell).",
			labels, nil),
		pending: prometheus.NewDesc("omnibus_shard_pending_messages", "Messages of the shard handed out and not yet acknowledged.",
			labels, nil),
		leases: prometheus.NewDesc("omnibus_shard_leases_total", "Times a consumer of the group took the shard's lease: rebalances, takeovers and restarts.",
			labels, nil),
	}
	return prom.Register(reg, c)
}

// Describe implements prometheus.Collector.
func (c *ShardCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.owned
	ch <- c.lag
	ch <- c.pending
	ch <- c.leases
}

// Collect implements prometheus.Collector.
func (c *ShardCollector) Collect(ch chan<- prometheus.Metric) {
	for topic, shards := range c.read() {
		for _, s := range shards {
			n := strconv.Itoa(s.Shard)
			ch <- prometheus.MustNewConstMetric(c.owned, prometheus.GaugeValue, 1, topic, c.group, n, s.Owner)
			ch <- prometheus.MustNewConstMetric(c.lag, prometheus.GaugeValue, float64(s.Lag), topic, c.group, n)
			ch <- prometheus.MustNewConstMetric(c.pending, prometheus.GaugeValue, float64(s.Pending), topic, c.group, n)
			ch <- prometheus.MustNewConstMetric(c.leases, prometheus.CounterValue, float64(s.Leases), topic, c.group, n)
		}
	}
}

// read returns the shards of every topic, read again when the last read is
// older than the interval. A failed read keeps the previous figures.
func (c *ShardCollector) read() map[string][]bus.ShardStatus {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.last != nil && time.Since(c.readAt) < c.interval {
		return c.last
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	next := make(map[string][]bus.ShardStatus, len(c.topics))
	for _, topic := range c.topics {
		st, err := c.src.ShardStatus(ctx, topic, c.group)
		if err != nil {
			if c.last != nil {
				return c.last
			}
			return nil
		}
		if st != nil {
			next[topic] = st
		}
	}
	c.last, c.readAt = next, time.Now()
	return next
}
