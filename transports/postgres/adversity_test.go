package postgres

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/internal/testenv"
)

// Tests written by an impolite user: writers that interleave on one key
// without any mutex, relays that race each other, leases that run out.

// r1 committed; writer A inserts r2 and stays open; writer B inserts r3 and
// commits. r3 must not be delivered before r2: the key waits for A.
func TestOrder_UncommittedWriterHoldsItsKeyBack(t *testing.T) {
	t.Parallel()
	pool, ob := newOutbox(t)
	ctx := context.Background()
	e := testEngine(pool, ob, "relay", 16)
	enqueue(t, pool, ob, "t", event("k", "r1"))

	a, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = a.Rollback(ctx) }()
	require.NoError(t, ob.Enqueue(ctx, a, "t", event("k", "r2")))
	enqueue(t, pool, ob, "t", event("k", "r3"), event("other", "o1"))

	got := payloads(cycle(t, e, 100, nil))
	assert.Equal(t, []string{"o1"}, got,
		"while writer A (r2) is open, nothing of its key may go out (r3 has a higher id than r2); other keys flow")

	require.NoError(t, a.Commit(ctx))
	assert.Equal(t, []string{"r1", "r2", "r3"}, payloads(cycle(t, e, 100, nil)),
		"after A commits, the key drains in id order")
}

// A writer that rolls back leaves a gap that must not hold the key.
func TestOrder_RolledBackWriterReleasesItsKey(t *testing.T) {
	t.Parallel()
	pool, ob := newOutbox(t)
	ctx := context.Background()
	e := testEngine(pool, ob, "relay", 16)
	enqueue(t, pool, ob, "t", event("k", "r1"))
	a, err := pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, ob.Enqueue(ctx, a, "t", event("k", "gone")))
	enqueue(t, pool, ob, "t", event("k", "r3"))
	assert.Empty(t, cycle(t, e, 100, nil), "the key waits for the open writer")
	require.NoError(t, a.Rollback(ctx))
	assert.Equal(t, []string{"r1", "r3"}, payloads(cycle(t, e, 100, nil)))
}

// A long transaction that touches no outbox key holds back nothing.
func TestOrder_UnrelatedLongTransactionHoldsNothingBack(t *testing.T) {
	t.Parallel()
	pool, ob := newOutbox(t)
	ctx := context.Background()
	e := testEngine(pool, ob, "relay", 16)
	long, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = long.Rollback(ctx) }()
	// It has an xid and an open snapshot, as a long report or migration would.
	_, err = long.Exec(ctx, `CREATE TEMP TABLE busy (x int); INSERT INTO busy VALUES (1)`)
	require.NoError(t, err)
	enqueue(t, pool, ob, "t", event("k", "r1"), event("k", "r2"), event("j", "j1"))
	assert.Equal(t, []string{"j1", "r1", "r2"}, sortedPayloads(cycle(t, e, 100, nil)))
}

// Writers on a few keys with random think time inside their transactions
// and random rollbacks, four relays, no mutex anywhere: first deliveries of
// every key are in id order and nothing committed is lost.
func TestOrder_InterleavedWritersAndFourRelays(t *testing.T) {
	t.Parallel()
	pool, ob := newOutbox(t)
	interleavedWritersStand(t, pool, ob, standConfig{writers: 8, txs: 60, keys: 3, relays: 4, minKeys: 1, maxKeys: 3, think: true})
}

// The new user's business transaction: each touches 2–5 keys, many of them
// new, in an order it does not control, each through its own Enqueue call,
// while relays drain. omnibus must add no deadlock to it (issue 25): every
// transaction commits, and each key is still delivered in id order.
func TestEnqueue_MultiKeyTransactionsNeverDeadlock(t *testing.T) {
	t.Parallel()
	pool, ob := newOutbox(t)
	interleavedWritersStand(t, pool, ob, standConfig{
		writers: 8, txs: 10_000 / 8, keys: 20, newKeys: true, relays: 2, minKeys: 2, maxKeys: 5,
	})
}

