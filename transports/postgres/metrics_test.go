package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omnibus-go/omnibus/internal/testenv"
)

// gathered returns the value of the one gauge or counter called name.
func gathered(t *testing.T, g prometheus.Gatherer, name string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		require.Len(t, mf.GetMetric(), 1, "%s has more than one series", name)
		m := mf.GetMetric()[0]
		switch mf.GetType() {
		case dto.MetricType_GAUGE:
			return m.GetGauge().GetValue()
		case dto.MetricType_COUNTER:
			return m.GetCounter().GetValue()
		}
		t.Fatalf("%s is a %s, not a gauge or counter", name, mf.GetType())
	}
	t.Fatalf("no metric %s was gathered", name)
	return 0
}

func TestStatsCollector_GaugesMatchTheTable(t *testing.T) {
	t.Parallel()
	f := newAdminFixture(t)
	reg := prometheus.NewRegistry()
	_, err := NewStatsCollector(f.admin, reg, time.Hour)
	require.NoError(t, err)

	// The same table as TestAdmin_StatsMatchTheTable.
	enqueue(t, f.pool, f.ob, "t",
		event("held", "held-1"), event("held", "held-2"),
		event("failed", "failed-1"), event("failed", "failed-2"),
		event("leased", "leased-1"),
		event("expired", "expired-1"),
		event("delayed", "delayed-1"), event("delayed", "delayed-2"),
		event("blocked", "blocked-1"),
		event("", "done-1"), event("", "done-2"),
		event("", "loose-1"),
	)
	f.exec(`UPDATE {T} SET attempts = 1, last_error = 'boom', scheduled_at = now() + interval '1 hour' WHERE payload = 'held-1'`)
	f.fail("failed-1")
	f.exec(`UPDATE {T} SET locked_by = 'w', locked_until = now() + interval '1 minute' WHERE payload = 'leased-1'`)
	f.exec(`UPDATE {T} SET locked_by = 'w', locked_until = now() - interval '1 minute' WHERE payload = 'expired-1'`)
	f.exec(`UPDATE {T} SET scheduled_at = now() + interval '1 hour' WHERE payload = 'delayed-1'`)
	takeNotes(t, f.pool, f.ob.q)
	f.exec(`UPDATE {L} SET blocked = true, ready_at = 'infinity' WHERE partition_key = 'blocked'`)
	f.exec(`UPDATE {T} SET status = 'completed', completed_at = now() WHERE payload IN ('done-1', 'done-2')`)
	f.backdate(`UPDATE {T} SET created_at = now() - interval '2 hours' WHERE payload = 'loose-1'`)

	table := f.ob.Table()
	expected := fmt.Sprintf(`
# HELP omnibus_outbox_pending_rows Rows waiting for delivery (due, leased, delayed and retrying).
# TYPE omnibus_outbox_pending_rows gauge
omnibus_outbox_pending_rows{table=%[1]q} 9
# HELP omnibus_outbox_due_rows Pending rows that are due and not leased: they can be fetched now unless an earlier row of their key is in line.
# TYPE omnibus_outbox_due_rows gauge
omnibus_outbox_due_rows{table=%[1]q} 6
# HELP omnibus_outbox_leased_rows Pending rows under a live lease of a relay or worker.
# TYPE omnibus_outbox_leased_rows gauge
omnibus_outbox_leased_rows{table=%[1]q} 1
# HELP omnibus_outbox_expired_lease_rows Pending rows whose lease expired without being cleared (their worker stopped).
# TYPE omnibus_outbox_expired_lease_rows gauge
omnibus_outbox_expired_lease_rows{table=%[1]q} 1
# HELP omnibus_outbox_failed_rows Rows that spent their attempts or failed permanently; they wait for an operator.
# TYPE omnibus_outbox_failed_rows gauge
omnibus_outbox_failed_rows{table=%[1]q} 1
# HELP omnibus_outbox_completed_rows Delivered rows not yet deleted by cleanup: counted up to 10000, estimated from the table's statistics beyond.
# TYPE omnibus_outbox_completed_rows gauge
omnibus_outbox_completed_rows{table=%[1]q} 2
# HELP omnibus_outbox_pending_keys Keys (topic, partition key) with pending rows.
# TYPE omnibus_outbox_pending_keys gauge
omnibus_outbox_pending_keys{table=%[1]q} 6
# HELP omnibus_outbox_held_keys Keys held behind a tried head that waits for its retry time.
# TYPE omnibus_outbox_held_keys gauge
omnibus_outbox_held_keys{table=%[1]q} 1
# HELP omnibus_outbox_blocked_keys Keys frozen behind a failed row by the FailedBlock policy.
# TYPE omnibus_outbox_blocked_keys gauge
omnibus_outbox_blocked_keys{table=%[1]q} 1
# HELP omnibus_outbox_stats_up 1 when the last statistics query succeeded, 0 when it failed.
# TYPE omnibus_outbox_stats_up gauge
omnibus_outbox_stats_up{table=%[1]q} 1
`, table)
	names := []string{"omnibus_outbox_pending_rows", "omnibus_outbox_due_rows", "omnibus_outbox_leased_rows",
		"omnibus_outbox_expired_lease_rows", "omnibus_outbox_failed_rows", "omnibus_outbox_completed_rows",
		"omnibus_outbox_pending_keys", "omnibus_outbox_held_keys", "omnibus_outbox_blocked_keys", "omnibus_outbox_stats_up"}
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(expected), names...))

	age := gathered(t, reg, "omnibus_outbox_oldest_pending_age_seconds")
	assert.GreaterOrEqual(t, age, (2 * time.Hour).Seconds(), "the oldest pending row was created two hours ago")
	assert.Less(t, age, (2*time.Hour + time.Minute).Seconds(), "the oldest pending row was created two hours ago")
	problems, err := testutil.CollectAndLint(mustCollector(t, f.admin))
	require.NoError(t, err)
	assert.Empty(t, problems, "metric names and help pass promlint")
}

