package postgres

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/omnibus-go/omnibus/bus"
)

// AllTopics subscribes to the rows of every topic of the table. The outbox
// relay uses it: one relay delivers every destination.
const AllTopics = "*"

// FailedPolicy says what a terminally failed row does to the rows behind it.
type FailedPolicy int

const (
	// FailedSkip (the default): a failed row does not hold back its key; its
	// successors proceed. Requeueing it later delivers it out of order.
	FailedSkip FailedPolicy = iota
	// FailedBlock keeps the key frozen behind a failed row until an operator
	// requeues or deletes it.
	FailedBlock
)

// Defaults of SubscriberConfig.
const (
	DefaultBatchSize      = 100
	DefaultRunLength      = 16
	DefaultLease          = 30 * time.Second
	DefaultPollInterval   = time.Second
	DefaultSettleInterval = 2 * time.Millisecond
	DefaultSettleBatch    = 1000
	DefaultSweepInterval  = time.Minute
	// DefaultVacuumInterval is how often a Subscriber vacuums the lanes
	// and notes tables of its table.
	DefaultVacuumInterval = 10 * time.Second
	DefaultCloseTimeout   = 30 * time.Second
	DefaultTransientDelay = time.Second
	DefaultMaxErrorLength = 2048
)

// Limits of SubscriberConfig's sizes: Validate refuses larger values (they
// size queues and statements, and would exhaust memory long before they
// helped throughput).
const (
	// MaxBatchSize bounds BatchSize (relay.batch_size in bus.Config).
	MaxBatchSize = bus.MaxRelayBatchSize
	// MaxRunLength bounds RunLength (relay.run_length in bus.Config).
	MaxRunLength = bus.MaxRelayRunLength
	// MaxSettleBatch bounds SettleBatch (the settlement queue holds four times as many).
	MaxSettleBatch = 10_000
)

// SubscriberConfig configures a Subscriber. Zero values mean the defaults.
type SubscriberConfig struct {
	// Table is the outbox or inbox table. Default DefaultOutboxTable, or
	// DefaultInboxTable when Kind is KindInbox.
	Table string
	// Kind tells an outbox table from an inbox table. Default KindOutbox.
	Kind Kind
	// ConsumerGroup selects the inbox rows of one consumer group. Required for
	// an inbox, not allowed for an outbox.
	ConsumerGroup string
	// WorkerID names this worker in leases. Default: host name, process id
	// and a random suffix; it must be unique among running workers.
	WorkerID string
	// BatchSize is how many keys (lanes) and how many unkeyed rows one fetch
	// may take. Default DefaultBatchSize.
	BatchSize int
	// RunLength is how many rows of one key a fetch takes at most: the head
	// and the rows right behind it. 1 is head-only. Default DefaultRunLength.
	RunLength int
	// MaxInFlight bounds the keys and unkeyed rows being delivered at once.
	// Default 2 × BatchSize.
	MaxInFlight int
	// Lease is how long fetched rows stay reserved for this worker; it is
	// renewed every Lease/3 while their handlers run. Default DefaultLease.
	Lease time.Duration
	// PollInterval is how often the table is polled when no notification
	// arrives. Default DefaultPollInterval.
	PollInterval time.Duration
	// DisableListen turns LISTEN/NOTIFY wake-ups off; only polling is used.
	DisableListen bool
	// SettleInterval is how long acks and nacks are gathered before they are
	// written in one statement. Default DefaultSettleInterval.
	SettleInterval time.Duration
	// SettleBatch flushes settlements early when this many are waiting.
	// Default DefaultSettleBatch.
	SettleBatch int
	// SweepInterval is how often missing lanes are recreated; a sweep that
	// took long waits sweepCostFactor times what it took instead. Default
	// DefaultSweepInterval; negative turns the sweep off.
	SweepInterval time.Duration
	// VacuumInterval is how often the lanes and notes tables of Table are
	// vacuumed (both are small, and every lease, give-back and new key
	// leaves a dead version in them; docs/operations.md, "Vacuum"). It
	// takes a role that owns them; for another, PostgreSQL vacuums
	// nothing and autovacuum does it. Default DefaultVacuumInterval;
	// negative turns it off.
	VacuumInterval time.Duration
	// PartitionRetention applies to a table in the partitioned layout
	// (Table.PartitionInterval), where every Subscriber keeps partitions
	// created PartitionsAhead intervals ahead: partitions that ended longer
	// ago than this and hold no pending and no failed row are dropped, and
	// dedup entries as old are forgotten (docs/operations.md, "Partitions").
	// 0 drops nothing. Negative turns partition maintenance off.
	PartitionRetention time.Duration
	// CloseTimeout is how long Close waits for in-flight messages; after it
	// their rows are released for another worker. Default DefaultCloseTimeout.
	CloseTimeout time.Duration
	// TransientDelay is when a transient failure without its own retry time
	// is tried again. Default DefaultTransientDelay.
	TransientDelay time.Duration
	// FailedPolicy: FailedSkip (default) or FailedBlock.
	FailedPolicy FailedPolicy
	// MaxErrorLength truncates stored error texts. Default DefaultMaxErrorLength.
	MaxErrorLength int
	// Observer, when set, is told the size and duration of every fetch and
	// settlement batch (Metrics exports them to Prometheus). Nil: off.
	Observer Observer

	// compactMinDead: see engine.compact. Default compactMinDead; tests
	// lower it.
	compactMinDead int64
}