type standConfig struct {
	writers, txs, relays int
	// keys is the key space; with newKeys half of each transaction's keys
	// are drawn from a space so large that they are mostly new (their lane
	// does not exist, or was deleted after the key drained).
	keys    int
	newKeys bool
	// Each transaction enqueues minKeys..maxKeys events, one Enqueue each;
	// with think it sleeps up to 10 ms after each.
	minKeys, maxKeys int
	think            bool
	// timeout bounds the whole stand; 0 means 2 minutes.
	timeout time.Duration
	// batch is each relay's BatchSize; 0 means 10 (small batches, so the
	// relays interleave as much as they can).
	batch int
}

func interleavedWritersStand(t *testing.T, pool *pgxpool.Pool, ob *Outbox, cfg standConfig) {
	if cfg.timeout == 0 {
		cfg.timeout = 2 * time.Minute
	}
	if cfg.batch == 0 {
		cfg.batch = 10
	}
	ctx, cancel := context.WithTimeout(context.Background(), cfg.timeout)
	defer cancel()
	table := ob.q.table.quoted()

	var (
		mu        sync.Mutex
		delivered = map[int64]int{} // id → deliveries
		firsts    = map[string][]int64{}
		who       = map[int64]string{} // first delivery: relay and time
	)
	subs := make([]*Subscriber, cfg.relays)
	for i := range subs {
		s, err := NewSubscriber(pool, SubscriberConfig{
			Table: ob.Table(), WorkerID: fmt.Sprintf("relay-%d", i), BatchSize: cfg.batch, RunLength: 4,
			PollInterval: 20 * time.Millisecond, CloseTimeout: time.Second,
		}, nil)
		require.NoError(t, err)
		subs[i] = s
		ch, err := s.Subscribe(ctx, AllTopics)
		require.NoError(t, err)
		go func() {
			for m := range ch {
				d, _ := bus.DeliveryOf(m)
				var id int64
				_, _ = fmt.Sscan(d.ID, &id)
				key := bus.PartitionKey(m)
				mu.Lock()
				if delivered[id] == 0 {
					firsts[key] = append(firsts[key], id)
					who[id] = fmt.Sprintf("relay-%d at %s (attempts %d)", i, time.Now().Format("15:04:05.000000"), d.Attempts)
				}
				delivered[id]++
				mu.Unlock()
				if rand.IntN(20) == 0 {
					time.Sleep(time.Duration(rand.IntN(3)) * time.Millisecond)
				}
				m.Ack()
			}
		}()
	}
	defer func() {
		for _, s := range subs {
			_ = s.Close()
		}
	}()

	var (
		wg        sync.WaitGroup
		deadlocks atomic.Int64
	)
	for w := 0; w < cfg.writers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < cfg.txs; i++ {
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					for n := cfg.minKeys + rand.IntN(cfg.maxKeys-cfg.minKeys+1); n > 0; n-- {
						k := fmt.Sprintf("k%d", rand.IntN(cfg.keys))
						if cfg.newKeys && rand.IntN(2) == 0 {
							k = fmt.Sprintf("new%d", rand.IntN(1_000_000))
						}
						msg := event(k, "x")
						if err := ob.Enqueue(ctx, tx, "t", msg); err != nil {
							return err
						}
						if !cfg.think {
							continue
						}
						// Think time inside the transaction, with the row inserted.
						if _, err := tx.Exec(ctx, "SELECT pg_sleep($1)", rand.Float64()/100); err != nil {
							return err
						}
					}
					if rand.IntN(5) == 0 {
						return errRollback
					}
					return nil
				})
				var pgErr *pgconn.PgError
				if errors.As(err, &pgErr) && pgErr.Code == "40P01" {
					deadlocks.Add(1)
					t.Errorf("writer: a business transaction was aborted as a deadlock victim: %v (%s)", err, pgErr.Detail)
					return
				}
				if err != nil && err != errRollback {
					t.Errorf("writer: %v", err)
					return
				}
			}
		}()
	}
	wg.Wait()
	require.Zero(t, deadlocks.Load(), "transactions aborted as deadlock victims")

	// Every committed row is delivered (the ids are the ground truth).
	var committed []int64
	rows, err := pool.Query(ctx, `SELECT id FROM `+table+` ORDER BY id`)
	require.NoError(t, err)
	committed, err = pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	drainFor := time.Minute
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) > drainFor {
		drainFor = time.Until(dl) // a large stand's relays have a backlog to drain
	}
	testenv.Eventually(t, drainFor, func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, id := range committed {
			if delivered[id] == 0 {
				return false
			}
		}
		return true
	}, "every committed row to be delivered")
	mu.Lock()
	defer mu.Unlock()
	for key, ids := range firsts {
		for i := 1; i < len(ids); i++ {
			if ids[i] < ids[i-1] {
				t.Errorf("key %s: first deliveries out of id order: %d (%s) after %d (%s) (all: %v)",
					key, ids[i], who[ids[i]], ids[i-1], who[ids[i-1]], ids)
				break
			}
		}
	}
}