func mustCollector(t *testing.T, a *Admin) prometheus.Collector {
	t.Helper()
	c, err := NewStatsCollector(a, nil, 0)
	require.NoError(t, err)
	return c
}

func TestStatsCollector_QueriesAtMostOncePerInterval(t *testing.T) {
	t.Parallel()
	f := newAdminFixture(t)
	cached := prometheus.NewRegistry()
	_, err := NewStatsCollector(f.admin, cached, time.Hour)
	require.NoError(t, err)
	fresh := prometheus.NewRegistry()
	_, err = NewStatsCollector(f.admin, fresh, time.Nanosecond)
	require.NoError(t, err)

	enqueue(t, f.pool, f.ob, "t", event("k", "a"), event("k", "b"))
	assert.EqualValues(t, 2, gathered(t, cached, "omnibus_outbox_pending_rows"))
	assert.EqualValues(t, 2, gathered(t, fresh, "omnibus_outbox_pending_rows"))

	enqueue(t, f.pool, f.ob, "t", event("k", "c"))
	assert.EqualValues(t, 2, gathered(t, cached, "omnibus_outbox_pending_rows"),
		"within its interval a collector serves the figures of its last query")
	assert.EqualValues(t, 3, gathered(t, fresh, "omnibus_outbox_pending_rows"),
		"after its interval a collector queries again")
}

func TestStatsCollector_InboxGroupsAndAFailingQuery(t *testing.T) {
	t.Parallel()
	pool, in := newInbox(t)
	name := in.Table()
	ctx := context.Background()
	_, err := in.StoreWith(ctx, pool, StoreOptions{Group: "billing", Topic: "orders"}, event("k", "1"), event("k", "2"))
	require.NoError(t, err)
	_, err = in.StoreWith(ctx, pool, StoreOptions{Group: "shipping", Topic: "orders"}, event("k", "3"))
	require.NoError(t, err)

	all, err := NewAdmin(pool, InboxTable(name))
	require.NoError(t, err)
	billing, err := all.WithConsumerGroup("billing")
	require.NoError(t, err)

	reg := prometheus.NewRegistry()
	_, err = NewStatsCollector(all, reg, 0)
	require.NoError(t, err)
	_, err = NewStatsCollector(billing, reg, 0)
	require.NoError(t, err, "collectors of the same table for different groups share a registry")
	_, err = NewStatsCollector(all, reg, 0)
	require.Error(t, err, "a second collector of the same table and group is refused")

	expected := fmt.Sprintf(`
# HELP omnibus_inbox_pending_rows Rows waiting for delivery (due, leased, delayed and retrying).
# TYPE omnibus_inbox_pending_rows gauge
omnibus_inbox_pending_rows{consumer_group="",table=%[1]q} 3
omnibus_inbox_pending_rows{consumer_group="billing",table=%[1]q} 2
`, name)
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(expected), "omnibus_inbox_pending_rows"))

	// A table that does not exist: the query fails, stats_up says so and no
	// stale figures are exposed.
	gone, err := NewAdmin(pool, OutboxTable("omnibus_no_such_table_"+name[len(name)-10:]))
	require.NoError(t, err)
	broken := prometheus.NewRegistry()
	_, err = NewStatsCollector(gone, broken, 0)
	require.NoError(t, err)
	assert.Zero(t, gathered(t, broken, "omnibus_outbox_stats_up"))
	mfs, err := broken.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		assert.Contains(t, []string{"omnibus_outbox_stats_up", "omnibus_outbox_stats_query_duration_seconds"}, mf.GetName())
	}
}

