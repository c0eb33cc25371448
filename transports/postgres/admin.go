package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ErrNotFound reports that no row matched: Requeue found no failed row with
// the id it was given. Test for it with errors.Is.
var ErrNotFound = errors.New("postgres: row not found")

// DefaultListLimit is how many rows ListFailed returns when limit is 0.
const DefaultListLimit = 100

// Lock waits of requeueing. A requeue creates or updates lanes; a writer that
// has just created a lane holds it until its business transaction commits,
// and relays hold lanes for the length of a statement. Admin gives up such a
// wait after adminLockTimeout (well under PostgreSQL's default
// deadlock_timeout of 1 s, so if a writer and a requeue ever deadlock, the
// requeue is the one that yields, not the business transaction) and retries
// the batch, up to adminLockRetries times.
const (
	adminLockTimeout = 200 * time.Millisecond
	adminLockRetries = 25
)

// Admin inspects and repairs one outbox or inbox table: statistics, failed
// rows, requeueing, expired leases, retention and lane sweeps. It is what the
// `omnibus outbox|inbox` commands run. An Admin is safe for concurrent use,
// and its operations are safe to run while relays and writers work on the
// table.
type Admin struct {
	pool  *pgxpool.Pool
	table Table
	tn    tableName
	inbox bool
	group *string // consumer group filter (inbox only); nil means every group
	q     *queries
	aq    *adminQueries

	// lockTimeout and onLockRetry are for tests.
	lockTimeout time.Duration
	onLockRetry func(err error)
}

// NewAdmin returns an Admin for table t over pool. It validates the table
// name and kind but does not touch the database; run Migrate first. The pool
// stays the caller's.
func NewAdmin(pool *pgxpool.Pool, t Table) (*Admin, error) {
	if pool == nil {
		return nil, errors.New("invalid config: pool: must not be nil")
	}
	tn, err := parseTableName(t.Name)
	if err != nil {
		return nil, fmt.Errorf("invalid config: Table: %w", err)
	}
	if t.Kind != KindOutbox && t.Kind != KindInbox {
		return nil, fmt.Errorf("invalid config: Kind: unknown kind %d", t.Kind)
	}
	inbox := t.Kind == KindInbox
	return &Admin{
		pool:        pool,
		table:       t,
		tn:          tn,
		inbox:       inbox,
		q:           newQueries(tn, inbox),
		aq:          newAdminQueries(tn, inbox, false),
		lockTimeout: adminLockTimeout,
	}, nil
}

// WithConsumerGroup returns an Admin restricted to the rows and lanes of one
// consumer group of an inbox table: Stats, ListFailed, Requeue,
// RequeueAllFailed, ReleaseExpiredLeases and Cleanup see only that group.
// SweepLanes always covers the whole table. An outbox has no consumer groups,
// and group must not be empty.
func (a *Admin) WithConsumerGroup(group string) (*Admin, error) {
	switch {
	case !a.inbox:
		return nil, fmt.Errorf("admin of %q: consumer group: an outbox table has no consumer groups", a.tn)
	case group == "":
		return nil, fmt.Errorf("admin of %q: consumer group: must not be empty", a.tn)
	}
	b := *a
	b.group = &group
	b.aq = newAdminQueries(a.tn, true, true)
	return &b, nil
}

// Table returns the table the Admin works on.
func (a *Admin) Table() Table { return a.table }

// ConsumerGroup returns the consumer group the Admin is restricted to, or ""
// when it sees every group.
func (a *Admin) ConsumerGroup() string {
	if a.group == nil {
		return ""
	}
	return *a.group
}

// args adds the consumer group filter, if any, to a statement's arguments.
func (a *Admin) args(na pgx.NamedArgs) pgx.NamedArgs {
	if na == nil {
		na = pgx.NamedArgs{}
	}
	if a.group != nil {
		na["group"] = *a.group
	}
	return na
}

// Stats is a snapshot of a table, taken in one statement.
type Stats struct {
	// Pending rows wait for delivery (Due, Leased, delayed and retrying ones).
	Pending int64
	// Due rows are pending, scheduled at or before now and not under a live
	// lease: they can be fetched now, unless an earlier row of their key is
	// in line.
	Due int64
	// Leased rows are pending and held by a relay or worker whose lease has
	// not expired.
	Leased int64
	// ExpiredLeases counts pending rows whose lease has expired but was not
	// cleared (their worker stopped). Relays take such rows over anyway;
	// ReleaseExpiredLeases clears them.
	ExpiredLeases int64
	// Failed rows have spent their attempts or failed permanently.
	Failed int64
	// Completed rows were delivered; Cleanup deletes old ones.
	Completed int64
	// OldestPendingAge is how long ago the oldest pending row was created;
	// 0 when nothing is pending. Delayed rows count from their creation, not
	// from their deliver-at time.
	OldestPendingAge time.Duration
	// Lanes is the number of keys (topic, partition key[, consumer group])
	// with pending rows.
	Lanes int64
	// HeldKeys counts keys held behind a tried head: the first in-line
	// pending row of the key has failed at least once and waits for its
	// retry time, so nothing behind it is delivered until then.
	HeldKeys int64
	// BlockedKeys counts keys frozen behind a failed row by the FailedBlock
	// policy, as of the last time a relay looked at them.
	BlockedKeys int64
}