var errRollback = fmt.Errorf("rollback on purpose")

// settling marks a row whose settlement is being written.
const settling = "(being settled)"

func sortedPayloads(rs []row) []string {
	out := payloads(rs)
	for i := 1; i < len(out); i++ {
		for j := i; j > 0 && out[j] < out[j-1]; j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	return out
}

// Four engines fetch and settle concurrently (acks, retries due now,
// transient failures) while writers add rows to the same keys, so lanes
// change between any fetch's snapshot and its locks. No lease ever expires
// here, so a row may never be handed out while another engine holds it
// unsettled, and first deliveries of a key stay in id order.
func TestFetch_ConcurrentFetchesHandOutOnlyWhatTheyLeased(t *testing.T) {
	t.Parallel()
	pool, ob := newOutbox(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	const keys, rowsPerKey = 8, 60

	var (
		mu      sync.Mutex
		holder  = map[int64]string{} // row → engine holding it unsettled
		firsts  = map[string][]int64{}
		seen    = map[int64]bool{}
		done    int
		dupes   []string
		written = make(chan struct{})
	)
	go func() {
		defer close(written)
		for i := 0; i < rowsPerKey; i++ {
			msgs := make([]*message.Message, 0, keys)
			for k := 0; k < keys; k++ {
				msgs = append(msgs, event(fmt.Sprintf("k%d", k), fmt.Sprint(i)))
			}
			if err := ob.Enqueue(ctx, pool, "t", msgs...); err != nil {
				t.Errorf("enqueue: %v", err)
				return
			}
		}
	}()
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		e := testEngine(pool, ob, fmt.Sprintf("e%d", w), 4)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				mu.Lock()
				finished := done == keys*rowsPerKey
				mu.Unlock()
				if finished {
					return
				}
				res, err := e.fetch(ctx, AllTopics, 3, 0)
				if err != nil {
					t.Errorf("%s: fetch: %v", e.worker, err)
					return
				}
				var ops []settleOp
				for _, r := range res.cut {
					ops = append(ops, r.settle('r'))
				}
				lanes := append([]laneKey(nil), res.idle...)
				mu.Lock()
				for _, u := range res.units {
					for i, r := range u.rows {
						if h, ok := holder[r.id]; ok && h != settling {
							dupes = append(dupes, fmt.Sprintf("row %d handed to %s while %s holds it", r.id, e.worker, h))
						}
						holder[r.id] = e.worker
						if !seen[r.id] {
							seen[r.id] = true
							firsts[u.lane.key] = append(firsts[u.lane.key], r.id)
						}
						if roll := rand.IntN(10); roll < 2 && i == 0 {
							// A failure: retry now (counted) or transient.
							now := time.Now()
							op := r.settle('n')
							op.inc, op.err, op.retryAt = roll, "boom", &now
							ops = append(ops, op)
							for _, rest := range u.rows[1:] {
								ops = append(ops, rest.settle('r'))
							}
							break
						}
						ops = append(ops, r.settle('a'))
						done++
					}
					lanes = append(lanes, *u.lane)
				}
				mu.Unlock()
				time.Sleep(time.Duration(rand.IntN(3)) * time.Millisecond)
				// From the settlement on, another engine may take the rows
				// (a failure retried now): mark them as being settled first.
				mu.Lock()
				for _, o := range ops {
					holder[o.id] = settling
				}
				mu.Unlock()
				if _, err := e.settle(ctx, ops); err != nil {
					t.Errorf("%s: settle: %v", e.worker, err)
					return
				}
				for len(lanes) > 0 && ctx.Err() == nil {
					if lanes, _, err = e.reconcile(ctx, lanes, nil, nil); err != nil {
						t.Errorf("%s: reconcile: %v", e.worker, err)
						return
					}
				}
				mu.Lock()
				for _, o := range ops {
					if holder[o.id] == settling {
						delete(holder, o.id)
					}
				}
				mu.Unlock()
			}
		}()
	}
	<-written
	wg.Wait()
	require.NoError(t, ctx.Err(), "the rows were not all delivered in time")
	assert.Empty(t, dupes, "a fetch handed out rows it had not leased")
	for key, ids := range firsts {
		for i := 1; i < len(ids); i++ {
			if ids[i] < ids[i-1] {
				t.Errorf("key %s: first deliveries out of id order: %d after %d", key, ids[i], ids[i-1])
				break
			}
		}
	}
}

