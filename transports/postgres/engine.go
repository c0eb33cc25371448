package postgres

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
)

// DB is what the writers need: a pgx.Tx, a *pgxpool.Pool or a *pgx.Conn.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// laneKey identifies a lane: one (consumer group, topic, partition key).
// Outbox lanes have the group "".
type laneKey struct {
	group, topic, key string
}

// row is one fetched outbox or inbox row.
type row struct {
	id           int64
	eventID      string
	topic        string
	partitionKey *string
	eventType    *string
	payload      []byte
	metadata     map[string]string
	attempts     int
	maxAttempts  int
	createdAt    time.Time
	// own: the row carries a lease of its own (an unkeyed row, or a row left
	// over from a lost lease), which renewal extends. A keyed row is
	// otherwise covered by its lane's lease and was not written to when it
	// was handed out (migration 0010).
	own bool
}

// unit is what one fetch hands out for one key: the run of a lane, or a
// single unkeyed row (lane nil).
type unit struct {
	lane  *laneKey
	rows  []row
	lease *unitLease // keyed units only
}

// unitLease is what this worker knows of the lease of a unit's lane: until
// when it is surely held (measured from before the statement that set it,
// so never later than the database's locked_until), and whether it is lost:
// renewal found the lane held by another worker, or this worker leased the
// lane anew (superseded), which it can only once the lease had run out.
type unitLease struct {
	deadline   atomic.Int64 // UnixNano
	lost       atomic.Bool
	superseded atomic.Bool
	gone       chan struct{} // closed when lost
}

func newUnitLease(from time.Time, d time.Duration) *unitLease {
	l := &unitLease{gone: make(chan struct{})}
	l.renewed(from, d)
	return l
}

func (l *unitLease) renewed(from time.Time, d time.Duration) {
	l.deadline.Store(from.Add(d).UnixNano())
}

// lose records that the lease is lost.
func (l *unitLease) lose() {
	if l.lost.CompareAndSwap(false, true) {
		close(l.gone)
	}
}

// supersede records that this worker leased the lane anew: the lease is
// lost, and the lane in the database is the new lease's, which the unit of
// the old one must neither give back nor continue (the lanes table tells
// the two leases apart only by worker).
func (l *unitLease) supersede() {
	l.superseded.Store(true)
	l.lose()
}

// held reports whether the lease is still surely this worker's at now.
func (l *unitLease) held(now time.Time) bool { return l.until(now) > 0 }

// until is how long the lease is surely held from now, as far as this
// worker knows now: renewal may extend it.
func (l *unitLease) until(now time.Time) time.Duration {
	if l.lost.Load() {
		return 0
	}
	return time.Duration(l.deadline.Load() - now.UnixNano())
}

// fetchResult is the outcome of one fetch: the units to deliver, and the
// lanes that were leased but yielded nothing (their head is not deliverable,
// or they have no rows left); those must be reconciled.
type fetchResult struct {
	units []unit
	idle  []laneKey
	lanes int // lanes leased in all
	// cut are rows leased by the fetch but not handed out: a row before
	// them in their run failed the lock-time re-check. Release them.
	cut []row
}

// settleOp is the settlement of one row.
type settleOp struct {
	id      int64
	op      byte // 'a' ack, 'n' nack, 'p' plain nack, 'r' release
	lease   int  // the row's attempts as its lease set them (a settlement of another lease changes nothing)
	inc     int  // 1: the failure is counted; 0: it is not (transient)
	giveUp  bool
	retryAt *time.Time
	err     string
	// topic and run are the lane whose run covers the row (migration 0010;
	// run is its partition key), run nil for a row with a lease of its own:
	// the Settle statement guards an ack of a covered row by its lane's run.
	topic string
	run   *string
}

// settle returns the settlement op for r with its lease; the caller fills in
// the failure's details.
func (r row) settle(op byte) settleOp {
	o := settleOp{id: r.id, op: op, lease: r.attempts + 1}
	if !r.own {
		o.topic, o.run = r.topic, r.partitionKey
	}
	return o
}

// engine runs the statements of one table for one worker. It holds no
// goroutines; the Subscriber drives it, and tests drive it cycle by cycle.
type engine struct {
	pool   *pgxpool.Pool
	q      *queries
	worker string
	group  string // inbox consumer group; "" for the outbox
	lease  time.Duration
	run    int                 // RunLength
	block  bool                // FailedBlock policy
	files  map[string]fileMark // engine.compact's looks
}

// fetch turns writers' notes into lanes, then leases up to lanes ready keys
// and loose unkeyed rows and hands out their runs. See queries.leaseLanes and
// queries.pick for the rules; the statements run in one transaction so that
// the lanes' locks are held when pick takes its snapshot.
func (e *engine) fetch(ctx context.Context, topic string, lanes, loose int) (fetchResult, error) {
	topicArg := topicParam(topic)
	return e.inTx(ctx, func(b *pgx.Batch) {
		if lanes > 0 {
			b.Queue(e.q.takeNotes)
			b.Queue(e.q.leaseLanes, lanes, topicArg, e.group)
		}
	}, topicArg, loose)
}

