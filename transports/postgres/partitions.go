package postgres

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/omnibus-go/omnibus/bus"
)

// The partitioned layout (Table.PartitionInterval; docs/operations.md,
// "Partitions"): the table is range-partitioned on created_at, one partition
// per interval, aligned to multiples of the interval since the Unix epoch
// (UTC), named <table>_p<start as 20060102t1504>. A default partition takes
// rows whose time has no partition. Relays and dispatchers keep partitions
// created PartitionsAhead intervals ahead and drop those that ended more
// than the retention ago and hold no pending and no failed row.
const (
	// MinPartitionInterval and MaxPartitionInterval bound Table.PartitionInterval.
	MinPartitionInterval = bus.MinPartitionInterval
	MaxPartitionInterval = bus.MaxPartitionInterval
	// PartitionsAhead is how many partitions after the current one are kept
	// created.
	PartitionsAhead = 3
	// partitionTimeFormat names a partition by its start (UTC).
	partitionTimeFormat = "20060102t1504"
	// partitionDDLTimeout bounds how long attaching or detaching a partition
	// waits for the table's lock (and holds writers queued behind it).
	partitionDDLTimeout = "500ms"
	// dedupForgetBatch is how many dedup entries one statement deletes.
	dedupForgetBatch = 10_000
)

// partitionStorage is the storage settings of every partition: the single
// table's (fillfactor for HOT leases, autovacuum at 5 % dead; migrations
// 0001 and 0006).
const partitionStorage = "fillfactor = 70, autovacuum_vacuum_scale_factor = 0.05, autovacuum_vacuum_threshold = 10000"

// checkPartitionInterval says what is wrong with d as a partition interval
// (0 is the single table), in the config's words.
func checkPartitionInterval(d time.Duration) error {
	var ck bus.Check
	ck.PartitionInterval("interval", d)
	var ce *bus.ConfigError
	if err := ck.Err(); errors.As(err, &ce) {
		return errors.New(ce.Reason)
	}
	return nil
}

// PartitionReport is what one round of partition maintenance did.
type PartitionReport struct {
	// Skipped: another process held the table's maintenance lock, so this
	// round did nothing.
	Skipped bool
	// Created and Dropped name the partitions this round created and dropped.
	Created, Dropped []string
	// Kept names partitions past the retention that still hold a pending or
	// failed row: they stay until their rows are delivered, requeued or
	// deleted.
	Kept []string
	// Deferred names partitions whose attach or detach waited longer than
	// its lock timeout (a long transaction holds the table), or whose range
	// rows in the default partition already cover: the next round tries
	// again.
	Deferred []string
	// DedupForgotten is how many dedup entries older than the retention
	// were deleted.
	DedupForgotten int64
	// Partitions is how many partitions (the default one aside) the table
	// has after the round, and CoveredUntil the end of the last one.
	Partitions   int
	CoveredUntil time.Time
}

// partitioner maintains the partitions of one table.
type partitioner struct {
	pool *pgxpool.Pool
	tn   tableName
	kv   []string // the table's placeholders (vocab.pairs)
}

func newPartitioner(pool *pgxpool.Pool, tn tableName, inbox bool) *partitioner {
	return &partitioner{pool: pool, tn: tn, kv: vocab{t: tn, inbox: inbox}.pairs()}
}

// interval is the table's partition interval, 0 for the single table.
func (p *partitioner) interval(ctx context.Context, db DB) (time.Duration, error) {
	var partitioned *bool
	err := db.QueryRow(ctx, fixedSQL("Layout"), p.tn.qualifiedIdent("_interval_fn"), p.tn.quoted()).Scan(&partitioned)
	if err != nil {
		return 0, fmt.Errorf("layout of %q: %w", p.tn, err)
	}
	if partitioned == nil || !*partitioned {
		return 0, nil
	}
	var secs int64
	if err := db.QueryRow(ctx, p.sql("PartitionInterval")).Scan(&secs); err != nil {
		return 0, fmt.Errorf("partition interval of %q: %w", p.tn, err)
	}
	return time.Duration(secs) * time.Second, nil
}

// partitionStart is the start of the partition that holds t.
func partitionStart(t time.Time, interval time.Duration) time.Time {
	return t.UTC().Truncate(interval)
}

func (p *partitioner) partitionName(start time.Time) tableName {
	return p.tn.derived("_p" + start.UTC().Format(partitionTimeFormat))
}

// partitionTime reads the start of a partition from its name; false for a
// name that is not one of ours.
func (p *partitioner) partitionTime(name string) (time.Time, bool) {
	rest, ok := strings.CutPrefix(name, p.tn.name+"_p")
	if !ok {
		return time.Time{}, false
	}
	t, err := time.ParseInLocation(partitionTimeFormat, rest, time.UTC)
	return t, err == nil
}

