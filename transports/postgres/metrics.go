package postgres

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/omnibus-go/omnibus/internal/prom"
)

// Observer receives measurements of a Subscriber's statements, for metrics
// (SubscriberConfig.Observer). Metrics is the Prometheus implementation. The
// methods are called from the subscriber's goroutines, concurrently, and must
// not block.
type Observer interface {
	// ObserveFetch is called after every fetch, empty ones included.
	ObserveFetch(FetchInfo)
	// ObserveSettle is called after every batch of settlements (acks, nacks
	// and releases written in one statement).
	ObserveSettle(SettleInfo)
}

// FetchInfo describes one fetch of a Subscriber.
type FetchInfo struct {
	Table         string
	ConsumerGroup string // "" for the outbox
	// Rows is how many rows the fetch handed out; Lanes how many keys it leased.
	Rows, Lanes int
	Duration    time.Duration
	// Err is the error of a failed fetch (not counted in Rows).
	Err error
}

// SettleInfo describes one batch of settlements written by a Subscriber.
type SettleInfo struct {
	Table         string
	ConsumerGroup string // "" for the outbox
	// Rows is how many settlements the statement carried.
	Rows     int
	Duration time.Duration
	// Err is the error of a failed write; the batch is written again later.
	Err error
}

// LeaseObserver is told when a Subscriber finds that it lost the lease of a
// key it was delivering (the lease ran out before it could be renewed, and
// another worker may hold the key now): the run stops before its next row.
// Metrics implements it; an Observer that does not is simply not told.
type LeaseObserver interface {
	ObserveLeaseLost(LeaseLostInfo)
}

// LeaseLostInfo describes one run stopped because its lease was lost.
type LeaseLostInfo struct {
	Table         string
	ConsumerGroup string // "" for the outbox
	Topic         string
	// Rows is how many rows of the run were not delivered.
	Rows int
}

// InboxObserver is told, for every inbox store, how many messages were new
// and how many were duplicates (already stored for the consumer group).
// Metrics implements it.
type InboxObserver interface {
	ObserveStore(StoreInfo)
}

// StoreInfo describes one Inbox store call: how many messages were new and
// how many were already stored for the consumer group (duplicates).
type StoreInfo struct {
	Table, ConsumerGroup string
	New, Duplicates      int
}

// Metrics is the Prometheus Observer of Subscribers: fetch size and
// duration, settlement batch size and duration, and failed statements, per
// table and consumer group. Build one per registry and hand it to every
// Subscriber of the process (SubscriberConfig.Observer).
//
// Metrics (labels table, consumer_group):
//
//	omnibus_postgres_fetch_size_rows          histogram of rows per fetch
//	omnibus_postgres_fetch_duration_seconds   histogram of fetch statement time
//	omnibus_postgres_fetch_errors_total       failed fetches
//	omnibus_postgres_settle_size_rows         histogram of settlements per batch
//	omnibus_postgres_settle_duration_seconds  histogram of settlement statement time
//	omnibus_postgres_settle_errors_total      failed settlement writes (retried)
//	omnibus_postgres_leases_lost_total        runs stopped because their lease was lost
//	omnibus_inbox_stored_messages_total       inbox stores by result: new, duplicate
type Metrics struct {
	fetchSize, fetchDuration   *prometheus.HistogramVec
	settleSize, settleDuration *prometheus.HistogramVec
	fetchErrors, settleErrors  *prometheus.CounterVec
	stored, leasesLost         *prometheus.CounterVec
}

var (
	_ Observer      = (*Metrics)(nil)
	_ InboxObserver = (*Metrics)(nil)
	_ LeaseObserver = (*Metrics)(nil)

	sizeBuckets     = prometheus.ExponentialBuckets(1, 2, 12)        // 1 … 2048
	durationBuckets = prometheus.ExponentialBuckets(0.0005, 2.5, 12) // 0.5 ms … ~30 s
)