// turn waits, at most wait, for a turn on a lane that writers keep locked:
// it waits for the lane's advisory lock (writers arriving meanwhile queue
// behind it) and then for its row, and leases it. A lane that is still held
// when wait runs out yields nothing (ok false); a lane that another relay
// leased meanwhile yields nothing either.
func (e *engine) turn(ctx context.Context, k laneKey, wait time.Duration) (res fetchResult, ok bool, err error) {
	timeout := fmt.Sprintf("%dms", max(wait.Milliseconds(), 1))
	res, err = e.inTx(ctx, func(b *pgx.Batch) {
		b.Queue(e.q.lockTimeout, timeout)
		b.Queue(e.q.laneLock, k.group, k.topic, k.key)
		b.Queue(e.q.leaseLane, k.group, k.topic, k.key)
	}, nil, 0)
	if err != nil {
		if isLockTimeout(err) {
			return fetchResult{}, false, nil
		}
		return fetchResult{}, false, err
	}
	return res, true, nil
}

// next takes the next run of a lane this worker holds, whose run ended with
// every row acked and after as its last id, without giving the lane back:
// one short transaction renews the lane's lease, locks the lane (failing
// with lock_not_available while a writer of the key is in flight) and picks
// the rows after after. A run of one key therefore costs one transaction
// instead of a give-back, a reconciliation and a new fetch (docs/ordering.md,
// "Runs of one key").
//
// Rows at or below after are not looked at: the run's own rows (acked, their
// settlements perhaps not written yet) and rows that were not in line when
// the run was picked (delayed rows never tried, or a requeued row). Those
// are seen again when the lane is given back, which is why a Subscriber
// continues a lane for at most chainFor.
//
// acks, the acks of the key's run before (already emitted and acked), are
// written in the same transaction, first; when next fails they are not.
//
// The result has no units when the lane has nothing deliverable now or is
// no longer this worker's; the caller then gives the lane back.
func (e *engine) next(ctx context.Context, k laneKey, after int64, acks []settleOp) (fetchResult, error) {
	// One round trip: the batch's statements run in one implicit
	// transaction, each with its own snapshot, so pick sees what keepLane's
	// lock guarantees. pick takes rows only from lanes this worker holds, so
	// it hands out nothing when keepLane found the lane taken over.
	g, t, kk := laneArrays([]laneKey{k})
	b := &pgx.Batch{}
	b.Queue(e.q.bookkeeping)
	b.Queue(e.q.generic)
	if len(acks) > 0 {
		b.Queue(e.q.settlePlans)
		b.Queue(e.q.settle, e.settleArgs(acks)...)
		b.Queue(e.q.planJoins)
	}
	b.Queue(e.q.keepLane, e.worker, k.group, k.topic, k.key)
	b.Queue(e.q.pick, e.worker, e.lease, g, t, kk, e.run, 0, nil, e.group, e.block, []int64{after + 1}, true)
	start := time.Now()
	br := e.pool.SendBatch(ctx, b)
	res, err := e.scanNext(br, start, len(acks) > 0)
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fetchResult{}, fmt.Errorf("take the next run of a key of %q: %w", e.q.table, err)
	}
	return res, nil
}

func (e *engine) scanNext(br pgx.BatchResults, start time.Time, settled bool) (fetchResult, error) {
	skip := 2 // Bookkeeping, GenericPlans
	if settled {
		skip += 3 // SettlePlans, Settle, PlanJoins
	}
	for range skip {
		if _, err := br.Exec(); err != nil {
			return fetchResult{}, err
		}
	}
	tag, err := br.Exec()
	if err != nil {
		return fetchResult{}, err
	}
	res := fetchResult{lanes: int(tag.RowsAffected())}
	rows, err := br.Query()
	if err != nil {
		return fetchResult{}, err
	}
	return res, e.scanPicked(rows, start, &res)
}

// starved lists up to n lanes that have been ready and free for at least
// age without being leased: writers are keeping them locked.
func (e *engine) starved(ctx context.Context, topic string, age time.Duration, n int) ([]laneKey, error) {
	lanes, err := e.lanesByIndex(ctx, e.q.starved, age, topicParam(topic), e.group, n)
	if err != nil {
		return nil, fmt.Errorf("look for starved lanes of %q: %w", e.q.table, err)
	}
	return lanes, nil
}

func isLockTimeout(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "55P03" // lock_not_available
}

func topicParam(topic string) *string {
	if topic == AllTopics {
		return nil
	}
	return &topic
}

// The engine's transactions start with the Bookkeeping statement (engine.sql):
// they change only the engine's own state (leases, attempts, settlements,
// lanes), never a user's data, and commit with synchronous_commit off, so
// their commits do not wait for the WAL flush. A PostgreSQL crash may roll
// back the last such commits (at most about three wal_writer_delay, 600 ms
// by default), never a later synchronous commit's (WAL is flushed in order)
// and never part of one. What it loses is bookkeeping: rows acked in that
// window are delivered again (at least once; the inbox deduplicates) and
// leases taken in it are not counted as attempts. No row is lost and first
// deliveries keep their order: the rolled-back state is an earlier
// consistent one.