// lockKey is the session advisory lock one maintainer of the table holds.
func (p *partitioner) lockKey() int64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte("omnibus partitions " + p.tn.String()))
	return int64(h.Sum64())
}

// sql renders a statement with the values of the per-call placeholders
// ({P}, {FROM}, …) in kv.
func (p *partitioner) sql(name string, kv ...string) string {
	return statements.Render(name, strings.NewReplacer(append(kv, p.kv...)...))
}

// partSQL renders a statement for the partition part.
func (p *partitioner) partSQL(name string, part tableName, kv ...string) string {
	return p.sql(name, append([]string{"{P}", part.quoted()}, kv...)...)
}

// createAhead creates the partitions from the one holding now to
// PartitionsAhead after it that do not exist yet, each in a transaction of
// its own, in db (a pool, or Migrate's transaction).
func (p *partitioner) createAhead(ctx context.Context, db Beginner, interval time.Duration, now time.Time, have map[string]bool, rep *PartitionReport) error {
	timeout := true
	if _, ok := db.(pgx.Tx); ok {
		timeout = false // Migrate's transaction: the table is its own
	}
	first := partitionStart(now, interval)
	for i := 0; i <= PartitionsAhead; i++ {
		from := first.Add(time.Duration(i) * interval)
		part := p.partitionName(from)
		if have[part.name] {
			continue
		}
		err := p.inTx(ctx, db, timeout, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, p.partSQL("CreatePartition", part, "{STORAGE}", partitionStorage)); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, p.partSQL("AttachPartition", part,
				"{FROM}", from.Format(time.RFC3339), "{TO}", from.Add(interval).Format(time.RFC3339)))
			return err
		})
		switch {
		case isDeferrable(err):
			rep.Deferred = append(rep.Deferred, part.name)
		case err != nil:
			return fmt.Errorf("create partition %s of %q: %w", part.name, p.tn, err)
		default:
			have[part.name] = true
			rep.Created = append(rep.Created, part.name)
		}
	}
	return nil
}

// isDeferrable tells the DDL errors that only mean "not now": a lock
// timeout, or rows in the default partition that belong to the new range
// (they stay there and are delivered from there).
func isDeferrable(err error) bool {
	var pgErr *pgconn.PgError
	return isLockTimeout(err) || errors.As(err, &pgErr) && pgErr.Code == "23514" // check_violation
}