type leaseRecorder struct {
	mu   sync.Mutex
	lost []LeaseLostInfo
}

func (r *leaseRecorder) ObserveFetch(FetchInfo)   {}
func (r *leaseRecorder) ObserveSettle(SettleInfo) {}
func (r *leaseRecorder) ObserveLeaseLost(l LeaseLostInfo) {
	r.mu.Lock()
	r.lost = append(r.lost, l)
	r.mu.Unlock()
}

// takeOver expires every lease of ob's table, as if the relays holding them
// had been stopped past them, and has worker take the key over with one
// fetch, until it gets one unit. (A relay still renews every Lease/3; a
// renewal between the two statements wins, so it tries again.)
func takeOver(t *testing.T, pool *pgxpool.Pool, ob *Outbox, worker string) fetchResult {
	t.Helper()
	ctx := context.Background()
	e := testEngine(pool, ob, worker, 16)
	var res fetchResult
	testenv.Eventually(t, 10*time.Second, func() bool {
		_, err := pool.Exec(ctx, `UPDATE `+ob.q.table.quoted()+` SET locked_until = now() - interval '1s';
			UPDATE `+ob.q.table.derived("_lanes").quoted()+` SET locked_until = now() - interval '1s'`)
		require.NoError(t, err)
		res, err = e.fetch(ctx, AllTopics, 10, 10)
		require.NoError(t, err)
		return len(res.units) == 1
	}, "%s to take the key", worker)
	return res
}

// noticeLoss waits until s has no lease of k that it still holds: its
// renewal found the key taken, or the unit that held it stopped.
func noticeLoss(t *testing.T, s *Subscriber, k laneKey) {
	t.Helper()
	testenv.Eventually(t, 5*time.Second, func() bool {
		s.tracked.mu.Lock()
		defer s.tracked.mu.Unlock()
		l := s.tracked.leases[k]
		return l == nil || l.lost.Load()
	}, "the first relay to notice")
}