// inTx runs the statements lease queues (the last of which returns the
// lanes it leased; none for no lanes), in one round trip after Bookkeeping,
// and then the pick statement over the lanes leased and up to loose unkeyed
// rows, in one transaction.
func (e *engine) inTx(ctx context.Context, lease func(*pgx.Batch), topicArg *string, loose int) (fetchResult, error) {
	var res fetchResult
	start := time.Now()
	err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		b := &pgx.Batch{}
		b.Queue(e.q.bookkeeping)
		b.Queue(e.q.generic)
		prefix := b.Len()
		lease(b)
		ll, err := leaseBatch(ctx, tx, b, b.Len() > prefix)
		if err != nil {
			return err
		}
		res = fetchResult{lanes: len(ll)}
		if len(ll) == 0 && loose == 0 {
			return nil
		}
		leased := make([]laneKey, len(ll))
		floors := make([]int64, len(ll))
		for i, l := range ll {
			leased[i], floors[i] = l.key, l.floor
		}
		g, t, k := laneArrays(leased)
		rows, err := tx.Query(ctx, e.q.pick, e.worker, e.lease, g, t, k, e.run, loose, topicArg, e.group, e.block, floors, false)
		if err != nil {
			return err
		}
		if err := e.scanPicked(rows, start, &res); err != nil {
			return err
		}
		withRows := make([]laneKey, 0, len(res.units))
		for _, u := range res.units {
			if u.lane != nil {
				withRows = append(withRows, *u.lane)
			}
		}
		res.idle = minus(leased, withRows)
		return nil
	})
	if err != nil {
		return fetchResult{}, fmt.Errorf("fetch from %q: %w", e.q.table, err)
	}
	return res, nil
}

// leaseBatch sends b and returns the lanes its last statement leased, or
// none when b holds no lease statement (leases false).
func leaseBatch(ctx context.Context, tx pgx.Tx, b *pgx.Batch, leases bool) ([]leasedLane, error) {
	if !leases {
		return nil, tx.SendBatch(ctx, b).Close()
	}
	return batchLast(ctx, tx, b, scanLeased)
}

// batchLast sends b through db (the pool, or a transaction), runs every
// statement but the last for its effect, and scans the rows of the last.
// Without a transaction the statements run in one implicit transaction.
func batchLast[T any](ctx context.Context, db interface {
	SendBatch(context.Context, *pgx.Batch) pgx.BatchResults
}, b *pgx.Batch, scan func(pgx.Rows) (T, error)) (out T, err error) {
	n := b.Len()
	br := db.SendBatch(ctx, b)
	defer func() {
		if cerr := br.Close(); err == nil {
			err = cerr
		}
	}()
	for range n - 1 {
		if _, err := br.Exec(); err != nil {
			return out, err
		}
	}
	rows, err := br.Query()
	if err != nil {
		return out, err
	}
	return scan(rows)
}

// scanPicked reads pick's rows into units; rows whose run was cut by the
// lock-time re-check go to res.cut, to be released.
func (e *engine) scanPicked(rows pgx.Rows, start time.Time, res *fetchResult) error {
	defer rows.Close()
	byLane := map[laneKey]int{} // index into res.units
	// The text columns are read from the driver's buffer: the rows of a run
	// share their topic, key and event type, so each string is made once per
	// run, not once per row, and the metadata is decoded without a copy.
	// With the destinations below made once, this took the relay from 59.6
	// to 48.9 allocations per event (BenchmarkRelayDrain).
	var topic, key, eventType internedText
	texts := textCache{} // the metadata's names and values
	first := len(res.units)
	sc := pickedScratch.Get().(*pickedRows)
	defer sc.release()
	// The scan's destinations are made once, not per row: each would
	// otherwise be a heap allocation of its own.
	var (
		ok                        bool
		r                         row
		topicB, keyB, typeB, meta pgtype.DriverBytes
		eventID                   pgtype.Text // NULL in an inbox row whose message id is not a UUID
	)
	dest := []any{&ok, &r.own, &r.id, &eventID, &topicB, &keyB, &typeB, &r.payload, &meta,
		&r.attempts, &r.maxAttempts, &r.createdAt}
	for rows.Next() {
		r = row{}
		if err := rows.Scan(dest...); err != nil {
			return fmt.Errorf("scan: %w", err)
		}
		if p := topic.of(topicB); p != nil {
			r.topic = *p
		}
		r.partitionKey, r.eventType = key.of(keyB), eventType.of(typeB)
		if !ok {
			res.cut = append(res.cut, r)
			continue
		}
		r.eventID = eventID.String
		if len(meta) > 0 {
			var err error
			if r.metadata, err = decodeMetadataWith(meta, texts); err != nil {
				// A row whose metadata is not a JSON object of strings was not
				// written by us; deliver it with what we can read.
				r.metadata = map[string]string{"omnibus_metadata_error": err.Error()}
			}
		}
		u := len(res.units) // the row's unit
		if r.partitionKey == nil {
			res.units = append(res.units, unit{})
		} else {
			k := laneKey{group: e.group, topic: r.topic, key: *r.partitionKey}
			if i, ok := byLane[k]; ok {
				u = i
			} else {
				lk := k
				byLane[k] = u
				res.units = append(res.units, unit{lane: &lk, lease: newUnitLease(start, e.lease)})
			}
		}
		sc.rows, sc.unit = append(sc.rows, r), append(sc.unit, u-first)
	}
	if err := rows.Err(); err != nil {
		return err
	}
	sc.spread(res.units[first:])
	return nil
}