func TestNewStatsCollector_RefusesBadArguments(t *testing.T) {
	t.Parallel()
	_, err := NewStatsCollector(nil, nil, 0)
	require.Error(t, err)
	pool, ob := newOutbox(t)
	a, err := NewAdmin(pool, OutboxTable(ob.Table()))
	require.NoError(t, err)
	_, err = NewStatsCollector(a, nil, -time.Second)
	require.ErrorContains(t, err, "minInterval")
}

// recorder is an Observer that keeps what it is told.
type recorder struct {
	fetches chan FetchInfo
	settles chan SettleInfo
}

func (r *recorder) ObserveFetch(f FetchInfo) {
	select {
	case r.fetches <- f:
	default:
	}
}

func (r *recorder) ObserveSettle(s SettleInfo) {
	select {
	case r.settles <- s:
	default:
	}
}

func TestSubscriber_ObserverSeesFetchesAndSettlements(t *testing.T) {
	t.Parallel()
	pool, ob := newOutbox(t)
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	require.NoError(t, err)
	rec := &recorder{fetches: make(chan FetchInfo, 1000), settles: make(chan SettleInfo, 1000)}
	sub, err := NewSubscriber(pool, SubscriberConfig{
		Table: ob.Table(), PollInterval: 20 * time.Millisecond, Observer: both{m, rec},
	}, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })

	enqueue(t, pool, ob, "t", event("a", "1"), event("a", "2"), event("b", "3"), event("", "4"))
	msgs, err := sub.Subscribe(context.Background(), AllTopics)
	require.NoError(t, err)
	for range 4 {
		select {
		case msg := <-msgs:
			msg.Ack()
		case <-time.After(30 * time.Second):
			t.Fatal("timed out waiting for the four rows")
		}
	}
	var fetched, settled int
	timeout := time.After(30 * time.Second)
	for fetched < 4 {
		var f FetchInfo
		select {
		case f = <-rec.fetches:
		case <-timeout:
			t.Fatalf("timed out waiting for fetches of four rows; saw %d", fetched)
		}
		require.NoError(t, f.Err)
		assert.Equal(t, ob.Table(), f.Table)
		assert.Empty(t, f.ConsumerGroup)
		fetched += f.Rows
	}
	for settled < 4 {
		var s SettleInfo
		select {
		case s = <-rec.settles:
		case <-timeout:
			t.Fatalf("timed out waiting for settlements of four rows; saw %d", settled)
		}
		require.NoError(t, s.Err)
		settled += s.Rows
	}
	assert.Equal(t, 4, fetched, "every row is fetched once")
	assert.Equal(t, 4, settled, "every row is settled once (acked)")

	// The Prometheus Observer saw the same.
	sizes, err := reg.Gather()
	require.NoError(t, err)
	sums := map[string]float64{}
	for _, mf := range sizes {
		for _, mm := range mf.GetMetric() {
			if h := mm.GetHistogram(); h != nil {
				sums[mf.GetName()] += h.GetSampleSum()
			}
		}
	}
	assert.EqualValues(t, 4, sums["omnibus_postgres_fetch_size_rows"])
	assert.EqualValues(t, 4, sums["omnibus_postgres_settle_size_rows"])
	assert.Zero(t, gatheredOr0(t, reg, "omnibus_postgres_fetch_errors_total"))
}

// both forwards to two Observers.
type both [2]Observer

func (b both) ObserveFetch(f FetchInfo) {
	b[0].ObserveFetch(f)
	b[1].ObserveFetch(f)
}

func (b both) ObserveSettle(s SettleInfo) {
	b[0].ObserveSettle(s)
	b[1].ObserveSettle(s)
}

func gatheredOr0(t *testing.T, g prometheus.Gatherer, name string) float64 {
	t.Helper()
	n, err := testutil.GatherAndCount(g, name)
	require.NoError(t, err)
	if n == 0 {
		return 0
	}
	return gathered(t, g, name)
}

func TestNewMetrics_SharesCollectorsOfOneRegistry(t *testing.T) {
	t.Parallel()
	_, err := NewMetrics(nil)
	require.Error(t, err, "a registry is required; the global one is never used by default")
	reg := prometheus.NewRegistry()
	a, err := NewMetrics(reg)
	require.NoError(t, err)
	b, err := NewMetrics(reg)
	require.NoError(t, err, "a second NewMetrics on the same registry shares its collectors")
	a.ObserveFetch(FetchInfo{Table: "x", Err: errors.New("boom")})
	b.ObserveFetch(FetchInfo{Table: "x", Err: errors.New("boom")})
	assert.EqualValues(t, 2, gathered(t, reg, "omnibus_postgres_fetch_errors_total"))
	b.ObserveStore(StoreInfo{Table: "in", ConsumerGroup: "g", New: 2, Duplicates: 1})
	n, err := testutil.GatherAndCount(reg, "omnibus_inbox_stored_messages_total")
	require.NoError(t, err)
	assert.Equal(t, 2, n, "one series for new, one for duplicate")
}