// NewMetrics registers the subscriber metrics with reg and returns them. reg
// is required: pass prometheus.DefaultRegisterer explicitly to use the
// global registry. Calling it again with the same registry returns metrics
// that share the registered collectors.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	if reg == nil {
		return nil, errors.New("postgres metrics: registerer: required (pass prometheus.DefaultRegisterer for the global registry)")
	}
	labels := []string{"table", "consumer_group"}
	hist := func(name, help string, buckets []float64) (*prometheus.HistogramVec, error) {
		return prom.Register(reg, prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: name, Help: help, Buckets: buckets,
		}, labels))
	}
	counter := func(name, help string, extra ...string) (*prometheus.CounterVec, error) {
		return prom.Register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, append(labels, extra...)))
	}
	var (
		m    Metrics
		errs [8]error
	)
	m.fetchSize, errs[0] = hist("omnibus_postgres_fetch_size_rows", "Rows handed out by one fetch of a postgres subscriber.", sizeBuckets)
	m.fetchDuration, errs[1] = hist("omnibus_postgres_fetch_duration_seconds", "Time one fetch statement of a postgres subscriber took.", durationBuckets)
	m.fetchErrors, errs[2] = counter("omnibus_postgres_fetch_errors_total", "Fetches of a postgres subscriber that failed.")
	m.settleSize, errs[3] = hist("omnibus_postgres_settle_size_rows", "Settlements (acks, nacks, releases) written by one statement.", sizeBuckets)
	m.settleDuration, errs[4] = hist("omnibus_postgres_settle_duration_seconds", "Time one settlement statement took.", durationBuckets)
	m.settleErrors, errs[5] = counter("omnibus_postgres_settle_errors_total", "Settlement statements that failed (they are written again).")
	m.stored, errs[6] = counter("omnibus_inbox_stored_messages_total", "Messages stored into an inbox, by result: new or duplicate.", "result")
	m.leasesLost, errs[7] = counter("omnibus_postgres_leases_lost_total", "Runs a postgres subscriber stopped because it lost their lease.")
	if err := errors.Join(errs[:]...); err != nil {
		return nil, err
	}
	return &m, nil
}

// ObserveFetch implements Observer.
func (m *Metrics) ObserveFetch(f FetchInfo) {
	if f.Err != nil {
		m.fetchErrors.WithLabelValues(f.Table, f.ConsumerGroup).Inc()
		return
	}
	m.fetchSize.WithLabelValues(f.Table, f.ConsumerGroup).Observe(float64(f.Rows))
	m.fetchDuration.WithLabelValues(f.Table, f.ConsumerGroup).Observe(f.Duration.Seconds())
}

// ObserveLeaseLost implements LeaseObserver.
func (m *Metrics) ObserveLeaseLost(l LeaseLostInfo) {
	m.leasesLost.WithLabelValues(l.Table, l.ConsumerGroup).Inc()
}

// ObserveSettle implements Observer.
func (m *Metrics) ObserveSettle(s SettleInfo) {
	if s.Err != nil {
		m.settleErrors.WithLabelValues(s.Table, s.ConsumerGroup).Inc()
		return
	}
	m.settleSize.WithLabelValues(s.Table, s.ConsumerGroup).Observe(float64(s.Rows))
	m.settleDuration.WithLabelValues(s.Table, s.ConsumerGroup).Observe(s.Duration.Seconds())
}

// ObserveStore implements InboxObserver: it counts the messages of one
// inbox store call by result (new or duplicate).
func (m *Metrics) ObserveStore(s StoreInfo) {
	if s.New > 0 {
		m.stored.WithLabelValues(s.Table, s.ConsumerGroup, "new").Add(float64(s.New))
	}
	if s.Duplicates > 0 {
		m.stored.WithLabelValues(s.Table, s.ConsumerGroup, "duplicate").Add(float64(s.Duplicates))
	}
}

// observeFetch reports a fetch to the configured Observer. A fetch cut short
// by shutdown is not a failure worth a metric.
func (s *Subscriber) observeFetch(res fetchResult, took time.Duration, err error) {
	if s.cfg.Observer == nil || errors.Is(err, context.Canceled) {
		return
	}
	f := FetchInfo{Table: s.cfg.Table, ConsumerGroup: s.cfg.ConsumerGroup, Lanes: res.lanes, Duration: took, Err: err}
	for _, u := range res.units {
		f.Rows += len(u.rows)
	}
	s.cfg.Observer.ObserveFetch(f)
}

// observeSettle reports a settlement batch to the configured Observer.
func (s *Subscriber) observeSettle(rows int, took time.Duration, err error) {
	if s.cfg.Observer == nil {
		return
	}
	s.cfg.Observer.ObserveSettle(SettleInfo{Table: s.cfg.Table, ConsumerGroup: s.cfg.ConsumerGroup, Rows: rows, Duration: took, Err: err})
}