// pickedRows is a fetch's scratch: the rows as they came, and the unit of
// each. Units get their rows at the end, as slices of one array, instead of
// each growing its own (a run of ten rows grew through arrays of 1, 2, 4, 8
// and 16 rows).
type pickedRows struct {
	rows  []row
	unit  []int
	start []int
}

var pickedScratch = sync.Pool{New: func() any { return new(pickedRows) }}

// spread gives each unit its rows, in id order (RETURNING gives no order; a
// run must go out in id order). A unit's rows are a slice of one array,
// capped, so appending to one never writes to another's.
func (sc *pickedRows) spread(units []unit) {
	all := make([]row, len(sc.rows))
	sc.start = append(sc.start[:0], make([]int, len(units)+1)...)
	for _, u := range sc.unit {
		sc.start[u+1]++
	}
	for i := range units {
		sc.start[i+1] += sc.start[i]
	}
	for i, r := range sc.rows {
		u := sc.unit[i]
		all[sc.start[u]] = r
		sc.start[u]++
	}
	from := 0
	for i := range units {
		to := sc.start[i]
		units[i].rows = all[from:to:to]
		sortRows(units[i].rows)
		from = to
	}
}

// release empties sc, dropping its references to the rows' payloads and
// metadata, and returns it to the pool.
func (sc *pickedRows) release() {
	clear(sc.rows)
	sc.rows, sc.unit = sc.rows[:0], sc.unit[:0]
	pickedScratch.Put(sc)
}

// internedText turns the bytes of a nullable text column into a string,
// reusing the last one while the bytes repeat it.
type internedText struct{ last *string }

// of returns nil for NULL (nil bytes), else a pointer to the text, shared
// with the previous row's while the text is the same. The string is never
// written through the pointer.
func (t *internedText) of(b []byte) *string {
	if b == nil {
		return nil
	}
	if t.last == nil || *t.last != string(b) {
		s := string(b)
		t.last = &s
	}
	return t.last
}

func sortRows(rs []row) {
	for i := 1; i < len(rs); i++ {
		for j := i; j > 0 && rs[j].id < rs[j-1].id; j-- {
			rs[j], rs[j-1] = rs[j-1], rs[j]
		}
	}
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// settle applies ops in one statement. It returns how many rows it changed;
// rows whose lease was taken over by another worker are left alone.
func (e *engine) settle(ctx context.Context, ops []settleOp) (int64, error) {
	if len(ops) == 0 {
		return 0, nil
	}
	// One round trip, one implicit transaction (see Bookkeeping).
	b := &pgx.Batch{}
	b.Queue(e.q.bookkeeping)
	b.Queue(e.q.settlePlans)
	b.Queue(e.q.settle, e.settleArgs(ops)...)
	n, err := batchLast(ctx, e.pool, b, func(rows pgx.Rows) (int64, error) {
		return pgx.CollectExactlyOneRow(rows, pgx.RowTo[int64])
	})
	if err != nil {
		return 0, fmt.Errorf("settle %d rows of %q: %w", len(ops), e.q.table, err)
	}
	return n, nil
}

// settleArgs are the arguments of the Settle statement for ops.
func (e *engine) settleArgs(ops []settleOp) []any {
	var (
		acks, releases []int64
		ackLeases      []int32
		ackRuns        []int32 // 1-based index into runTopics and runKeys; 0: no run
		runTopics      []string
		runKeys        []string
		runOf          map[[2]string]int32
		releaseLeases  []int32
		ids            []int64
		kinds          []string
		incs           []int32
		giveUps        []bool
		retryAts       []*time.Time
		errs           []string
		leases         []int32
	)
	for _, o := range ops {
		switch o.op {
		case 'a':
			acks = append(acks, o.id)
			ackLeases = append(ackLeases, int32(o.lease))
			var run int32
			if o.run != nil {
				k := [2]string{o.topic, *o.run}
				if run = runOf[k]; run == 0 {
					if runOf == nil {
						runOf = map[[2]string]int32{}
					}
					runTopics, runKeys = append(runTopics, k[0]), append(runKeys, k[1])
					run = int32(len(runKeys))
					runOf[k] = run
				}
			}
			ackRuns = append(ackRuns, run)
		case 'r':
			releases = append(releases, o.id)
			releaseLeases = append(releaseLeases, int32(o.lease))
		default:
			ids = append(ids, o.id)
			kinds = append(kinds, string(o.op))
			incs = append(incs, int32(o.inc))
			giveUps = append(giveUps, o.giveUp)
			retryAts = append(retryAts, o.retryAt)
			errs = append(errs, o.err)
			leases = append(leases, int32(o.lease))
		}
	}
	return []any{e.worker, acks, releases, ids, kinds, incs, giveUps, retryAts, errs, releaseLeases, leases, ackLeases,
		runTopics, runKeys, e.group, ackRuns}
}

// settleIsolating writes ops like settle. When PostgreSQL refuses the batch
// for what one of its rows holds (a data or constraint error, not a lost
// connection), the batch is split in halves until the refused settlements
// are found, so one row never stalls the others' acks. A refused failure is
// stored again as a plain counted failure whose last_error says why; a
// settlement refused even so is dropped with a log line, and its row comes
// back when its lease expires (at least once, never lost).
func (e *engine) settleIsolating(ctx context.Context, ops []settleOp, log func(msg string, args ...any)) (int64, error) {
	n, err := e.settle(ctx, ops)
	if err == nil || !isRowRefusal(err) {
		return n, err
	}
	if len(ops) > 1 {
		half := len(ops) / 2
		a, errA := e.settleIsolating(ctx, ops[:half], log)
		b, errB := e.settleIsolating(ctx, ops[half:], log)
		return a + b, errors.Join(errA, errB)
	}
	o := ops[0]
	if o.op == 'n' || o.op == 'p' {
		// The retry time is kept (it was clamped to what the column holds):
		// dropping it would make the row due at once, a hot loop.
		o.err = storableText(fmt.Sprintf("omnibus: the failure's settlement could not be stored (%s); its own error text was dropped", pgErrorText(err)), 1024)
		if n, err2 := e.settle(ctx, []settleOp{o}); err2 == nil {
			log("omnibus: a failure's settlement was refused by the database; stored without its error text", "id", o.id, "error", err)
			return n, nil
		} else if !isRowRefusal(err2) {
			return 0, err2
		}
	}
	log("omnibus: the database refuses a row's settlement; the row is delivered again when its lease expires", "id", o.id, "error", err)
	return 0, nil
}

// isRowRefusal reports whether PostgreSQL refused a statement for the data
// it carries (class 22 data exception, 23 integrity violation, 54 program
// limit, P0 raised by a trigger), rather than for the connection or the
// server's state, where retrying the whole batch is right.
func isRowRefusal(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || len(pgErr.Code) < 2 {
		return false
	}
	switch pgErr.Code[:2] {
	case "22", "23", "54", "P0":
		return true
	}
	return false
}

func pgErrorText(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return "SQLSTATE " + pgErr.Code + ": " + pgErr.Message
	}
	return err.Error()
}