func (c *SubscriberConfig) setDefaults() {
	if c.Table == "" {
		c.Table = DefaultOutboxTable
		if c.Kind == KindInbox {
			c.Table = DefaultInboxTable
		}
	}
	if c.WorkerID == "" {
		host, _ := os.Hostname()
		c.WorkerID = host + "-" + strconv.Itoa(os.Getpid()) + "-" + uuid.NewString()[:8]
	}
	if c.BatchSize == 0 {
		c.BatchSize = DefaultBatchSize
	}
	if c.RunLength == 0 {
		c.RunLength = DefaultRunLength
	}
	if c.MaxInFlight == 0 {
		c.MaxInFlight = 2 * c.BatchSize
	}
	if c.Lease == 0 {
		c.Lease = DefaultLease
	}
	if c.PollInterval == 0 {
		c.PollInterval = DefaultPollInterval
	}
	if c.SettleInterval == 0 {
		c.SettleInterval = DefaultSettleInterval
	}
	if c.SettleBatch == 0 {
		c.SettleBatch = DefaultSettleBatch
	}
	if c.compactMinDead == 0 {
		c.compactMinDead = compactMinDead
	}
	if c.VacuumInterval == 0 {
		c.VacuumInterval = DefaultVacuumInterval
	}
	if c.SweepInterval == 0 {
		c.SweepInterval = DefaultSweepInterval
	}
	if c.CloseTimeout == 0 {
		c.CloseTimeout = DefaultCloseTimeout
	}
	if c.TransientDelay == 0 {
		c.TransientDelay = DefaultTransientDelay
	}
	if c.MaxErrorLength == 0 {
		c.MaxErrorLength = DefaultMaxErrorLength
	}
}

// Validate reports the first invalid field.
func (c SubscriberConfig) Validate() error {
	if _, err := parseTableName(c.Table); err != nil {
		return fmt.Errorf("Table: %w", err)
	}
	switch {
	case c.Kind != KindOutbox && c.Kind != KindInbox:
		return fmt.Errorf("Kind: unknown kind %d", c.Kind)
	case c.Kind == KindInbox && c.ConsumerGroup == "":
		return errors.New("ConsumerGroup: required for an inbox table")
	case c.Kind == KindOutbox && c.ConsumerGroup != "":
		return errors.New("ConsumerGroup: an outbox table has no consumer groups")
	case c.BatchSize < 1:
		return fmt.Errorf("BatchSize: must be at least 1, got %d", c.BatchSize)
	case c.BatchSize > MaxBatchSize:
		return fmt.Errorf("BatchSize: at most %d, got %d", MaxBatchSize, c.BatchSize)
	case c.RunLength < 1:
		return fmt.Errorf("RunLength: must be at least 1, got %d", c.RunLength)
	case c.RunLength > MaxRunLength:
		return fmt.Errorf("RunLength: at most %d, got %d", MaxRunLength, c.RunLength)
	case c.MaxInFlight < 1:
		return fmt.Errorf("MaxInFlight: must be at least 1, got %d", c.MaxInFlight)
	case c.Lease < time.Second:
		return fmt.Errorf("Lease: must be at least 1s, got %s", c.Lease)
	case c.PollInterval < 0:
		return fmt.Errorf("PollInterval: must not be negative, got %s", c.PollInterval)
	case c.SettleInterval < 0:
		return fmt.Errorf("SettleInterval: must not be negative, got %s", c.SettleInterval)
	case c.SettleBatch < 1:
		return fmt.Errorf("SettleBatch: must be at least 1, got %d", c.SettleBatch)
	case c.SettleBatch > MaxSettleBatch:
		return fmt.Errorf("SettleBatch: at most %d, got %d", MaxSettleBatch, c.SettleBatch)
	case c.CloseTimeout < 0:
		return fmt.Errorf("CloseTimeout: must not be negative, got %s", c.CloseTimeout)
	case c.TransientDelay < 0:
		return fmt.Errorf("TransientDelay: must not be negative, got %s", c.TransientDelay)
	case c.FailedPolicy != FailedSkip && c.FailedPolicy != FailedBlock:
		return fmt.Errorf("FailedPolicy: unknown policy %d", c.FailedPolicy)
	case c.MaxErrorLength < 1:
		return fmt.Errorf("MaxErrorLength: must be at least 1, got %d", c.MaxErrorLength)
	}
	return nil
}