// Stats counts the table's rows by state and its keys. It scans the table
// once (and visits the head of every lane), so its cost grows with the table;
// run Cleanup to keep completed rows in check.
func (a *Admin) Stats(ctx context.Context) (Stats, error) {
	var (
		s      Stats
		oldest *time.Time
		now    time.Time
	)
	err := a.pool.QueryRow(ctx, a.aq.stats, a.args(nil)).Scan(
		&s.Pending, &s.Due, &s.Leased, &s.ExpiredLeases, &s.Failed, &s.Completed, &oldest, &now,
		&s.Lanes, &s.BlockedKeys, &s.HeldKeys)
	if err != nil {
		return Stats{}, fmt.Errorf("stats of %q: %w", a.tn, err)
	}
	if oldest != nil && now.After(*oldest) {
		s.OldestPendingAge = now.Sub(*oldest)
	}
	return s, nil
}

// Health is what a table needs watched over months of running: how much of
// its relations vacuum has yet to clean, and whether anything keeps vacuum
// from cleaning at all.
type Health struct {
	// TableDeadRatio, LanesDeadRatio and NotesDeadRatio are, for the table, its lanes table and its lane notes
	// table, the share of dead row versions among all (0 to 1), as
	// PostgreSQL's statistics last counted them.
	TableDeadRatio, LanesDeadRatio, NotesDeadRatio float64
	// OldestTransactionAge is the age of the oldest transaction in the
	// database that holds back the xmin horizon (a session with an open
	// snapshot, idle in transaction included, or a prepared transaction);
	// 0 when none. While it is open, vacuum removes no version deleted after
	// it started, in any table: see docs/operations.md, "Long transactions".
	OldestTransactionAge time.Duration
	// Partitioned tells a table in the partitioned layout. Partitions is then
	// how many partitions it has (its default partition aside), and
	// CoveredUntil when the last of them ends: writes after it land in the
	// default partition, so it should stay PartitionsAhead intervals away.
	Partitioned  bool
	Partitions   int
	CoveredUntil time.Time
}

// Health reads the table's Health: its statistics in one statement, and,
// for the partitioned layout, its partitions.
func (a *Admin) Health(ctx context.Context) (Health, error) {
	var (
		h   Health
		age time.Duration
	)
	err := a.pool.QueryRow(ctx, a.aq.health, pgx.NamedArgs{
		"t": a.tn.quoted(), "l": a.tn.derived("_lanes").quoted(), "n": a.tn.derived("_notes").quoted(),
	}).Scan(&h.TableDeadRatio, &h.LanesDeadRatio, &h.NotesDeadRatio, &age)
	if err != nil {
		return Health{}, fmt.Errorf("health of %q: %w", a.tn, err)
	}
	h.OldestTransactionAge = age
	p := newPartitioner(a.pool, a.tn, a.inbox)
	interval, err := p.interval(ctx, a.pool)
	if err != nil || interval == 0 {
		return h, err
	}
	names, err := p.partitions(ctx, a.pool)
	if err != nil {
		return h, err
	}
	h.Partitioned = true
	h.Partitions, h.CoveredUntil = p.coverage(names, interval)
	return h, nil
}

// MaintainPartitions runs one round of partition maintenance on a table in
// the partitioned layout, as every Subscriber of the table does on its own
// (SubscriberConfig.PartitionRetention): it creates the partitions up to
// PartitionsAhead intervals ahead, drops those that ended more than
// retention ago and hold no pending and no failed row (retention 0: none),
// and forgets dedup entries as old. It fails for a single table.
func (a *Admin) MaintainPartitions(ctx context.Context, retention time.Duration) (PartitionReport, error) {
	if retention < 0 {
		return PartitionReport{}, fmt.Errorf("partitions of %q: retention: must not be negative, got %s", a.tn, retention)
	}
	return newPartitioner(a.pool, a.tn, a.inbox).maintain(ctx, retention)
}

// FailedRow is a terminally failed row, as ListFailed returns it.
type FailedRow struct {
	ID      int64
	EventID string // "" when the inbox row has no event id
	// ConsumerGroup is the inbox consumer group; "" for the outbox.
	ConsumerGroup string
	Topic         string
	PartitionKey  string // "" for an unkeyed row
	EventType     string // "" when not set
	Attempts      int
	MaxAttempts   int
	LastError     string
	CreatedAt     time.Time
}