// Defaults of NewStatsCollector.
const (
	// DefaultStatsInterval is how long a StatsCollector serves its last
	// figures before it asks the database again.
	DefaultStatsInterval = 15 * time.Second
	// DefaultStatsTimeout bounds the statistics query of one collection.
	DefaultStatsTimeout = 10 * time.Second
)

// StatsCollector is a prometheus.Collector exposing the backlog of an
// outbox or inbox table, as Admin.Overview counts it: pending and failed
// rows exactly through their partial indexes, completed rows exactly up to
// DefaultCompletedCountCap and estimated beyond, so its cost does not grow
// with the completed rows a table keeps for months. It queries the database
// at most once per interval, however often it is scraped: scrapes in between
// (and concurrent ones) get the cached figures.
//
// Gauges, named omnibus_outbox_… or omnibus_inbox_… after the table's kind,
// with the constant labels table and, for an inbox, consumer_group (empty for
// an Admin that sees every group):
//
//	…_pending_rows                 rows waiting for delivery
//	…_due_rows                     pending rows that can be fetched now
//	…_leased_rows                  pending rows under a live lease
//	…_expired_lease_rows           pending rows whose lease ran out
//	…_failed_rows                  rows that spent their attempts or failed permanently
//	…_completed_rows               delivered rows not yet cleaned up (exact up
//	                               to DefaultCompletedCountCap, else estimated;
//	                               absent for an Admin of one consumer group)
//	…_oldest_pending_age_seconds   age of the oldest pending row (0 when none)
//	…_pending_keys                 keys with pending rows
//	…_held_keys                    keys held behind a tried head waiting for its retry
//	…_blocked_keys                 keys frozen behind a failed row (FailedBlock)
//	…_dead_tuple_ratio{relation}   dead share of the table, lanes and notes tables
//	…_oldest_transaction_age_seconds  oldest transaction holding the xmin horizon
//	…_partitions                   partitions of the partitioned layout (not
//	                               exposed for a single table)
//	…_partitions_ahead_seconds     how long until the last partition ends
//	                               (writes after it land in the default one)
//	…_stats_up                     1 when the last query succeeded, else 0
//	…_stats_query_duration_seconds how long the last query took
//
// When the query fails only …_stats_up (0) and the query duration are
// exposed, so alerts on the figures do not fire on stale values.
type StatsCollector struct {
	admin    *Admin
	interval time.Duration
	timeout  time.Duration

	pending, due, leased, expired, failed, completed, oldest *prometheus.Desc
	keys, held, blocked, up, took                            *prometheus.Desc
	dead, horizon, partitions, ahead                         *prometheus.Desc

	mu       sync.Mutex
	at       time.Time // when the cached figures were taken
	stats    Overview
	health   Health
	err      error
	duration time.Duration
}

var _ prometheus.Collector = (*StatsCollector)(nil)