// reconcile gives back lanes this worker holds: each lane's next ready time
// is computed from its rows, and lanes without pending rows are deleted.
// Lanes a writer is locking right now are returned in retry; lanes that are
// no longer ours are dropped. readyNow counts lanes that are ready at once.
// On error, retry still holds the lanes left to give back: a lane given back
// before the error must not be given back again, since it may have been
// leased anew meanwhile.
//
// lasts holds, for lanes whose fetch handed out rows, the highest id handed
// out: every row of the lane up to it existed when the fetch held the lane
// locked, so no row at or below it can appear later (but by a requeue), and
// the lane's floor may move up to the first pending row, at most last+1.
//
// Lanes in drained (their last run was all acked and held every row in line)
// are most likely empty, and would only be found so here to go the careful
// way (settleCareful) after it: they go there at once, which spares them a
// lock and a look at their rows, and spares the transaction when every lane
// is drained, as when a relay drains a backlog of short keys
// (BenchmarkRelayDrain). The careful way is right for any lane (a lane that
// is not empty after all gets its next ready time there, or is given back
// ready when a writer holds it), so a wrong guess costs only time.
func (e *engine) reconcile(ctx context.Context, lanes []laneKey, lasts map[laneKey]int64, drained map[laneKey]bool) (retry []laneKey, readyNow int64, err error) {
	if len(lanes) == 0 {
		return nil, 0, nil
	}
	var careful, rest []laneKey
	for _, l := range lanes {
		if drained[l] {
			careful = append(careful, l)
		} else {
			rest = append(rest, l)
		}
	}
	var locked []laneKey
	if len(rest) > 0 {
		var again []laneKey
		locked, again, readyNow, err = e.recomputeHeld(ctx, rest, lasts)
		if err != nil {
			return lanes, 0, err
		}
		careful = append(careful, again...)
	}
	if len(careful) > 0 {
		n, err := e.settleCareful(ctx, careful, lasts)
		if err != nil {
			// The other lanes are given back already (and may be leased
			// again, even by this worker): only the careful ones, still ours
			// and untouched, and those not locked are left to retry.
			return append(careful, minus(rest, locked)...), readyNow, err
		}
		readyNow += n
	}
	if len(locked) == len(rest) {
		return nil, readyNow, nil
	}
	// Some lanes were not locked: either a writer holds them (retry later) or
	// they are not ours any more (drop them).
	left := minus(rest, locked)
	rg, rt, rk := laneArrays(left)
	rows, err := e.pool.Query(ctx, e.q.ownedLanes, e.worker, rg, rt, rk)
	if err != nil {
		return left, readyNow, fmt.Errorf("reconcile lanes of %q: check ownership: %w", e.q.table, err)
	}
	retry, err = scanLanes(rows)
	if err != nil {
		return left, readyNow, fmt.Errorf("reconcile lanes of %q: check ownership: %w", e.q.table, err)
	}
	return retry, readyNow, nil
}