// ListFailed returns up to limit failed rows with an id greater than afterID,
// in id order. Page through all of them by passing the last ID returned as
// the next afterID; an empty result means there are no more. limit 0 means
// DefaultListLimit.
func (a *Admin) ListFailed(ctx context.Context, limit int, afterID int64) ([]FailedRow, error) {
	switch {
	case limit < 0:
		return nil, fmt.Errorf("list failed rows of %q: limit: must not be negative, got %d", a.tn, limit)
	case afterID < 0:
		return nil, fmt.Errorf("list failed rows of %q: afterID: must not be negative, got %d", a.tn, afterID)
	case limit == 0:
		limit = DefaultListLimit
	}
	rows, err := a.pool.Query(ctx, a.aq.failedMatching(FailedFilter{}), a.args(pgx.NamedArgs{"after": afterID, "limit": limit}))
	if err != nil {
		return nil, fmt.Errorf("list failed rows of %q: %w", a.tn, err)
	}
	defer rows.Close()
	var out []FailedRow
	for rows.Next() {
		var r FailedRow
		if err := rows.Scan(&r.ID, &r.EventID, &r.ConsumerGroup, &r.Topic, &r.PartitionKey, &r.EventType,
			&r.Attempts, &r.MaxAttempts, &r.LastError, &r.CreatedAt); err != nil {
			return nil, fmt.Errorf("list failed rows of %q: scan: %w", a.tn, err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list failed rows of %q: %w", a.tn, err)
	}
	return out, nil
}

// Requeue gives the failed row id a fresh start: it becomes pending with 0
// attempts spent, due now, and its key's lane is created or made ready in
// the same transaction, so a relay picks it up on its next fetch (relays are
// notified). Its last_error is kept as the record of why it failed until it
// fails again. Under FailedSkip the rows of its key that went on without it
// were already delivered, so it is delivered out of order; if earlier rows
// of its key are still pending, it goes out in its id order among them.
//
// It returns an error wrapping ErrNotFound when there is no failed row with
// that id (in the Admin's consumer group).
func (a *Admin) Requeue(ctx context.Context, id int64) error {
	if id < 1 {
		return fmt.Errorf("requeue %d in %q: id: must be positive", id, a.tn)
	}
	var n int64
	err := a.requeueTx(ctx, func(tx pgx.Tx) error {
		var last *int64
		return tx.QueryRow(ctx, a.aq.requeue,
			a.args(pgx.NamedArgs{"after": id - 1, "upto": id, "batch": 1})).Scan(&n, &last)
	})
	if err != nil {
		return fmt.Errorf("requeue %d in %q: %w", id, a.tn, err)
	}
	if n == 0 {
		return fmt.Errorf("requeue %d in %q: no failed row has this id: %w", id, a.tn, ErrNotFound)
	}
	a.notify(ctx)
	return nil
}

// RequeueAllFailed requeues, as Requeue does, every row that is failed when
// it starts, batch rows per transaction in id order, and returns how many it
// requeued. Rows that fail again while it runs are not requeued a second
// time. progress, if not nil, is called after each batch with the total so
// far. When ctx ends it stops between batches; batches already committed
// stay requeued and are counted in the result.
func (a *Admin) RequeueAllFailed(ctx context.Context, batch int, progress func(done int64)) (int64, error) {
	if batch < 1 {
		return 0, fmt.Errorf("requeue failed rows of %q: batch: must be at least 1, got %d", a.tn, batch)
	}
	var upto *int64
	if err := a.pool.QueryRow(ctx, a.aq.failedCeiling, a.args(nil)).Scan(&upto); err != nil {
		return 0, fmt.Errorf("requeue failed rows of %q: %w", a.tn, err)
	}
	if upto == nil {
		return 0, nil
	}
	var (
		done  int64
		after int64
	)
	for {
		if err := ctx.Err(); err != nil {
			return done, fmt.Errorf("requeue failed rows of %q: %w", a.tn, err)
		}
		var (
			n    int64
			last *int64
		)
		err := a.requeueTx(ctx, func(tx pgx.Tx) error {
			return tx.QueryRow(ctx, a.aq.requeue,
				a.args(pgx.NamedArgs{"after": after, "upto": *upto, "batch": batch})).Scan(&n, &last)
		})
		if err != nil {
			return done, fmt.Errorf("requeue failed rows of %q after id %d: %w", a.tn, after, err)
		}
		if last == nil {
			return done, nil
		}
		after = *last
		done += n
		if n > 0 {
			a.notify(ctx)
			if progress != nil {
				progress(done)
			}
		}
	}
}

// requeueTx runs one requeue statement in its own transaction with a short
// lock timeout, and retries the whole transaction when a lane lock could not
// be had in time. Callers notify relays after the commit, not inside the
// transaction: a NOTIFY takes a database-wide lock at commit that busy
// writers contend for, and the short lock timeout would apply to it too.
func (a *Admin) requeueTx(ctx context.Context, stmt func(pgx.Tx) error) error {
	for attempt := 1; ; attempt++ {
		err := pgx.BeginFunc(ctx, a.pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, a.q.lockTimeout,
				fmt.Sprintf("%dms", a.lockTimeout.Milliseconds())); err != nil {
				return err
			}
			return stmt(tx)
		})
		if err == nil || !isLockConflict(err) || attempt >= adminLockRetries {
			return err
		}
		if a.onLockRetry != nil {
			a.onLockRetry(err)
		}
		// A writer holds a lane; it commits soon. Wait a little, more each time.
		select {
		case <-ctx.Done():
			return errors.Join(ctx.Err(), err)
		case <-time.After(time.Duration(min(attempt, 10)) * 20 * time.Millisecond):
		}
	}
}