// ErrClosed is returned by Subscribe after Close.
var ErrClosed = errors.New("postgres subscriber: closed")

// Subscriber delivers the pending rows of one outbox or inbox table as
// Watermill messages, in order per (topic, partition key): a key's rows go
// out one at a time, each only after the previous one was acked, while
// different keys are delivered concurrently. See the package documentation
// for the ordering contract.
//
// Each message carries a bus.Delivery in its context. A Nack is settled from
// the message's bus.Settlement (recorded by the Retry middleware): counted
// failures spend an attempt and wait for their retry time, transient ones
// spend none, permanent ones fail the row. A Nack without a settlement (no
// Retry middleware) means "deliver again", as everywhere in Watermill: it
// counts an attempt, never fails the row, and delivers it again after
// TransientDelay (never in a hot loop).
type Subscriber struct {
	pool *pgxpool.Pool
	cfg  SubscriberConfig
	log  *slog.Logger
	eng  *engine

	flush *flusher

	mu      sync.Mutex
	closed  bool
	subs    map[*subscription]struct{}
	closing chan struct{}
	subWG   sync.WaitGroup // subscriptions
	wg      sync.WaitGroup // flusher and maintenance loop

	tracked tracker

	// compactions keeps the compaction log to a line a minute (maintain's
	// goroutine alone uses it).
	compactions compactLog
}

// NewSubscriber validates cfg and returns a Subscriber over pool. The pool
// stays the caller's; Close does not close it. A nil logger means no logging.
func NewSubscriber(pool *pgxpool.Pool, cfg SubscriberConfig, logger *slog.Logger) (*Subscriber, error) {
	if pool == nil {
		return nil, errors.New("invalid config: pool: must not be nil")
	}
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("invalid config: %w", err)
	}
	tn, _ := parseTableName(cfg.Table)
	log := bus.LoggerOrNop(logger).With("table", cfg.Table)
	if cfg.ConsumerGroup != "" {
		log = log.With("consumer_group", cfg.ConsumerGroup)
	}
	s := &Subscriber{
		pool: pool,
		cfg:  cfg,
		log:  log,
		eng: &engine{
			pool:   pool,
			q:      newQueries(tn, cfg.Kind == KindInbox),
			worker: cfg.WorkerID,
			group:  cfg.ConsumerGroup,
			lease:  cfg.Lease,
			run:    cfg.RunLength,
			block:  cfg.FailedPolicy == FailedBlock,
		},
		subs:    map[*subscription]struct{}{},
		closing: make(chan struct{}),
		tracked: newTracker(),
	}
	s.flush = newFlusher(s)
	s.wg.Add(4)
	go s.flush.run()
	go s.maintain()
	go s.vacuum()
	go s.partitions(newPartitioner(pool, tn, cfg.Kind == KindInbox))
	return s, nil
}

// Config returns the configuration in effect, defaults applied.
func (s *Subscriber) Config() SubscriberConfig { return s.cfg }