// recomputeHeld locks the lanes it can and gives them their next ready
// time, in one transaction. It returns the lanes it locked, those of them
// that need the careful way (empty or asleep: see settleCareful), and how
// many lanes are ready now.
func (e *engine) recomputeHeld(ctx context.Context, lanes []laneKey, lasts map[laneKey]int64) (locked, careful []laneKey, readyNow int64, err error) {
	gs, ts, ks := laneArrays(lanes)
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		return nil, nil, 0, fmt.Errorf("reconcile lanes of %q: begin: %w", e.q.table, err)
	}
	defer func() { _ = tx.Rollback(ctx) }()

	locked, err = e.lockLanes(ctx, tx, gs, ts, ks)
	if err != nil {
		return nil, nil, 0, fmt.Errorf("reconcile lanes of %q: lock: %w", e.q.table, err)
	}
	if len(locked) > 0 {
		careful, readyNow, err = e.recompute(ctx, tx, locked, lasts, false)
		if err != nil {
			return nil, nil, 0, err
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, nil, 0, fmt.Errorf("reconcile lanes of %q: commit: %w", e.q.table, err)
	}
	return locked, careful, readyNow, nil
}

// lockLanes runs Bookkeeping and LockLanes in tx, in one round trip.
func (e *engine) lockLanes(ctx context.Context, tx pgx.Tx, gs, ts, ks []string) ([]laneKey, error) {
	b := &pgx.Batch{}
	b.Queue(e.q.bookkeeping)
	b.Queue(e.q.lockLanes, e.worker, gs, ts, ks)
	return batchLast(ctx, tx, b, scanLanes)
}