// isLockConflict reports a lock_timeout expiry or a deadlock.
func isLockConflict(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == "55P03" || pe.Code == "40P01")
}

// ReleaseExpiredLeases clears the leases that have expired on pending rows
// and on lanes, and returns how many of each it cleared. Relays take over
// expired leases by themselves; this tidies up after workers that stopped
// without settling, so that Stats and the table read true. Rows and lanes
// being locked at this moment are skipped.
func (a *Admin) ReleaseExpiredLeases(ctx context.Context) (rows, lanes int64, err error) {
	tag, err := a.pool.Exec(ctx, a.aq.releaseRows, a.args(nil))
	if err != nil {
		return 0, 0, fmt.Errorf("release expired leases of rows of %q: %w", a.tn, err)
	}
	rows = tag.RowsAffected()
	tag, err = a.pool.Exec(ctx, a.aq.releaseLanes, a.args(nil))
	if err != nil {
		return rows, 0, fmt.Errorf("release expired leases of lanes of %q: %w", a.tn, err)
	}
	lanes = tag.RowsAffected()
	if rows+lanes > 0 {
		a.notify(ctx)
	}
	return rows, lanes, nil
}

// Cleanup deletes completed rows that completed more than olderThan ago (0:
// every completed row), batch rows per statement, until none is left, and
// returns how many it deleted. The cutoff is fixed when it starts. progress,
// if not nil, is called after each batch with the total so far. When ctx ends
// it stops between batches and returns what it deleted so far. Pending and
// failed rows are never deleted.
func (a *Admin) Cleanup(ctx context.Context, olderThan time.Duration, batch int, progress func(deleted int64)) (int64, error) {
	switch {
	case olderThan < 0:
		return 0, fmt.Errorf("cleanup of %q: olderThan: must not be negative, got %s", a.tn, olderThan)
	case batch < 1:
		return 0, fmt.Errorf("cleanup of %q: batch: must be at least 1, got %d", a.tn, batch)
	}
	var cutoff time.Time
	if err := a.pool.QueryRow(ctx, a.aq.cleanupCutoff, pgx.NamedArgs{"older": olderThan}).Scan(&cutoff); err != nil {
		return 0, fmt.Errorf("cleanup of %q: %w", a.tn, err)
	}
	var deleted int64
	for {
		if err := ctx.Err(); err != nil {
			return deleted, fmt.Errorf("cleanup of %q: %w", a.tn, err)
		}
		tag, err := a.pool.Exec(ctx, a.aq.cleanup, a.args(pgx.NamedArgs{"cutoff": cutoff, "batch": batch}))
		if err != nil {
			return deleted, fmt.Errorf("cleanup of %q: %w", a.tn, err)
		}
		n := tag.RowsAffected()
		deleted += n
		if progress != nil && n > 0 {
			progress(deleted)
		}
		// A short batch means nothing is left, apart from rows another
		// Cleanup is deleting right now (skipped, not waited for).
		if n < int64(batch) {
			return deleted, nil
		}
	}
}

// CountCompletedOlderThan counts the completed rows that completed more than
// olderThan ago (in the Admin's consumer group, when it has one): what
// Cleanup(olderThan) would delete now. It reads the partial index on
// completed_at, so it costs time in proportion to those rows; the CLI uses it
// for Cleanup's progress bar.
func (a *Admin) CountCompletedOlderThan(ctx context.Context, olderThan time.Duration) (int64, error) {
	if olderThan < 0 {
		return 0, fmt.Errorf("count completed rows of %q: olderThan: must not be negative, got %s", a.tn, olderThan)
	}
	var n int64
	if err := a.pool.QueryRow(ctx, a.aq.countCleanup, a.args(pgx.NamedArgs{"older": olderThan})).Scan(&n); err != nil {
		return 0, fmt.Errorf("count completed rows of %q: %w", a.tn, err)
	}
	return n, nil
}