// A relay whose handler outlives its lease (a long GC pause, SIGSTOP) while
// another relay takes the key must not deliver another row of that key.
func TestSubscriber_RelayThatLostItsLeaseStopsItsRun(t *testing.T) {
	t.Parallel()
	pool, ob := newOutbox(t)
	ctx := context.Background()
	enqueue(t, pool, ob, "t", event("k", "r1"), event("k", "r2"), event("k", "r3"))
	rec := &leaseRecorder{}
	// The first relay does not fetch again during the test: its lease runs
	// out only because the test says so (as if it had been stopped), and a
	// stopped relay does not fetch. So it neither polls nor listens: a
	// notification that reached it late made it fetch again in the moment
	// the test had expired its lease, and deliver r1 twice (about 1 run in
	// 3 under load, on main as well).
	var logs testenv.LogBuffer
	s1, err := NewSubscriber(pool, SubscriberConfig{Table: ob.Table(), WorkerID: "first", Lease: time.Second, Observer: rec,
		PollInterval: 10 * time.Minute, SweepInterval: -1, DisableListen: true},
		slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	require.NoError(t, err)
	defer s1.Close()
	defer func() {
		if t.Failed() {
			t.Logf("the first relay's log:\n%s", logs.String())
		}
	}()
	ch, err := s1.Subscribe(ctx, AllTopics)
	require.NoError(t, err)
	first := next(t, ch)
	require.Equal(t, "r1", string(first.Payload))

	// The first relay's lease runs out (as if it had been stopped), and a
	// second relay takes the key. Its run is r1 alone: r1, r2 and r3 are
	// left over from the first relay's expired lease, and such rows go one
	// at a time (the first relay may have died on one of them). (The first relay
	// still renews every Lease/3; a renewal between the two statements wins,
	// so try again until the second relay gets the key.)
	res := takeOver(t, pool, ob, "second")
	require.Equal(t, []string{"r1"}, payloads(res.units[0].rows), "the second relay took the key, one left-over row at a time")

	// The first relay's next renewal finds the key taken.
	// (The first relay may also have leased the key anew itself, in a turn
	// on it (takeTurn) that found it expired by the test; that unit stops
	// the same way, and is gone once it has.)
	noticeLoss(t, s1, laneKey{topic: "t", key: "k"})
	first.Ack()
	select {
	case m := <-ch:
		t.Fatalf("the first relay delivered %s after the second took its key (metadata %v; the second's run was %v)", m.Payload, m.Metadata, res.units[0].rows)
	case <-time.After(500 * time.Millisecond):
	}
	// r2 and r3 were not delivered. (A unit of its own turn, if there was
	// one, reports r1, the one row it did not hand out.)
	testenv.Eventually(t, 5*time.Second, func() bool {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		return slices.ContainsFunc(rec.lost, func(l LeaseLostInfo) bool { return l.Rows == 2 })
	}, "the lost lease to be reported")
	rec.mu.Lock()
	for _, l := range rec.lost {
		assert.Contains(t, []int{1, 2}, l.Rows, "a lost lease reported %d rows not delivered", l.Rows)
	}
	rec.mu.Unlock()
	// The first relay's ack of r1 was dropped: the row is the second's.
	testenv.Eventually(t, 5*time.Second, func() bool {
		s := stateOf(t, pool, ob, "r1")
		return s.status == "pending" && s.lockedBy != nil && *s.lockedBy == "second"
	}, "the first relay's settlement to be written (and dropped)")
}

// A message of a key that waits for its consumer (nobody reads the channel)
// while its lease is lost must not be handed out after: another relay holds
// the key by then and delivers it itself (on main the waiting send went
// through as soon as the consumer read, whatever had become of the lease).
func TestSubscriber_AMessageWaitingForItsConsumerIsNotHandedOutOnceItsLeaseIsLost(t *testing.T) {
	t.Parallel()
	pool, ob := newOutbox(t)
	ctx := context.Background()
	enqueue(t, pool, ob, "t", event("k", "r1"))
	rec := &leaseRecorder{}
	s1, err := NewSubscriber(pool, SubscriberConfig{Table: ob.Table(), WorkerID: "first", Lease: time.Second, Observer: rec,
		PollInterval: 10 * time.Minute, SweepInterval: -1, DisableListen: true}, nil)
	require.NoError(t, err)
	defer s1.Close()
	ch, err := s1.Subscribe(ctx, AllTopics)
	require.NoError(t, err)
	testenv.Eventually(t, 10*time.Second, func() bool {
		s1.tracked.mu.Lock()
		defer s1.tracked.mu.Unlock()
		return s1.tracked.leases[laneKey{topic: "t", key: "k"}] != nil
	}, "the first relay to take the key and wait for its consumer")

	// Nobody reads ch. The first relay's lease runs out and a second relay
	// takes the key, until the first relay's renewal finds it taken.
	takeOver(t, pool, ob, "second")
	noticeLoss(t, s1, laneKey{topic: "t", key: "k"})
	select {
	case m := <-ch:
		t.Fatalf("the first relay handed out %s after the second took its key", m.Payload)
	case <-time.After(500 * time.Millisecond):
	}
	testenv.Eventually(t, 5*time.Second, func() bool {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		return len(rec.lost) > 0
	}, "the lost lease to be reported")
	s := stateOf(t, pool, ob, "r1")
	assert.Equal(t, "pending", s.status)
	require.NotNil(t, s.lockedBy)
	assert.Equal(t, "second", *s.lockedBy, "the first relay's release of r1 was dropped: the row is the second's")
}

// A relay whose lease ran out while it delivered a key (a pause longer than
// the lease) may lease the key anew itself, before it noticed. The unit of
// the old lease must then stop: deliver nothing more of the key and not
// give the lane back, which the lanes table cannot tell from a give-back of
// the new lease (both are this worker's). On main the old unit went on to
// r2 while the new one redelivered r1, and gave the new lease's lane back.
func TestSubscriber_ARelayThatLeasesAKeyAnewStopsTheOldLeasesRun(t *testing.T) {
	t.Parallel()
	pool, ob := newOutbox(t)
	ctx := context.Background()
	enqueue(t, pool, ob, "t", event("k", "r1"), event("k", "r2"))
	rec := &leaseRecorder{}
	s1, err := NewSubscriber(pool, SubscriberConfig{Table: ob.Table(), WorkerID: "first", Lease: 2 * time.Second, Observer: rec,
		PollInterval: 10 * time.Minute, SweepInterval: -1, DisableListen: true}, nil)
	require.NoError(t, err)
	defer s1.Close()
	ch, err := s1.Subscribe(ctx, AllTopics)
	require.NoError(t, err)
	first := next(t, ch)
	require.Equal(t, "r1", string(first.Payload))
	k := laneKey{topic: "t", key: "k"}
	leaseOf := func() *unitLease {
		s1.tracked.mu.Lock()
		defer s1.tracked.mu.Unlock()
		return s1.tracked.leases[k]
	}
	old := leaseOf()
	require.NotNil(t, old)

	// The lease runs out while r1 is in its handler, and the relay fetches:
	// it leases the key anew. (A renewal between the two may extend the
	// lease first: then try again.)
	testenv.Eventually(t, 10*time.Second, func() bool {
		_, err := pool.Exec(ctx, `UPDATE `+ob.q.table.quoted()+` SET locked_until = now() - interval '1s';
			UPDATE `+ob.q.table.derived("_lanes").quoted()+` SET locked_until = now() - interval '1s'`)
		require.NoError(t, err)
		s1.wakeAll()
		deadline := time.Now().Add(300 * time.Millisecond)
		for time.Now().Before(deadline) {
			if l := leaseOf(); l != nil && l != old {
				return true
			}
			time.Sleep(5 * time.Millisecond)
		}
		return false
	}, "the relay to lease the key anew")

	// The old run's handler finishes; the old unit delivers nothing more.
	first.Ack()
	testenv.Eventually(t, 5*time.Second, func() bool {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		return len(rec.lost) == 1 && rec.lost[0].Rows == 1
	}, "the old run to stop with r2 not delivered")
	holder := func() *string {
		var by *string
		require.NoError(t, pool.QueryRow(ctx, `SELECT locked_by FROM `+ob.q.table.derived("_lanes").quoted()+
			` WHERE topic = 't' AND partition_key = 'k'`).Scan(&by))
		return by
	}
	time.Sleep(300 * time.Millisecond) // the flusher's give-back, if there were one
	by := holder()
	require.NotNil(t, by, "the old unit gave back the lane the new lease holds")
	assert.Equal(t, "first", *by)

	// The new lease delivers the key from r1, in order.
	var got []string
	for len(got) < 2 {
		m := next(t, ch)
		got = append(got, string(m.Payload))
		m.Ack()
	}
	assert.Equal(t, []string{"r1", "r2"}, got)
	select {
	case m := <-ch:
		t.Fatalf("delivered %s a third time", m.Payload)
	case <-time.After(300 * time.Millisecond):
	}
}

type statementCounter struct{ n atomic.Int64 }

func (c *statementCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}
func (c *statementCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// A writer idle in its transaction on a key with rows ready: the relay must
// wait for it without spinning (on main, each give-back handed the lane back
// "ready now" and woke the relays at once: 94-369 lane updates a second).
func TestSubscriber_WriterIdleInTransactionDoesNotMakeRelaysSpin(t *testing.T) {
	t.Parallel()
	pool, ob := newOutbox(t)
	ctx := context.Background()
	counter := &statementCounter{}
	relayPool := testenv.NewTracedPostgresPool(t, 4, counter)
	enqueue(t, pool, ob, "t", event("k", "r1"))
	writer, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = writer.Rollback(ctx) }()
	require.NoError(t, ob.Enqueue(ctx, writer, "t", event("k", "r2")))

	s, err := NewSubscriber(relayPool, SubscriberConfig{Table: ob.Table(), DisableListen: true}, nil)
	require.NoError(t, err)
	defer s.Close()
	ch, err := s.Subscribe(ctx, AllTopics)
	require.NoError(t, err)

	const window = 3 * time.Second
	start := counter.n.Load()
	select {
	case m := <-ch:
		t.Fatalf("delivered %s while a writer of its key is open", m.Payload)
	case <-time.After(window):
	}
	n := counter.n.Load() - start
	t.Logf("statements of one relay while a writer sits idle in its transaction on a ready key: %d in %s (%.1f/s)",
		n, window, float64(n)/window.Seconds())
	// Polling once a second, a fetch is 4 statements, the starved-lane check
	// 1, a turn 9 with a backoff that doubles from 200 ms.
	assert.LessOrEqual(t, n, int64(80), "the relay spins on a lane a writer holds")

	require.NoError(t, writer.Commit(ctx))
	for _, want := range []string{"r1", "r2"} {
		m := next(t, ch)
		assert.Equal(t, want, string(m.Payload))
		m.Ack()
	}
}

// Operators tune the lane sweep from the config (relay.sweep_interval,
// OMNIBUS_RELAY_SWEEP_INTERVAL); negative turns it off.
func TestSubscriberFromConfig_SweepIntervalFromEnvironment(t *testing.T) {
	t.Setenv("OMNIBUS_RELAY_SWEEP_INTERVAL", "-1s")
	cfg, err := bus.LoadConfig("")
	require.NoError(t, err)
	assert.Equal(t, -time.Second, SubscriberFromConfig(cfg, SubscriberConfig{}).SweepInterval)
	assert.Equal(t, DefaultSweepInterval, SubscriberFromConfig(bus.Config{}, SubscriberConfig{}).SweepInterval)
}

// DESIGN §4.5: two ingest processes storing rows of one key in concurrent
// transactions must not make the dispatcher handle a higher id first.
func TestOrder_InboxStoreStillOpenHoldsItsKeyBack(t *testing.T) {
	t.Parallel()
	pool, in := newInbox(t)
	ctx := context.Background()
	_, err := in.Store(ctx, pool, "g", received("orders", "k", "", "r1"))
	require.NoError(t, err)
	a, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = a.Rollback(ctx) }()
	_, err = in.Store(ctx, a, "g", received("orders", "k", "", "r2"))
	require.NoError(t, err)
	_, err = in.Store(ctx, pool, "g", received("orders", "k", "", "r3"), received("orders", "other", "", "o1"))
	require.NoError(t, err)

	_, ch := inboxSubscriber(t, pool, in, "g")
	m := next(t, ch)
	assert.Equal(t, "o1", string(m.Payload), "other keys flow while a store of k is open")
	m.Ack()
	select {
	case m := <-ch:
		t.Fatalf("dispatched %s while the store of r2 (a smaller id than r3) is open", m.Payload)
	case <-time.After(300 * time.Millisecond):
	}
	require.NoError(t, a.Commit(ctx))
	for _, want := range []string{"r1", "r2", "r3"} {
		m := next(t, ch)
		assert.Equal(t, want, string(m.Payload))
		m.Ack()
	}
}