// settleCareful gives back the lanes that reconcile left to it, in a
// transaction of its own.
//
// reconcile gives most lanes their next ready time at once: now when their
// head is deliverable, the retry time of a tried head (a writer's new row is
// behind that head and must wait anyway), infinity when blocked. Two kinds
// need more care, because a writer may be inserting a row we cannot see yet
// (writers take no lock reconcile waits for):
//   - empty lanes, which we would delete, orphaning the writer's row;
//   - asleep lanes (nothing in line, only delayed rows), which would sleep
//     until the first delayed row is due although the writer's row is due now.
//
// For those we take the key's advisory lock exclusively, with a try, which
// no writer of the key can hold beside us: a lane a writer holds is skipped
// and given back ready now (to be looked at again); a writer arriving after
// us waits for our commit, then sees the lane deleted or asleep and leaves
// a note (migration 0004). The locked ones are looked at in later
// statements, whose snapshots include every writer that held the lock before
// us: those without pending rows are deleted, and the rest recomputed.
func (e *engine) settleCareful(ctx context.Context, careful []laneKey, lasts map[laneKey]int64) (readyNow int64, err error) {
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("reconcile lanes of %q: begin: %w", e.q.table, err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	g, t, k := laneArrays(careful)
	b := &pgx.Batch{}
	b.Queue(e.q.bookkeeping)
	b.Queue(e.q.lockEmpty, e.worker, g, t, k)
	exclusive, err := batchLast(ctx, tx, b, scanLanes)
	if err != nil {
		return 0, fmt.Errorf("lock lanes of %q: %w", e.q.table, err)
	}
	settled := map[laneKey]bool{}
	if len(exclusive) > 0 {
		// The lanes without pending rows are deleted first: most lanes that
		// come this way are empty (a drained key, reconcile), and for them
		// this one statement is all. The rest get their next ready time.
		eg, et, ek := laneArrays(exclusive)
		rows, err := tx.Query(ctx, e.q.deleteEmpty, eg, et, ek)
		if err != nil {
			return 0, fmt.Errorf("delete empty lanes of %q: %w", e.q.table, err)
		}
		deleted, err := scanLanes(rows)
		if err != nil {
			return 0, fmt.Errorf("delete empty lanes of %q: %w", e.q.table, err)
		}
		for _, d := range deleted {
			settled[d] = true
		}
		if kept := minus(exclusive, deleted); len(kept) > 0 {
			empty, ready, err := e.recompute(ctx, tx, kept, lasts, true)
			if err != nil {
				return 0, err
			}
			readyNow += ready
			for _, l := range kept {
				settled[l] = true
			}
			for _, l := range empty {
				// Its rows went between the two statements (a row deleted
				// by hand): given back ready, it is looked at again.
				settled[l] = false
			}
		}
	}
	var back []laneKey
	for _, l := range careful {
		if !settled[l] {
			back = append(back, l)
		}
	}
	if len(back) > 0 {
		bg, bt, bk := laneArrays(back)
		// Only the lanes still ours are given back ready and counted: a lane
		// another worker took over since is left to it, and counting it would
		// wake this worker's fetch for nothing.
		tag, err := tx.Exec(ctx, e.q.readyLanes, e.worker, bg, bt, bk)
		if err != nil {
			return 0, fmt.Errorf("give back lanes of %q: %w", e.q.table, err)
		}
		readyNow += tag.RowsAffected()
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, fmt.Errorf("reconcile lanes of %q: commit: %w", e.q.table, err)
	}
	return readyNow, nil
}

// recompute sets the next ready time of lanes from their rows. It returns
// the lanes that need the careful path (empty ones, and, unless final,
// asleep ones, which it leaves untouched) and how many lanes are ready now.
func (e *engine) recompute(ctx context.Context, tx pgx.Tx, lanes []laneKey, lasts map[laneKey]int64, final bool) (careful []laneKey, readyNow int64, err error) {
	lg, lt, lk := laneArrays(lanes)
	ll := make([]int64, len(lanes))
	for i, k := range lanes {
		ll[i] = lasts[k]
	}
	rows, err := tx.Query(ctx, e.q.reconcile, lg, lt, lk, e.block, final, ll)
	if err != nil {
		return nil, 0, fmt.Errorf("reconcile lanes of %q: %w", e.q.table, err)
	}
	defer rows.Close()
	for rows.Next() {
		var (
			kind    string
			g, t, k *string
		)
		if err := rows.Scan(&kind, &g, &t, &k); err != nil {
			return nil, 0, fmt.Errorf("reconcile lanes of %q: scan: %w", e.q.table, err)
		}
		if kind == "ready" {
			readyNow++
			continue
		}
		careful = append(careful, laneKey{group: *g, topic: *t, key: *k})
	}
	if err := rows.Err(); err != nil {
		return nil, 0, fmt.Errorf("reconcile lanes of %q: %w", e.q.table, err)
	}
	return careful, readyNow, nil
}

// extend renews the leases of in-flight rows and of their lanes. It
// returns the lanes it renewed and the lanes it found held by another
// worker (lost); lanes it skipped because a writer was locking them are in
// neither and keep their old deadline.
func (e *engine) extend(ctx context.Context, ids []int64, lanes []laneKey) (renewed, lost []laneKey, err error) {
	// The lanes are renewed even when the rows' renewal fails: a lane whose
	// lease lapses stops its run (unitLease), and every key in flight would
	// wait for a new fetch.
	var rowsErr error
	if len(ids) > 0 {
		// One implicit transaction: the rows are read by id whatever the
		// statistics say (SettlePlans).
		b := &pgx.Batch{}
		b.Queue(e.q.settlePlans)
		b.Queue(e.q.extendRows, e.worker, e.lease, ids)
		if err := e.pool.SendBatch(ctx, b).Close(); err != nil {
			rowsErr = fmt.Errorf("extend leases of %d rows of %q: %w", len(ids), e.q.table, err)
		}
	}
	renewed, lost, err = e.extendLanes(ctx, lanes)
	return renewed, lost, errors.Join(rowsErr, err)
}

// extendLanes renews the leases of lanes and reports which were renewed and
// which another worker holds now.
func (e *engine) extendLanes(ctx context.Context, lanes []laneKey) (renewed, lost []laneKey, err error) {
	if len(lanes) == 0 {
		return nil, nil, nil
	}
	gs, ts, ks := laneArrays(lanes)
	renewed, err = e.lanesByIndex(ctx, e.q.extendLanes, e.worker, e.lease, gs, ts, ks)
	if err != nil {
		return nil, nil, fmt.Errorf("extend leases of %d lanes of %q: %w", len(lanes), e.q.table, err)
	}
	if len(renewed) == len(lanes) {
		return renewed, nil, nil
	}
	rest := minus(lanes, renewed)
	rg, rt, rk := laneArrays(rest)
	owned, err := e.lanesByIndex(ctx, e.q.ownedLanes, e.worker, rg, rt, rk)
	if err != nil {
		return renewed, nil, fmt.Errorf("check lease of %d lanes of %q: %w", len(rest), e.q.table, err)
	}
	return renewed, minus(rest, owned), nil
}

// lanesByIndex runs the lanes statement sql after IndexPlans, in one
// implicit transaction (commits stay synchronous), and returns its lanes.
func (e *engine) lanesByIndex(ctx context.Context, sql string, args ...any) ([]laneKey, error) {
	b := &pgx.Batch{}
	b.Queue(e.q.indexPlans)
	b.Queue(sql, args...)
	return batchLast(ctx, e.pool, b, scanLanes)
}

// minus returns the lanes of a that are not in b.
func minus(a, b []laneKey) []laneKey {
	in := make(map[laneKey]bool, len(b))
	for _, k := range b {
		in[k] = true
	}
	var out []laneKey
	for _, k := range a {
		if !in[k] {
			out = append(out, k)
		}
	}
	return out
}

// sweep recreates missing lanes and reports how many it created. It runs
// with a short lock timeout: if it would wait on a writer creating one of
// the same lanes, the sweep gives way (and tries again next time), never the
// business transaction.
func (e *engine) sweep(ctx context.Context) (int64, error) {
	var n int64
	err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, e.q.indexPlans); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, e.q.lockTimeout, "200ms"); err != nil {
			return err
		}
		// Writers' notes not taken yet are not missing lanes: take them
		// first, so the count (and the log line) is only of lanes that
		// were really gone.
		if _, err := tx.Exec(ctx, e.q.takeNotes); err != nil {
			return err
		}
		tag, err := tx.Exec(ctx, e.q.sweep)
		n = tag.RowsAffected()
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("sweep lanes of %q: %w", e.q.table, err)
	}
	return n, nil
}