// SweepLanes creates the missing lane of every key that has pending rows but
// no lane (rows inserted with triggers disabled, lanes deleted by hand), and
// returns how many it created. Subscribers run the same sweep periodically
// (SubscriberConfig.SweepInterval). It covers every consumer group.
func (a *Admin) SweepLanes(ctx context.Context) (int64, error) {
	tag, err := a.pool.Exec(ctx, a.q.sweep)
	if err != nil {
		return 0, fmt.Errorf("sweep lanes of %q: %w", a.tn, err)
	}
	n := tag.RowsAffected()
	if n > 0 {
		a.notify(ctx)
	}
	return n, nil
}

// notify wakes the table's relays. It is best effort: they poll anyway.
func (a *Admin) notify(ctx context.Context) {
	_, _ = a.pool.Exec(ctx, a.q.notify, a.q.channel)
}

// LatestSchemaVersion is the highest migration this build of omnibus applies:
// a table whose recorded version is lower needs `omnibus migrate`.
func LatestSchemaVersion() int {
	if len(migrations) == 0 {
		return 0
	}
	return migrations[len(migrations)-1].version
}

// SchemaState is what the database holds of an Admin's table.
type SchemaState struct {
	// Exists reports that the table and its lanes table both exist.
	Exists bool
	// Version is the highest migration Migrate recorded for the table in
	// omnibus_schema_migrations (in the table's schema); 0 when none is
	// recorded: the table was never migrated, or was created from
	// `omnibus migrate --print` by another migration tool.
	Version int
	// Latest is LatestSchemaVersion: the version this build expects.
	Latest int
}

// Behind reports a table that Migrate recorded at a version older than this
// build's: `omnibus migrate` has migrations to apply. A table without a
// recorded version is not Behind (nothing tells which SQL made it).
func (s SchemaState) Behind() bool { return s.Version > 0 && s.Version < s.Latest }

// SchemaState reads whether the Admin's table exists and which migrations
// were recorded for it. It only reads the catalog and the bookkeeping table;
// it never fails because they are missing.
func (a *Admin) SchemaState(ctx context.Context) (SchemaState, error) {
	s := SchemaState{Latest: LatestSchemaVersion()}
	var booked bool
	err := a.pool.QueryRow(ctx, a.aq.schemaObjects,
		a.tn.quoted(), a.tn.derived("_lanes").quoted(), migrationsBook(a.tn)).Scan(&s.Exists, &booked)
	if err != nil {
		return SchemaState{}, fmt.Errorf("schema state of %q: %w", a.tn, err)
	}
	if !booked {
		return s, nil
	}
	if err := a.pool.QueryRow(ctx, a.aq.schemaVersion, a.tn.name).Scan(&s.Version); err != nil {
		return SchemaState{}, fmt.Errorf("schema state of %q: read applied version: %w", a.tn, err)
	}
	return s, nil
}

// Row is every column of one outbox or inbox row, as Admin.Row returns it.
type Row struct {
	ID            int64
	EventID       string // "" when the inbox row has no event id
	ConsumerGroup string // inbox only
	MessageID     string // inbox only: the id deduplication keys on
	Topic         string
	PartitionKey  string // "" for an unkeyed row
	EventType     string // "" when not set
	Payload       []byte
	// Metadata is the metadata column as stored: a JSON object.
	Metadata    json.RawMessage
	Status      string // pending, completed or failed
	Attempts    int
	MaxAttempts int
	LastError   string // "" when never tried
	ScheduledAt time.Time
	LockedBy    string     // "" when not leased
	LockedUntil *time.Time // nil when not leased
	CreatedAt   time.Time
	CompletedAt *time.Time // nil unless completed
}

// Row returns the row id with every column, payload and full last error
// included (in the Admin's consumer group, when it has one). It returns an
// error wrapping ErrNotFound when there is no such row.
func (a *Admin) Row(ctx context.Context, id int64) (Row, error) {
	var r Row
	err := a.pool.QueryRow(ctx, a.aq.row, a.args(pgx.NamedArgs{"id": id})).Scan(
		&r.ID, &r.EventID, &r.ConsumerGroup, &r.MessageID, &r.Topic, &r.PartitionKey, &r.EventType, &r.Payload,
		&r.Metadata, &r.Status, &r.Attempts, &r.MaxAttempts, &r.LastError, &r.ScheduledAt, &r.LockedBy,
		&r.LockedUntil, &r.CreatedAt, &r.CompletedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return Row{}, fmt.Errorf("row %d of %q: %w", id, a.tn, ErrNotFound)
	}
	if err != nil {
		return Row{}, fmt.Errorf("row %d of %q: %w", id, a.tn, err)
	}
	return r, nil
}

// Admin console reads and actions. They are built to stay fast on a table
// holding millions of completed rows: they read pending rows through the
// partial per-key index, failed rows through the partial failed index and
// completed rows through the partial index on completed_at, and never count
// every completed row.

// DefaultCompletedCountCap is how many completed rows Overview counts
// exactly; past it, it reports the planner's estimate.
const DefaultCompletedCountCap = 10000