// A user's router without our Retry middleware: a handler that always
// Nacks. The row is delivered again after TransientDelay, not in a hot loop.
func TestSubscriber_PlainNackBacksOff(t *testing.T) {
	t.Parallel()
	pool, ob := newOutbox(t)
	enqueue(t, pool, ob, "t", event("k", "always nacked"))
	n := nackFor2s(t, pool, SubscriberConfig{Table: ob.Table()})
	t.Logf("deliveries of an always-nacked row in 2s with TransientDelay 500ms: %d", n)
	st := stateOf(t, pool, ob, "always nacked")
	assert.Equal(t, "pending", st.status, "a plain Nack never fails the row")
}

// nackFor2s subscribes with cfg (TransientDelay 500ms), Nacks every message
// for 2 s without a settlement, checks that the row came back, but not in a
// hot loop, and returns how many deliveries it saw.
func nackFor2s(t *testing.T, pool *pgxpool.Pool, cfg SubscriberConfig) int {
	t.Helper()
	cfg.TransientDelay, cfg.PollInterval = 500*time.Millisecond, 50*time.Millisecond
	s, err := NewSubscriber(pool, cfg, nil)
	require.NoError(t, err)
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	ch, err := s.Subscribe(ctx, AllTopics)
	require.NoError(t, err)
	n := 0
	for m := range ch {
		n++
		m.Nack()
	}
	assert.GreaterOrEqual(t, n, 2, "the row is delivered again")
	assert.LessOrEqual(t, n, 6, "a plain Nack must not refetch the row in a hot loop")
	return n
}