// Subscribe starts delivering the rows of topic (AllTopics for every topic)
// on the returned channel, which is closed when ctx ends or the Subscriber
// is closed.
func (s *Subscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	if topic == "" {
		return nil, errors.New("subscribe: topic: must not be empty (use postgres.AllTopics for every topic)")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, ErrClosed
	}
	sub := newSubscription(s, topic)
	s.subs[sub] = struct{}{}
	s.subWG.Add(1)
	go func() {
		defer s.subWG.Done()
		sub.run(ctx)
		s.mu.Lock()
		delete(s.subs, sub)
		s.mu.Unlock()
	}()
	return sub.out, nil
}

// Close stops fetching, releases the rows it fetched but did not deliver,
// waits up to CloseTimeout for in-flight messages, writes the outstanding
// settlements and returns. It is idempotent and safe to call concurrently.
func (s *Subscriber) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		<-s.flush.done
		s.wg.Wait()
		return nil
	}
	s.closed = true
	close(s.closing)
	s.mu.Unlock()
	s.subWG.Wait()
	close(s.flush.stop)
	s.wg.Wait()
	return nil
}

// vacuum vacuums the lanes and notes tables every VacuumInterval until
// Close (skipping a turn when another process just did), in a goroutine of
// its own: a vacuum of tables bloated behind a
// pinned horizon can take long, and must not delay lease renewals.
//
// After each vacuum it looks for dead versions the vacuum could not remove
// (compact). While it finds them (a long transaction holds the xmin
// horizon) it looks again every compactCheckInterval between vacuums: the
// lanes and notes tables gain a few dead versions per event, and every
// writer's lookup and every fetch walks them until the next compaction.
func (s *Subscriber) vacuum() {
	defer s.wg.Done()
	if s.cfg.VacuumInterval <= 0 {
		return
	}
	t := time.NewTicker(s.cfg.VacuumInterval)
	defer t.Stop()
	check := time.NewTicker(compactCheckInterval(s.cfg.VacuumInterval))
	defer check.Stop()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-s.closing
		cancel()
	}()
	// pinned: look between vacuums. A compaction between them keeps it set
	// at the next vacuum, whose look may come right after one and find too
	// few dead versions to say.
	pinned, lately := false, false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			start := time.Now()
			_, err := s.eng.vacuum(ctx, s.cfg.VacuumInterval)
			switch took := time.Since(start); {
			case err != nil && ctx.Err() == nil:
				s.log.Warn("omnibus: vacuum of the lanes and notes tables failed", "error", err)
			case took > s.cfg.VacuumInterval:
				s.log.Info("omnibus: vacuum of the lanes and notes tables took longer than its interval (a long transaction may be holding the xmin horizon)",
					"took", took.Round(time.Millisecond), "interval", s.cfg.VacuumInterval)
			}
			again, _ := s.compact(ctx)
			pinned, lately = again || lately, false
		case <-check.C:
			if pinned {
				_, did := s.compact(ctx)
				lately = lately || did
			}
		}
	}
}

// compactCheckInterval is how often a Subscriber looks for dead versions to
// compact between its vacuums while the last vacuum left them: a tenth of
// the vacuum interval, never less than half a second.
func compactCheckInterval(vacuum time.Duration) time.Duration {
	return max(vacuum/10, 500*time.Millisecond)
}

// compact compacts the lanes and notes tables when vacuum could not remove
// their dead versions (engine.compact): a long transaction holds the xmin
// horizon. It reports whether to look again before the next vacuum (a
// table held that many, and the compaction did not fail for another reason
// than its lock timeout: a role without the TRUNCATE privilege would fail,
// and warn, at every look), and whether it compacted a table.
func (s *Subscriber) compact(ctx context.Context) (again, compacted bool) {
	tables, over, err := s.eng.compact(ctx, s.cfg.compactMinDead)
	switch {
	case err != nil && isLockTimeout(err):
		s.log.Debug("omnibus: compaction of the lanes and notes tables waited too long for its lock; trying again", "error", err)
	case err != nil:
		if ctx.Err() == nil {
			s.log.Warn("omnibus: compaction of the lanes and notes tables failed", "error", err)
		}
		over = false
	}
	if len(tables) > 0 {
		if n, ok := s.compactions.note(time.Now()); ok {
			s.log.Info("omnibus: compacted tables whose dead versions vacuum could not remove (a long transaction is holding the xmin horizon)",
				"tables", tables, "compactions", n)
		}
	}
	return over, len(tables) > 0
}