// Overview is Stats without a scan of the completed rows: a snapshot of the
// pending and failed rows and of the keys, taken in one statement.
type Overview struct {
	// Pending, Due, Leased, ExpiredLeases, Failed, Lanes, HeldKeys and
	// BlockedKeys mean what they mean in Stats.
	Pending, Due, Leased, ExpiredLeases, Failed int64
	// Delayed rows are pending, never tried and scheduled in the future.
	Delayed int64
	// Retrying rows are pending, tried at least once and waiting for their
	// retry time.
	Retrying int64
	// Completed is the number of completed rows when CompletedExact; else
	// an estimate from the table's statistics (pg_class.reltuples of the
	// table, or of its partitions, minus the pending and failed rows), or
	// -1 when unknown (an Admin restricted to a consumer group does not
	// count completed rows).
	Completed      int64
	CompletedExact bool
	// OldestPendingAge is how long ago the oldest pending row was created.
	OldestPendingAge             time.Duration
	Lanes, HeldKeys, BlockedKeys int64
}

// Overview counts pending and failed rows exactly, completed rows up to
// DefaultCompletedCountCap (and estimates beyond), and the keys.
func (a *Admin) Overview(ctx context.Context) (Overview, error) {
	var (
		o              Overview
		oldest         *time.Time
		now            time.Time
		counted, tuple int64
	)
	err := a.pool.QueryRow(ctx, a.aq.overview,
		a.args(pgx.NamedArgs{"cap": DefaultCompletedCountCap + 1, "table": a.tn.quoted()})).Scan(
		&o.Pending, &o.Due, &o.Leased, &o.ExpiredLeases, &o.Delayed, &o.Retrying, &oldest, &now, &o.Failed,
		&counted, &tuple, &o.Lanes, &o.BlockedKeys, &o.HeldKeys)
	if err != nil {
		return Overview{}, fmt.Errorf("overview of %q: %w", a.tn, err)
	}
	if oldest != nil && now.After(*oldest) {
		o.OldestPendingAge = now.Sub(*oldest)
	}
	switch {
	case counted < 0:
		o.Completed = -1
	case counted <= DefaultCompletedCountCap:
		o.Completed, o.CompletedExact = counted, true
	default:
		o.Completed = max(tuple-o.Pending-o.Failed, DefaultCompletedCountCap)
	}
	return o, nil
}

// HeldKey is a key whose deliveries are held back by its head row.
type HeldKey struct {
	ConsumerGroup string // inbox only
	Topic         string
	PartitionKey  string
	// Blocked reports a lane frozen behind a failed row by the Block policy.
	Blocked bool
	// Head is the row holding the key: a pending row waiting for its retry,
	// or, when Blocked, the failed row.
	HeadID      int64
	HeadStatus  string
	Attempts    int
	MaxAttempts int
	// NextRetry is the head's scheduled time (meaningful when pending).
	NextRetry time.Time
	LastError string
	// HeadCreatedAt is when the head row was written: keys are listed by it,
	// oldest first, as the ones held the longest.
	HeadCreatedAt time.Time
}