// vacuum vacuums the table's lanes and notes tables (queries.vacuum),
// unless both were vacuumed within the last interval (by another relay of
// the fleet, or autovacuum); it reports whether it did. A role that does
// not own them gets a warning from PostgreSQL, not an error, and vacuums
// nothing; autovacuum's settings (migration 0006) then do it.
func (e *engine) vacuum(ctx context.Context, interval time.Duration) (bool, error) {
	var recent bool
	err := e.pool.QueryRow(ctx, e.q.vacuumedAgo, interval,
		e.q.table.derived("_lanes").quoted(), e.q.table.derived("_notes").quoted()).Scan(&recent)
	if err != nil {
		return false, fmt.Errorf("vacuum lanes of %q: when were they vacuumed: %w", e.q.table, err)
	}
	if recent {
		return false, nil
	}
	if _, err := e.pool.Exec(ctx, e.q.vacuum); err != nil {
		return false, fmt.Errorf("vacuum lanes of %q: %w", e.q.table, err)
	}
	return true, nil
}

// compactMinDead is how many dead versions the lanes or notes table holds,
// at least, before a Subscriber compacts it (engine.compact).
const compactMinDead = 10_000

// deadVersionBytes is less than any lane or note takes in its table's file
// (a tuple header alone is 24 bytes, its line pointer 4).
const deadVersionBytes = 32

// compact compacts the lanes table, and then the notes table, when it holds
// more dead versions than vacuum could remove: at least minDead, and more
// than four times its live rows, in a file of at least minDead times
// deadVersionBytes. CompactLanes says why and how. Vacuum removes them
// unless the xmin horizon is pinned, so this is what keeps the tables small
// behind a long transaction. It returns the tables it compacted, and
// whether any table's counts were over the threshold (a table it could not
// lock within the lock timeout is left for the next call,
// isLockTimeout(err)).
//
// The counts lag: a compaction's TRUNCATE reaches them when its session
// reports, a second later or, under load, several, and until then they
// still show what it freed. So a file that a compaction made since an
// earlier call (this engine's or another relay's) is compacted only once it
// has grown by minDead times deadVersionBytes since this engine first saw
// it; the size does not lag. Calls must not overlap (Subscriber.vacuum
// makes them from one goroutine).
func (e *engine) compact(ctx context.Context, minDead int64) (compacted []string, over bool, err error) {
	for _, t := range []struct{ name, sql string }{
		{e.q.table.derived("_lanes").quoted(), e.q.compactLanes},
		{e.q.table.derived("_notes").quoted(), e.q.compactNotes},
	} {
		var dead, live, size int64
		var file uint32
		if err := e.pool.QueryRow(ctx, e.q.deadVersions, t.name).Scan(&dead, &live, &size, &file); err != nil {
			return compacted, over, fmt.Errorf("compact %s: count its dead versions: %w", t.name, err)
		}
		trusted := e.trusted(t.name, file, size, minDead*deadVersionBytes)
		if dead < minDead || dead <= 4*live || size < minDead*deadVersionBytes {
			continue
		}
		over = true
		if !trusted {
			continue
		}
		if _, err := e.pool.Exec(ctx, t.sql); err != nil {
			return compacted, over, fmt.Errorf("compact %s (%d dead versions, %d live rows): %w", t.name, dead, live, err)
		}
		compacted = append(compacted, t.name)
	}
	return compacted, over, nil
}

// fileMark is what engine.compact saw of a table's file: the file, its size
// when first seen, and whether it appeared after the first look (a
// compaction made it, so its counts may still show what that freed).
type fileMark struct {
	file uint32
	size int64
	made bool
}

// trusted records a look at table's file and reports whether its counts
// can be trusted: the file was there at the first look, or it has grown by
// at least by bytes since it was first seen.
func (e *engine) trusted(table string, file uint32, size, by int64) bool {
	if e.files == nil {
		e.files = map[string]fileMark{}
	}
	seen, ok := e.files[table]
	if !ok || seen.file != file {
		seen = fileMark{file: file, size: size, made: ok}
		e.files[table] = seen
	}
	return !seen.made || size-seen.size >= by
}

func laneArrays(lanes []laneKey) (gs, ts, ks []string) {
	gs, ts, ks = make([]string, len(lanes)), make([]string, len(lanes)), make([]string, len(lanes))
	for i, l := range lanes {
		gs[i], ts[i], ks[i] = l.group, l.topic, l.key
	}
	return gs, ts, ks
}

// leasedLane is a lane a fetch leased, with its floor (queries.pick).
type leasedLane struct {
	key   laneKey
	floor int64
}

func scanLeased(rows pgx.Rows) ([]leasedLane, error) {
	defer rows.Close()
	var out []leasedLane
	for rows.Next() {
		var l leasedLane
		if err := rows.Scan(&l.key.group, &l.key.topic, &l.key.key, &l.floor); err != nil {
			return nil, err
		}
		out = append(out, l)
	}
	return out, rows.Err()
}

func scanLanes(rows pgx.Rows) ([]laneKey, error) {
	defer rows.Close()
	var out []laneKey
	for rows.Next() {
		var k laneKey
		if err := rows.Scan(&k.group, &k.topic, &k.key); err != nil {
			return nil, err
		}
		out = append(out, k)
	}
	return out, rows.Err()
}