// NewStatsCollector returns a collector of admin's table statistics that
// queries the database at most once per minInterval (0 means
// DefaultStatsInterval) and registers it with reg, unless reg is nil. Each
// Admin (an outbox, an inbox, an inbox restricted to one consumer group) gets
// a collector of its own; they can share a registry.
func NewStatsCollector(admin *Admin, reg prometheus.Registerer, minInterval time.Duration) (*StatsCollector, error) {
	if admin == nil {
		return nil, errors.New("stats collector: admin: must not be nil")
	}
	if minInterval < 0 {
		return nil, fmt.Errorf("stats collector: minInterval: must not be negative, got %s", minInterval)
	}
	if minInterval == 0 {
		minInterval = DefaultStatsInterval
	}
	prefix := "omnibus_outbox_"
	if admin.inbox {
		prefix = "omnibus_inbox_"
	}
	constLabels := prometheus.Labels{"table": admin.table.Name}
	if admin.inbox {
		// "" for an Admin that sees every group (the label is then absent
		// for PromQL).
		constLabels["consumer_group"] = admin.ConsumerGroup()
	}
	desc := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc(prefix+name, help, nil, constLabels)
	}
	c := &StatsCollector{
		admin:     admin,
		interval:  minInterval,
		timeout:   DefaultStatsTimeout,
		pending:   desc("pending_rows", "Rows waiting for delivery (due, leased, delayed and retrying)."),
		due:       desc("due_rows", "Pending rows that are due and not leased: they can be fetched now unless an earlier row of their key is in line."),
		leased:    desc("leased_rows", "Pending rows under a live lease of a relay or worker."),
		expired:   desc("expired_lease_rows", "Pending rows whose lease expired without being cleared (their worker stopped)."),
		failed:    desc("failed_rows", "Rows that spent their attempts or failed permanently; they wait for an operator."),
		completed: desc("completed_rows", fmt.Sprintf("Delivered rows not yet deleted by cleanup: counted up to %d, estimated from the table's statistics beyond.", DefaultCompletedCountCap)),
		oldest:    desc("oldest_pending_age_seconds", "Age of the oldest pending row, from its creation; 0 when nothing is pending."),
		keys:      desc("pending_keys", "Keys (topic, partition key) with pending rows."),
		held:      desc("held_keys", "Keys held behind a tried head that waits for its retry time."),
		blocked:   desc("blocked_keys", "Keys frozen behind a failed row by the FailedBlock policy."),
		up:        desc("stats_up", "1 when the last statistics query succeeded, 0 when it failed."),
		took:      desc("stats_query_duration_seconds", "How long the last statistics query took."),
		dead: prometheus.NewDesc(prefix+"dead_tuple_ratio",
			"Share of dead row versions in the table (relation=table), its lanes table (lanes) and its lane notes table (notes), as PostgreSQL last counted them.",
			[]string{"relation"}, constLabels),
		horizon: desc("oldest_transaction_age_seconds",
			"Age of the oldest transaction of the database that holds back the xmin horizon (vacuum removes nothing deleted after it started); 0 when none."),
		partitions: desc("partitions", "Partitions of a table in the partitioned layout, its default partition aside."),
		ahead: desc("partitions_ahead_seconds",
			"How long until the last partition of a table in the partitioned layout ends; rows written after it land in the default partition. Relays keep it at least 3 intervals."),
	}
	if reg != nil {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("stats collector of %q: register: %w", admin.table.Name, err)
		}
	}
	return c, nil
}

// Describe implements prometheus.Collector.
func (c *StatsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.pending, c.due, c.leased, c.expired, c.failed, c.completed, c.oldest,
		c.keys, c.held, c.blocked, c.up, c.took, c.dead, c.horizon, c.partitions, c.ahead} {
		ch <- d
	}
}

// Collect implements prometheus.Collector. It queries the database when the
// cached figures are older than the interval.
func (c *StatsCollector) Collect(ch chan<- prometheus.Metric) {
	s, h, err, took := c.snapshot()
	gauge := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v)
	}
	gauge(c.took, took.Seconds())
	if err != nil {
		gauge(c.up, 0)
		return
	}
	gauge(c.up, 1)
	gauge(c.pending, float64(s.Pending))
	gauge(c.due, float64(s.Due))
	gauge(c.leased, float64(s.Leased))
	gauge(c.expired, float64(s.ExpiredLeases))
	gauge(c.failed, float64(s.Failed))
	if s.Completed >= 0 {
		gauge(c.completed, float64(s.Completed))
	}
	gauge(c.oldest, s.OldestPendingAge.Seconds())
	gauge(c.keys, float64(s.Lanes))
	gauge(c.held, float64(s.HeldKeys))
	gauge(c.blocked, float64(s.BlockedKeys))
	for rel, v := range map[string]float64{"table": h.TableDeadRatio, "lanes": h.LanesDeadRatio, "notes": h.NotesDeadRatio} {
		ch <- prometheus.MustNewConstMetric(c.dead, prometheus.GaugeValue, v, rel)
	}
	gauge(c.horizon, h.OldestTransactionAge.Seconds())
	if h.Partitioned {
		gauge(c.partitions, float64(h.Partitions))
		gauge(c.ahead, time.Until(h.CoveredUntil).Seconds())
	}
}

// snapshot returns the cached figures, refreshing them first when they are
// older than the interval. Concurrent scrapes wait for one query. A failed
// query is cached too, so a database in trouble is not asked more often.
func (c *StatsCollector) snapshot() (Overview, Health, error, time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.at.IsZero() || time.Since(c.at) >= c.interval {
		ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
		start := time.Now()
		c.stats, c.err = c.admin.Overview(ctx)
		if c.err == nil {
			c.health, c.err = c.admin.Health(ctx)
		}
		c.duration = time.Since(start)
		cancel()
		c.at = time.Now()
	}
	return c.stats, c.health, c.err, c.duration
}