// The gauges an operator needs to see a long transaction and its cost coming
// (issue 27 point 7): the age of the oldest transaction holding the xmin
// horizon, and the dead share of the table, its lanes and its notes.
func TestStatsCollector_ShowsTheHorizonAndTheDeadVersions(t *testing.T) {
	t.Parallel()
	f := newAdminFixture(t)
	ctx := context.Background()
	for i := range 50 {
		enqueue(t, f.pool, f.ob, "t", event(fmt.Sprintf("k%d", i), "x"))
	}
	takeNotes(t, f.pool, f.ob.q)

	pinHorizon(t, f.pool) // a report left open

	// Every row completed, every lane gone: dead versions the open report
	// keeps vacuum from removing.
	f.exec(`UPDATE {T} SET status = 'completed', completed_at = now()`)
	f.exec(`DELETE FROM {L}`)

	testenv.Eventually(t, 15*time.Second, func() bool {
		reg := prometheus.NewRegistry()
		_, err := NewStatsCollector(f.admin, reg, time.Millisecond)
		require.NoError(t, err)
		mfs, err := reg.Gather()
		require.NoError(t, err)
		dead := map[string]float64{}
		var horizon float64
		for _, mf := range mfs {
			switch mf.GetName() {
			case "omnibus_outbox_dead_tuple_ratio":
				for _, m := range mf.GetMetric() {
					dead[m.GetLabel()[0].GetValue()] = m.GetGauge().GetValue()
				}
			case "omnibus_outbox_oldest_transaction_age_seconds":
				horizon = mf.GetMetric()[0].GetGauge().GetValue()
			}
		}
		// PostgreSQL counts dead versions at the end of each transaction,
		// at most once a second per session: wait for them.
		return horizon >= 1 && dead["table"] >= 0.5 && dead["lanes"] == 1
	}, "the open report to show as the oldest transaction, and the completed rows and deleted lanes as dead")
	h, err := f.admin.Health(ctx)
	require.NoError(t, err)
	assert.GreaterOrEqual(t, h.OldestTransactionAge, time.Second)
}

// Past DefaultCompletedCountCap completed rows the collector reports the
// table's estimate instead of counting them all, so a scrape costs the same
// whatever a table keeps: rows completed after the last ANALYZE are not in
// the gauge.
func TestStatsCollector_EstimatesCompletedRowsPastTheCap(t *testing.T) {
	t.Parallel()
	f := newAdminFixture(t)
	ctx := context.Background()
	complete := func(n int) {
		f.exec(`INSERT INTO {T} (event_id, topic, payload, status, completed_at)
			SELECT gen_random_uuid(), 't', '\x00', 'completed', now() FROM generate_series(1, $1) g`, n)
	}
	// The estimate is what this ANALYZE counts: autovacuum must not count
	// again meanwhile.
	f.exec(`DO $$ DECLARE r regclass; BEGIN
		FOR r IN SELECT '{T}'::regclass UNION SELECT relid FROM pg_partition_tree('{T}') WHERE isleaf LOOP
			CONTINUE WHEN (SELECT relkind FROM pg_class WHERE oid = r) <> 'r';
			EXECUTE format('ALTER TABLE %s SET (autovacuum_enabled = false)', r);
		END LOOP; END $$`)
	complete(DefaultCompletedCountCap + 500)
	enqueue(t, f.pool, f.ob, "t", event("k", "pending"))
	f.exec(`ANALYZE {T}`)
	complete(2000)

	reg := prometheus.NewRegistry()
	_, err := NewStatsCollector(f.admin, reg, 0)
	require.NoError(t, err)
	assert.EqualValues(t, DefaultCompletedCountCap+500, gathered(t, reg, "omnibus_outbox_completed_rows"),
		"the estimate of the last ANALYZE (its rows less the pending one), not a count of all %d", DefaultCompletedCountCap+2500)
	assert.EqualValues(t, 1, gathered(t, reg, "omnibus_outbox_pending_rows"), "pending rows are counted exactly")

	var n int64
	require.NoError(t, f.pool.QueryRow(ctx, f.sql(`SELECT count(*) FROM {T} WHERE status = 'completed'`)).Scan(&n))
	assert.EqualValues(t, DefaultCompletedCountCap+2500, n)
}