// compactLogEvery is the least time between two compaction log lines.
const compactLogEvery = time.Minute

// compactLog counts compactions and lets one log line through per
// compactLogEvery: behind a pinned horizon a busy relay compacts every few
// seconds (make soak-horizon: every 2-4 s), and a line each time would bury
// everything else the process logs for as long as the transaction stays
// open. The first compaction is logged at once, so the operator learns of
// the pin when it starts to cost.
type compactLog struct {
	next  time.Time
	since int
}

// note counts a compaction at now and reports whether to log it, with the
// number of compactions the line stands for (this one and those not logged
// since the last line).
func (l *compactLog) note(now time.Time) (compactions int, log bool) {
	l.since++
	if now.Before(l.next) {
		return 0, false
	}
	n := l.since
	l.since, l.next = 0, now.Add(compactLogEvery)
	return n, true
}

// partitions maintains the partitions of a table in the partitioned layout
// until Close: at once, then every quarter of the partition interval (at
// least every 10 s, at most every 5 min). One Subscriber of a fleet does a
// round at a time; the others skip theirs.
func (s *Subscriber) partitions(p *partitioner) {
	defer s.wg.Done()
	if s.cfg.PartitionRetention < 0 {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-s.closing
		cancel()
	}()
	every := time.Duration(0)
	for {
		if every == 0 {
			interval, err := p.interval(ctx, s.pool)
			switch {
			case err != nil && ctx.Err() == nil:
				s.log.Warn("omnibus: reading the table's layout failed; partitions are not maintained until it works", "error", err)
			case err == nil && interval == 0:
				return // the single table
			case err == nil:
				every = min(max(interval/4, 10*time.Second), 5*time.Minute)
			}
		}
		if every > 0 {
			rep, err := p.maintain(ctx, s.cfg.PartitionRetention)
			switch {
			case err != nil && ctx.Err() == nil:
				s.log.Warn("omnibus: partition maintenance failed", "error", err)
			case len(rep.Created)+len(rep.Dropped)+len(rep.Deferred) > 0 || rep.DedupForgotten > 0:
				s.log.Info("omnibus: partition maintenance", "created", rep.Created, "dropped", rep.Dropped,
					"kept", rep.Kept, "deferred", rep.Deferred, "dedup_forgotten", rep.DedupForgotten)
			}
		}
		wait := every
		if wait == 0 {
			wait = 10 * time.Second
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// wakeAll signals every subscription to fetch now.
func (s *Subscriber) wakeAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for sub := range s.subs {
		signal(sub.wake)
	}
}

// maintain renews leases of in-flight rows and sweeps for missing lanes.
func (s *Subscriber) maintain() {
	defer s.wg.Done()
	extend := time.NewTicker(s.cfg.Lease / 3)
	defer extend.Stop()
	var sweep <-chan time.Time
	var sweepTimer *time.Timer
	if s.cfg.SweepInterval > 0 {
		sweepTimer = time.NewTimer(s.cfg.SweepInterval)
		defer sweepTimer.Stop()
		sweep = sweepTimer.C
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-s.closing
		// Keep renewing while Close waits for in-flight handlers.
		select {
		case <-time.After(s.cfg.CloseTimeout + time.Second):
		case <-s.flush.done:
		}
		cancel()
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case <-extend.C:
			ids, lanes := s.tracked.snapshot()
			start := time.Now()
			renewed, lost, err := s.eng.extend(ctx, ids, lanes)
			if err != nil && ctx.Err() == nil {
				s.log.Warn("omnibus: renewing leases failed", "error", err)
			}
			s.tracked.renewed(start, s.cfg.Lease, renewed, lost)
		case <-sweep:
			start := time.Now()
			n, err := s.eng.sweep(ctx)
			switch {
			case err != nil && ctx.Err() == nil:
				s.log.Warn("omnibus: lane sweep failed", "error", err)
			case n > 0:
				s.log.Info("omnibus: lane sweep recreated lanes", "lanes", n)
				s.wakeAll()
			}
			took := time.Since(start)
			next := sweepEvery(s.cfg.SweepInterval, took)
			if next > s.cfg.SweepInterval {
				s.log.Debug("omnibus: the lane sweep was slow; the next one waits longer than its interval",
					"took", took.Round(time.Millisecond), "next_in", next.Round(time.Second))
			}
			sweepTimer.Reset(next)
		}
	}
}

// sweepCostFactor bounds what the lane sweep costs: a sweep that took d
// waits at least sweepCostFactor times d before the next, so that sweeping
// takes at most 1 % of a connection's time. The sweep reads the index
// entry of every pending row, and while the xmin horizon is pinned of every
// version of a row that was ever pending since (954 ms at minute 4 of the
// pinned stand, reading the whole table through the buffer cache, and more
// every minute); it only repairs lanes lost to hand edits.
const sweepCostFactor = 100

// sweepEvery is how long a Subscriber waits for its next lane sweep after
// one that took took: its interval, or longer when the sweep was slow.
func sweepEvery(interval, took time.Duration) time.Duration {
	return max(interval, sweepCostFactor*took)
}

// tracker knows the rows and lanes this worker holds, for lease renewal,
// and the lease of each lane a unit is delivering. Only rows with a lease
// of their own are tracked: the others are covered by their lane's.
type tracker struct {
	mu     sync.Mutex
	rows   map[int64]struct{}
	lanes  map[laneKey]int
	leases map[laneKey]*unitLease
}

func newTracker() tracker {
	return tracker{rows: map[int64]struct{}{}, lanes: map[laneKey]int{}, leases: map[laneKey]*unitLease{}}
}

func (t *tracker) add(u unit) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, r := range u.rows {
		if r.own {
			t.rows[r.id] = struct{}{}
		}
	}
	if u.lane != nil {
		t.lanes[*u.lane]++
		if old := t.leases[*u.lane]; old != nil {
			// A unit of this worker still delivers the lane, under a lease
			// that must have run out for the lane to be leased again: that
			// unit stops, as if renewal had found the lane taken, and
			// leaves the lane to this one.
			old.supersede()
		}
		t.leases[*u.lane] = u.lease
	}
}