// inTx runs fn in a transaction, with the DDL lock timeout if timeout.
func (p *partitioner) inTx(ctx context.Context, db Beginner, timeout bool, fn func(pgx.Tx) error) error {
	tx, err := db.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if timeout {
		if _, err := tx.Exec(ctx, fixedSQL("DDLTimeout"), partitionDDLTimeout); err != nil {
			return err
		}
	}
	if err := fn(tx); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// errKept rolls back the detach of a partition that still holds rows.
var errKept = errors.New("partition holds pending or failed rows")

// maintain runs one round: partitions created ahead, partitions past the
// retention dropped (retention 0: none), dedup entries past it forgotten.
// One process at a time does it for a table; another returns Skipped. Every
// step is a transaction of its own, so a crash in the middle leaves a
// working table, and the next round carries on.
func (p *partitioner) maintain(ctx context.Context, retention time.Duration) (PartitionReport, error) {
	var rep PartitionReport
	conn, err := p.pool.Acquire(ctx)
	if err != nil {
		return rep, fmt.Errorf("partitions of %q: %w", p.tn, err)
	}
	defer conn.Release()
	var got bool
	if err := conn.QueryRow(ctx, fixedSQL("MaintenanceLock"), p.lockKey()).Scan(&got); err != nil {
		return rep, fmt.Errorf("partitions of %q: lock: %w", p.tn, err)
	}
	if !got {
		rep.Skipped = true
		return rep, nil
	}
	defer func() {
		// A connection whose unlock failed must not go back to the pool
		// holding the lock.
		if _, err := conn.Exec(context.WithoutCancel(ctx), fixedSQL("MaintenanceUnlock"), p.lockKey()); err != nil {
			_ = conn.Conn().Close(context.WithoutCancel(ctx))
		}
	}()
	interval, err := p.interval(ctx, conn)
	if err != nil {
		return rep, err
	}
	if interval == 0 {
		return rep, fmt.Errorf("partitions of %q: the table is not partitioned", p.tn)
	}
	names, err := p.partitions(ctx, conn)
	if err != nil {
		return rep, err
	}
	var now time.Time
	if err := conn.QueryRow(ctx, "SELECT now()").Scan(&now); err != nil {
		return rep, fmt.Errorf("partitions of %q: %w", p.tn, err)
	}
	have := map[string]bool{}
	for _, n := range names {
		have[n] = true
	}
	if err := p.createAhead(ctx, conn, interval, now, have, &rep); err != nil {
		return rep, err
	}
	if retention > 0 {
		if err := p.dropOld(ctx, conn, interval, now.Add(-retention), names, have, &rep); err != nil {
			return rep, err
		}
		if err := p.forgetDedup(ctx, conn, now.Add(-retention), have, &rep); err != nil {
			return rep, err
		}
	}
	names = names[:0]
	for n := range have {
		names = append(names, n)
	}
	rep.Partitions, rep.CoveredUntil = p.coverage(names, interval)
	return rep, nil
}

// coverage counts the partitions among names and says when the last ends.
func (p *partitioner) coverage(names []string, interval time.Duration) (n int, until time.Time) {
	for _, name := range names {
		if from, ok := p.partitionTime(name); ok {
			n++
			if end := from.Add(interval); end.After(until) {
				until = end
			}
		}
	}
	return n, until
}

func (p *partitioner) partitions(ctx context.Context, db DB) ([]string, error) {
	rows, err := db.Query(ctx, fixedSQL("Partitions"), p.tn.quoted())
	if err != nil {
		return nil, fmt.Errorf("partitions of %q: %w", p.tn, err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("partitions of %q: %w", p.tn, err)
	}
	return names, nil
}

// dropOld drops, oldest first, the partitions that ended before cutoff and
// hold no pending or failed row. The check is made twice: once without a
// lock (most old partitions that are kept are kept for days), and again
// after the detach, which locks out every writer and relay, so no row can
// arrive between the check and the drop.
func (p *partitioner) dropOld(ctx context.Context, conn *pgxpool.Conn, interval time.Duration, cutoff time.Time, names []string, have map[string]bool, rep *PartitionReport) error {
	for _, n := range names {
		from, ok := p.partitionTime(n)
		if !ok || from.Add(interval).After(cutoff) {
			continue
		}
		part := p.tn.derived(strings.TrimPrefix(n, p.tn.name))
		var busy bool
		if err := conn.QueryRow(ctx, p.partSQL("PartitionBusy", part)).Scan(&busy); err != nil {
			return fmt.Errorf("drop partition %s of %q: %w", n, p.tn, err)
		}
		if busy {
			rep.Kept = append(rep.Kept, n)
			continue
		}
		err := p.inTx(ctx, conn, true, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, p.partSQL("DetachPartition", part)); err != nil {
				return err
			}
			if err := tx.QueryRow(ctx, p.partSQL("PartitionBusy", part)).Scan(&busy); err != nil {
				return err
			}
			if busy {
				return errKept
			}
			_, err := tx.Exec(ctx, p.partSQL("DropPartition", part))
			return err
		})
		switch {
		case errors.Is(err, errKept):
			rep.Kept = append(rep.Kept, n)
		case isLockTimeout(err):
			rep.Deferred = append(rep.Deferred, n)
		case err != nil:
			return fmt.Errorf("drop partition %s of %q: %w", n, p.tn, err)
		default:
			delete(have, n)
			rep.Dropped = append(rep.Dropped, n)
		}
	}
	return nil
}

// forgetDedup deletes the dedup entries older than cutoff, and older than
// every row still stored: the oldest partition left, and the oldest row in
// the default partition, keep theirs.
func (p *partitioner) forgetDedup(ctx context.Context, conn *pgxpool.Conn, cutoff time.Time, have map[string]bool, rep *PartitionReport) error {
	for n := range have {
		if from, ok := p.partitionTime(n); ok && from.Before(cutoff) {
			cutoff = from
		}
	}
	var oldest *time.Time
	if err := conn.QueryRow(ctx, p.sql("DefaultOldest", "{DEFAULT}", p.tn.qualifiedIdent("_default"))).Scan(&oldest); err != nil {
		return fmt.Errorf("dedup entries of %q: %w", p.tn, err)
	}
	if oldest != nil && oldest.Before(cutoff) {
		cutoff = *oldest
	}
	for {
		tag, err := conn.Exec(ctx, p.sql("ForgetDedup"), cutoff, dedupForgetBatch)
		if err != nil {
			return fmt.Errorf("dedup entries of %q: %w", p.tn, err)
		}
		rep.DedupForgotten += tag.RowsAffected()
		if tag.RowsAffected() < dedupForgetBatch {
			return nil
		}
	}
}