// The floor of a key moves past a row that failed; requeueing that row must
// move it back, or the row would never be fetched again.
func TestFloor_RequeuedRowBelowTheFloorIsDelivered(t *testing.T) {
	t.Parallel()
	f := newAdminFixture(t)
	ctx := context.Background()
	later := event("k", "later")
	SetDeliverAt(later, time.Now().Add(time.Hour)) // keeps the lane alive
	enqueue(t, f.pool, f.ob, "t", event("k", "first"), event("k", "second"), later)
	e := testEngine(f.pool, f.ob, "w1", 16)
	failFirst := func(r row) *settleOp {
		if string(r.payload) == "first" {
			return failWith(bus.ClassPermanent, time.Time{})(r)
		}
		return nil
	}
	require.Equal(t, []string{"first"}, payloads(cycle(t, e, 10, failFirst)))
	require.Equal(t, []string{"second"}, payloads(cycle(t, e, 10, nil)))
	var floor int64
	require.NoError(t, f.pool.QueryRow(ctx, `SELECT floor_id FROM `+f.ob.q.table.derived("_lanes").quoted()+` WHERE partition_key = 'k'`).Scan(&floor))
	require.Greater(t, floor, f.id("first"), "precondition: the floor moved past the failed row")

	require.NoError(t, f.admin.Requeue(ctx, f.id("first")))
	assert.Equal(t, []string{"first"}, payloads(cycle(t, e, 10, nil)), "the requeued row is fetched again")
}

// The same over an inbox table (the Dispatcher's subscriber).
func TestSubscriber_InboxPlainNackBacksOff(t *testing.T) {
	t.Parallel()
	pool, in := newInbox(t)
	_, err := in.Store(context.Background(), pool, "g", received("orders", "k", "", "always nacked"))
	require.NoError(t, err)
	nackFor2s(t, pool, SubscriberConfig{Table: in.Table(), Kind: KindInbox, ConsumerGroup: "g"})
}