// done forgets the rows of a unit that ended, and its lane's lease. The
// lane stays tracked until it is given back (removeLane), unless the lease
// was superseded: the unit does not give the lane back then (the new lease's
// unit does), so it is forgotten here.
func (t *tracker) done(u unit) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, r := range u.rows {
		delete(t.rows, r.id)
	}
	if u.lane == nil {
		return
	}
	if t.leases[*u.lane] == u.lease {
		delete(t.leases, *u.lane)
	}
	if u.lease.superseded.Load() {
		t.removeLaneLocked(*u.lane)
	}
}

// continued replaces a unit that ended by the next run of its lane
// (subscription.next): the lane stays held, so its count does not change.
// It reports false, and changes nothing, when old's lease was superseded.
func (t *tracker) continued(old, next unit) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if old.lease.superseded.Load() {
		return false
	}
	for _, r := range old.rows {
		delete(t.rows, r.id)
	}
	for _, r := range next.rows {
		if r.own {
			t.rows[r.id] = struct{}{}
		}
	}
	t.leases[*next.lane] = next.lease
	return true
}

func (t *tracker) addLane(k laneKey) {
	t.mu.Lock()
	t.lanes[k]++
	t.mu.Unlock()
}

func (t *tracker) removeLane(k laneKey) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.removeLaneLocked(k)
}

func (t *tracker) removeLaneLocked(k laneKey) {
	if t.lanes[k]--; t.lanes[k] <= 0 {
		delete(t.lanes, k)
	}
}

func (t *tracker) snapshot() ([]int64, []laneKey) {
	t.mu.Lock()
	defer t.mu.Unlock()
	ids := make([]int64, 0, len(t.rows))
	for id := range t.rows {
		ids = append(ids, id)
	}
	lanes := make([]laneKey, 0, len(t.lanes))
	for k := range t.lanes {
		lanes = append(lanes, k)
	}
	return ids, lanes
}

// renewed records the outcome of a lease renewal that started at from.
func (t *tracker) renewed(from time.Time, d time.Duration, renewed, lost []laneKey) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, k := range renewed {
		if l := t.leases[k]; l != nil {
			l.renewed(from, d)
		}
	}
	for _, k := range lost {
		if l := t.leases[k]; l != nil {
			l.lose()
		}
	}
}