// HeldKeys lists up to limit keys (0: DefaultListLimit) held by a tried head
// waiting for its retry or blocked behind a failed row, those whose head is
// oldest first; topic, when not empty, keeps only that topic's keys. It
// visits the head of every lane, so its cost grows with the keys that have
// pending rows, not with the rows.
func (a *Admin) HeldKeys(ctx context.Context, topic string, limit int) ([]HeldKey, error) {
	if limit < 0 {
		return nil, fmt.Errorf("held keys of %q: limit: must not be negative, got %d", a.tn, limit)
	}
	if limit == 0 {
		limit = DefaultListLimit
	}
	rows, err := a.pool.Query(ctx, a.aq.heldKeys, a.args(pgx.NamedArgs{"topic": topic, "limit": limit}))
	if err != nil {
		return nil, fmt.Errorf("held keys of %q: %w", a.tn, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (HeldKey, error) {
		var k HeldKey
		err := r.Scan(&k.ConsumerGroup, &k.Topic, &k.PartitionKey, &k.Blocked, &k.HeadID, &k.HeadStatus,
			&k.Attempts, &k.MaxAttempts, &k.NextRetry, &k.LastError, &k.HeadCreatedAt)
		return k, err
	})
	if err != nil {
		return nil, fmt.Errorf("held keys of %q: %w", a.tn, err)
	}
	return out, nil
}

// LeaseHolder is a relay or worker instance holding leases on the table.
type LeaseHolder struct {
	// Instance is the worker id written in locked_by.
	Instance string
	// Rows and Lanes are how many pending rows and lanes it holds.
	Rows, Lanes int64
	// FirstExpiry and LastExpiry bound its leases' expiry times.
	FirstExpiry, LastExpiry time.Time
	// Expired reports that every lease of the instance has expired: it
	// stopped without settling (ReleaseExpiredLeases clears them).
	Expired bool
}

// Leases lists the instances that hold leases on pending rows or lanes,
// expired ones included, by instance id.
func (a *Admin) Leases(ctx context.Context) ([]LeaseHolder, error) {
	rows, err := a.pool.Query(ctx, a.aq.leases, a.args(nil))
	if err != nil {
		return nil, fmt.Errorf("leases of %q: %w", a.tn, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (LeaseHolder, error) {
		var (
			h     LeaseHolder
			first *time.Time
			last  *time.Time
			now   time.Time
		)
		if err := r.Scan(&h.Instance, &h.Rows, &h.Lanes, &first, &last, &now); err != nil {
			return h, err
		}
		if first != nil {
			h.FirstExpiry = *first
		}
		if last != nil {
			h.LastExpiry = *last
			h.Expired = last.Before(now)
		}
		return h, nil
	})
	if err != nil {
		return nil, fmt.Errorf("leases of %q: %w", a.tn, err)
	}
	return out, nil
}

// Throughput counts the rows completed in the last window, in buckets of
// bucket, oldest first: the last element is the latest bucket. It reads the
// completed rows of the window only (index on completed_at).
func (a *Admin) Throughput(ctx context.Context, window, bucket time.Duration) ([]int64, error) {
	if bucket <= 0 || window < bucket {
		return nil, fmt.Errorf("throughput of %q: window %s and bucket %s: need 0 < bucket <= window", a.tn, window, bucket)
	}
	n := int(window / bucket)
	rows, err := a.pool.Query(ctx, a.aq.throughput,
		a.args(pgx.NamedArgs{"bucket": bucket.Seconds(), "window": window.Seconds()}))
	if err != nil {
		return nil, fmt.Errorf("throughput of %q: %w", a.tn, err)
	}
	defer rows.Close()
	out := make([]int64, n)
	for rows.Next() {
		var (
			ago   int
			count int64
		)
		if err := rows.Scan(&ago, &count); err != nil {
			return nil, fmt.Errorf("throughput of %q: scan: %w", a.tn, err)
		}
		if ago >= 0 && ago < n {
			out[n-1-ago] += count
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("throughput of %q: %w", a.tn, err)
	}
	return out, nil
}

// FailedFilter selects failed rows; zero fields select everything.
type FailedFilter struct {
	Topic        string
	PartitionKey string
	// ErrorContains keeps rows whose last error contains it, ignoring case.
	ErrorContains string
	// CreatedFrom and CreatedBefore bound the rows' creation time
	// (inclusive, exclusive); zero means unbounded.
	CreatedFrom, CreatedBefore time.Time
}

// IsZero reports a filter that selects every failed row.
func (f FailedFilter) IsZero() bool { return f == FailedFilter{} }

// args sets the named arguments of the conditions that conditions adds.
func (f FailedFilter) args(na pgx.NamedArgs) pgx.NamedArgs {
	for name, v := range map[string]any{"topic": f.Topic, "key": f.PartitionKey, "err": f.ErrorContains} {
		if v != "" {
			na[name] = v
		}
	}
	if !f.CreatedFrom.IsZero() {
		na["from"] = f.CreatedFrom
	}
	if !f.CreatedBefore.IsZero() {
		na["to"] = f.CreatedBefore
	}
	return na
}

// ListFailedMatching is ListFailed restricted to the rows f selects.
func (a *Admin) ListFailedMatching(ctx context.Context, f FailedFilter, limit int, afterID int64) ([]FailedRow, error) {
	switch {
	case limit < 0:
		return nil, fmt.Errorf("list failed rows of %q: limit: must not be negative, got %d", a.tn, limit)
	case afterID < 0:
		return nil, fmt.Errorf("list failed rows of %q: afterID: must not be negative, got %d", a.tn, afterID)
	case limit == 0:
		limit = DefaultListLimit
	}
	rows, err := a.pool.Query(ctx, a.aq.failedMatching(f),
		a.args(f.args(pgx.NamedArgs{"after": afterID, "limit": limit})))
	if err != nil {
		return nil, fmt.Errorf("list failed rows of %q: %w", a.tn, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (FailedRow, error) {
		var x FailedRow
		err := r.Scan(&x.ID, &x.EventID, &x.ConsumerGroup, &x.Topic, &x.PartitionKey, &x.EventType,
			&x.Attempts, &x.MaxAttempts, &x.LastError, &x.CreatedAt)
		return x, err
	})
	if err != nil {
		return nil, fmt.Errorf("list failed rows of %q: %w", a.tn, err)
	}
	return out, nil
}

// CountFailedMatching counts the failed rows f selects (through the partial
// failed index: its cost grows with the failed rows only).
func (a *Admin) CountFailedMatching(ctx context.Context, f FailedFilter) (int64, error) {
	var n int64
	if err := a.pool.QueryRow(ctx, a.aq.countMatching(f), a.args(f.args(pgx.NamedArgs{}))).Scan(&n); err != nil {
		return 0, fmt.Errorf("count failed rows of %q: %w", a.tn, err)
	}
	return n, nil
}

// RequeueMatching requeues, one Requeue at a time, the rows f selects that
// are failed when it reaches them, and returns how many it requeued. An
// empty filter is RequeueAllFailed (batched). When ctx ends it stops; rows
// already requeued stay requeued and are counted.
func (a *Admin) RequeueMatching(ctx context.Context, f FailedFilter) (int64, error) {
	if f.IsZero() {
		return a.RequeueAllFailed(ctx, 1000, nil)
	}
	var (
		done  int64
		after int64
	)
	for {
		page, err := a.ListFailedMatching(ctx, f, 500, after)
		if err != nil {
			return done, err
		}
		if len(page) == 0 {
			return done, nil
		}
		for _, r := range page {
			err := a.Requeue(ctx, r.ID)
			switch {
			case errors.Is(err, ErrNotFound): // requeued or deleted meanwhile
			case err != nil:
				return done, err
			default:
				done++
			}
		}
		after = page[len(page)-1].ID
	}
}

// ConsumerGroups lists the consumer groups of an inbox table that have
// pending or failed rows (a group with only completed rows is not listed).
// It probes the indexes once per group. An outbox has none.
func (a *Admin) ConsumerGroups(ctx context.Context) ([]string, error) {
	if !a.inbox {
		return nil, nil
	}
	rows, err := a.pool.Query(ctx, a.aq.groups)
	if err != nil {
		return nil, fmt.Errorf("consumer groups of %q: %w", a.tn, err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("consumer groups of %q: %w", a.tn, err)
	}
	return out, nil
}

// LaneState is the lane of one key.
type LaneState struct {
	// Blocked reports a key frozen behind a failed row by the Block policy.
	Blocked bool
	// ReadyAt is when relays may take the key next; nil while blocked.
	ReadyAt     *time.Time
	LockedBy    string     // "" when not leased
	LockedUntil *time.Time // nil when not leased
}

// Lane returns the lane of the key (group is "" for an outbox); ok is false
// when the key has no lane (no pending rows).
func (a *Admin) Lane(ctx context.Context, group, topic, key string) (ls LaneState, ok bool, err error) {
	err = a.pool.QueryRow(ctx, a.aq.lane, pgx.NamedArgs{"lgroup": group, "topic": topic, "key": key}).Scan(
		&ls.Blocked, &ls.ReadyAt, &ls.LockedBy, &ls.LockedUntil)
	if errors.Is(err, pgx.ErrNoRows) {
		return LaneState{}, false, nil
	}
	if err != nil {
		return LaneState{}, false, fmt.Errorf("lane of key %q of topic %q in %q: %w", key, topic, a.tn, err)
	}
	return ls, true, nil
}

// Discard deletes the failed row id for good and returns its event id. A
// key frozen behind it by the Block policy is woken (if another failed row
// of the key comes first, a relay freezes it again). It returns an error
// wrapping ErrNotFound when there is no failed row with that id (in the
// Admin's consumer group). Pending and completed rows are never deleted.
func (a *Admin) Discard(ctx context.Context, id int64) (eventID string, err error) {
	if id < 1 {
		return "", fmt.Errorf("discard %d in %q: id: must be positive", id, a.tn)
	}
	var n int64
	err = a.requeueTx(ctx, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, a.aq.discard, a.args(pgx.NamedArgs{"id": id})).Scan(&n, &eventID)
	})
	if err != nil {
		return "", fmt.Errorf("discard %d in %q: %w", id, a.tn, err)
	}
	if n == 0 {
		return "", fmt.Errorf("discard %d in %q: no failed row has this id: %w", id, a.tn, ErrNotFound)
	}
	a.notify(ctx)
	return eventID, nil
}

// conditions are the conditions of f (the Filter* fragments of console.sql),
// on the row alias t, with the named arguments FailedFilter.args sets.
func (q *adminQueries) conditions(f FailedFilter) string {
	var b strings.Builder
	if f.Topic != "" {
		b.WriteString(q.filterTopic)
	}
	if f.PartitionKey != "" {
		b.WriteString(q.filterKey)
	}
	if f.ErrorContains != "" {
		b.WriteString(q.filterErr)
	}
	if !f.CreatedFrom.IsZero() {
		b.WriteString(q.filterFrom)
	}
	if !f.CreatedBefore.IsZero() {
		b.WriteString(q.filterTo)
	}
	return b.String()
}

// failedMatching lists the failed rows f selects after @after, @limit at most.
func (q *adminQueries) failedMatching(f FailedFilter) string {
	return strings.Replace(q.listFailed, filterMark, q.conditions(f), 1)
}

// countMatching counts the failed rows f selects.
func (q *adminQueries) countMatching(f FailedFilter) string {
	return strings.Replace(q.countFailed, filterMark, q.conditions(f), 1)
}
