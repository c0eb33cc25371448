package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/internal/testenv"
)

// newInbox migrates a fresh inbox table for the test and drops it after.
func newInbox(t *testing.T) (*pgxpool.Pool, *Inbox) {
	t.Helper()
	pool := testenv.Postgres(t)
	name := testenv.Name(t)
	require.NoError(t, Migrate(context.Background(), pool, testTable(InboxTable(name))))
	dropAfter(t, pool, name)
	in, err := NewInbox(InboxConfig{Table: name})
	require.NoError(t, err)
	return pool, in
}

// received builds a message as a broker subscriber hands it out: with a
// Delivery naming its topic.
func received(topic, key, eventType, payload string) *message.Message {
	msg := message.NewMessage(watermill.NewUUID(), []byte(payload))
	if key != "" {
		bus.SetPartitionKey(msg, key)
	}
	if eventType != "" {
		bus.SetEventType(msg, eventType)
	}
	msg.SetContext(bus.WithDelivery(context.Background(), bus.Delivery{Source: "stream:" + topic, Topic: topic}))
	return msg
}

type inboxRowState struct {
	messageID, group, topic, status string
	eventID, key, eventType         *string
	payload                         string
	metadata                        map[string]string
	maxAttempts                     int
}

func inboxRows(t *testing.T, pool *pgxpool.Pool, in *Inbox) []inboxRowState {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT message_id, consumer_group, topic, status, event_id::text, partition_key,
		event_type, payload, metadata, max_attempts FROM `+in.q.table.quoted()+` ORDER BY id`)
	require.NoError(t, err)
	var out []inboxRowState
	for rows.Next() {
		var (
			s  inboxRowState
			pl []byte
		)
		require.NoError(t, rows.Scan(&s.messageID, &s.group, &s.topic, &s.status, &s.eventID, &s.key, &s.eventType, &pl, &s.metadata, &s.maxAttempts))
		s.payload = string(pl)
		out = append(out, s)
	}
	require.NoError(t, rows.Err())
	return out
}

func TestInbox_StoreReportsWhichMessagesWereNew(t *testing.T) {
	t.Parallel()
	pool, in := newInbox(t)
	ctx := context.Background()
	a := received("orders", "order-1", "order.created", `{"n":1}`)
	b := received("orders", "order-1", "order.paid", `{"n":2}`)
	fresh, err := in.Store(ctx, pool, "billing", a, b)
	require.NoError(t, err)
	assert.Equal(t, []bool{true, true}, fresh)

	c := received("orders", "order-2", "order.created", `{"n":3}`)
	fresh, err = in.Store(ctx, pool, "billing", b, c, c, a)
	require.NoError(t, err)
	assert.Equal(t, []bool{false, true, false, false}, fresh,
		"stored ids are not new; a repeat within one call is new only the first time")

	rows := inboxRows(t, pool, in)
	require.Len(t, rows, 3)
	assert.Equal(t, a.UUID, rows[0].messageID)
	assert.Equal(t, "billing", rows[0].group)
	assert.Equal(t, "orders", rows[0].topic, "the source topic comes from the Delivery")
	assert.Equal(t, "pending", rows[0].status)
	require.NotNil(t, rows[0].eventID)
	assert.Equal(t, a.UUID, *rows[0].eventID)
	require.NotNil(t, rows[0].key)
	assert.Equal(t, "order-1", *rows[0].key)
	require.NotNil(t, rows[0].eventType)
	assert.Equal(t, "order.created", *rows[0].eventType)
	assert.Equal(t, `{"n":1}`, rows[0].payload)
	assert.Equal(t, "order-1", rows[0].metadata[bus.KeyPartitionKey], "metadata is kept as received")
	assert.Equal(t, DefaultMaxAttempts, rows[0].maxAttempts)
	assert.Equal(t, []string{a.UUID, b.UUID, c.UUID}, []string{rows[0].messageID, rows[1].messageID, rows[2].messageID},
		"rows are stored in the order given: that is their dispatch order per key")
}

func TestInbox_MessageIDIsTheSendersEventID(t *testing.T) {
	t.Parallel()
	pool, in := newInbox(t)
	ctx := context.Background()

	// The same event relayed twice by the sender's outbox arrives as two
	// broker messages with different UUIDs but one event_id.
	first := received("orders", "", "", "x")
	first.Metadata.Set(bus.KeyEventID, "evt-42")
	second := received("orders", "", "", "x")
	second.Metadata.Set(bus.KeyEventID, "evt-42")
	fresh, err := in.Store(ctx, pool, "g", first, second)
	require.NoError(t, err)
	assert.Equal(t, []bool{true, false}, fresh)

	// A message whose UUID is not a UUID is stored under it; its event_id
	// column is NULL and the id travels in the metadata instead.
	odd := received("orders", "", "", "y")
	odd.UUID = "not-a-uuid"
	fresh, err = in.Store(ctx, pool, "g", odd)
	require.NoError(t, err)
	assert.Equal(t, []bool{true}, fresh)

	rows := inboxRows(t, pool, in)
	require.Len(t, rows, 2)
	assert.Equal(t, "evt-42", rows[0].messageID)
	require.NotNil(t, rows[0].eventID)
	assert.Equal(t, first.UUID, *rows[0].eventID, "event_id is the message UUID")
	assert.Equal(t, "not-a-uuid", rows[1].messageID)
	assert.Nil(t, rows[1].eventID)
	assert.Equal(t, "not-a-uuid", rows[1].metadata[bus.KeyEventID])
}

func TestInbox_ConsumerGroupsStoreIndependently(t *testing.T) {
	t.Parallel()
	pool, in := newInbox(t)
	ctx := context.Background()
	msg := received("orders", "k", "", "x")
	for _, g := range []string{"billing", "shipping"} {
		fresh, err := in.Store(ctx, pool, g, msg)
		require.NoError(t, err)
		assert.Equal(t, []bool{true}, fresh, "group %s", g)
		fresh, err = in.Store(ctx, pool, g, msg)
		require.NoError(t, err)
		assert.Equal(t, []bool{false}, fresh, "group %s again", g)
	}
	assert.Len(t, inboxRows(t, pool, in), 2)
}

func TestInbox_TopicFromDeliveryOrExplicit(t *testing.T) {
	t.Parallel()
	pool, in := newInbox(t)
	ctx := context.Background()

	bare := message.NewMessage(watermill.NewUUID(), []byte("x"))
	_, err := in.Store(ctx, pool, "g", bare)
	var inv *InvalidMessageError
	require.ErrorAs(t, err, &inv, "a message without a Delivery has no source topic")
	assert.Equal(t, "topic", inv.Field)

	fresh, err := in.StoreWith(ctx, pool, StoreOptions{Group: "g", Topic: "payments"}, bare)
	require.NoError(t, err)
	assert.Equal(t, []bool{true}, fresh)

	// Transports that name only a Source (Kafka: the topic) are covered too.
	src := message.NewMessage(watermill.NewUUID(), []byte("y"))
	src.SetContext(bus.WithDelivery(context.Background(), bus.Delivery{Source: "invoices"}))
	_, err = in.Store(ctx, pool, "g", src)
	require.NoError(t, err)

	rows := inboxRows(t, pool, in)
	require.Len(t, rows, 2)
	assert.Equal(t, "payments", rows[0].topic)
	assert.Equal(t, "invoices", rows[1].topic)
}

func TestInbox_InvalidMessageWritesNothing(t *testing.T) {
	t.Parallel()
	pool, in := newInbox(t)
	small, err := NewInbox(InboxConfig{Table: in.Table(), MaxPayloadBytes: 4, MaxMetadataBytes: 200})
	require.NoError(t, err)
	for _, tc := range []struct {
		name  string
		field string
		edit  func(m *message.Message)
	}{
		{"payload too big", "Payload", func(m *message.Message) { m.Payload = []byte("12345") }},
		{"metadata too big", "Metadata", func(m *message.Message) { m.Metadata.Set("big", strings.Repeat("x", 300)) }},
		{"NUL in metadata", "Metadata", func(m *message.Message) { m.Metadata.Set("k", "a\x00b") }},
		{"invalid UTF-8 key", "Metadata", func(m *message.Message) { m.Metadata.Set(bus.KeyPartitionKey, "\xff") }},
		{"bad max attempts", MetaMaxAttempts, func(m *message.Message) { m.Metadata.Set(MetaMaxAttempts, "0") }},
		{"empty id", "event id", func(m *message.Message) { m.UUID = "" }},
		{"id too long", "event id", func(m *message.Message) { m.Metadata.Set(bus.KeyEventID, strings.Repeat("i", MaxMessageIDBytes+1)) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			good := received("orders", "k", "", "ok")
			bad := received("orders", "k", "", "bad")
			tc.edit(bad)
			_, err := small.Store(context.Background(), pool, "g", good, bad)
			var inv *InvalidMessageError
			require.ErrorAs(t, err, &inv)
			assert.Equal(t, tc.field, inv.Field, "error: %v", err)
			assert.ErrorAs(t, small.Check(bad, ""), &inv, "Check refuses what Store refuses")
			assert.NoError(t, small.Check(good, ""))
		})
	}
	assert.Empty(t, inboxRows(t, pool, in), "nothing of a refused call is written")

	_, err = in.Store(context.Background(), pool, "", received("orders", "", "", "x"))
	assert.Error(t, err, "a consumer group is required")
}

// StoreChecked stores what CheckMessage made ready as StoreWith stores the
// messages: each with the topic it was checked with, deduplicated the same
// way. A message another Inbox checked is checked again against this one's
// limits, so a larger limit elsewhere lets nothing through here.
func TestInbox_StoreCheckedStoresWhatStoreWithWould(t *testing.T) {
	t.Parallel()
	pool, in := newInbox(t)
	ctx := context.Background()
	a := received("orders", "order-1", "order.created", `{"n":1}`)
	bare := message.NewMessage(watermill.NewUUID(), []byte("x")) // no Delivery: the topic is given
	ca, err := in.CheckMessage(a, "")
	require.NoError(t, err)
	cb, err := in.CheckMessage(bare, "payments")
	require.NoError(t, err)
	assert.Same(t, a, ca.Message())
	_, err = in.CheckMessage(message.NewMessage(watermill.NewUUID(), []byte("y")), "")
	var inv *InvalidMessageError
	require.ErrorAs(t, err, &inv, "CheckMessage refuses what Check refuses")
	assert.Equal(t, "topic", inv.Field)

	fresh, err := in.StoreChecked(ctx, pool, StoreOptions{Group: "g", Topic: "ignored"}, ca, cb, ca)
	require.NoError(t, err)
	assert.Equal(t, []bool{true, true, false}, fresh, "a repeat within one call is new only the first time")
	fresh, err = in.StoreWith(ctx, pool, StoreOptions{Group: "g"}, a)
	require.NoError(t, err)
	assert.Equal(t, []bool{false}, fresh, "a message stored checked is a duplicate for StoreWith")
	rows := inboxRows(t, pool, in)
	require.Len(t, rows, 2)
	assert.Equal(t, []string{"orders", "payments"}, []string{rows[0].topic, rows[1].topic}, "each keeps the topic it was checked with")
	assert.Equal(t, "order-1", *rows[0].key)
	assert.Equal(t, "order.created", *rows[0].eventType)
	assert.Equal(t, "order-1", rows[0].metadata[bus.KeyPartitionKey])

	small, err := NewInbox(InboxConfig{Table: in.Table(), MaxPayloadBytes: 4})
	require.NoError(t, err)
	big := received("orders", "k", "", "12345")
	cbig, err := in.CheckMessage(big, "")
	require.NoError(t, err)
	_, err = small.StoreChecked(ctx, pool, StoreOptions{Group: "g"}, cbig)
	require.ErrorAs(t, err, &inv, "checked by an Inbox with a larger limit, refused by this one")
	assert.Equal(t, "Payload", inv.Field)
	_, err = in.StoreChecked(ctx, pool, StoreOptions{Group: "g"}, nil)
	assert.ErrorContains(t, err, "message 0 is nil")
	_, err = in.StoreChecked(ctx, pool, StoreOptions{}, ca)
	assert.ErrorContains(t, err, "consumer group")
	assert.Len(t, inboxRows(t, pool, in), 2, "nothing of a refused call is written")
}

func TestInbox_MaxAttemptsFromConfigAndMessage(t *testing.T) {
	t.Parallel()
	pool, in := newInbox(t)
	three, err := NewInbox(InboxConfig{Table: in.Table(), MaxAttempts: 3})
	require.NoError(t, err)
	a := received("orders", "", "", "a")
	b := received("orders", "", "", "b")
	SetMaxAttempts(b, 9)
	_, err = three.Store(context.Background(), pool, "g", a, b)
	require.NoError(t, err)
	rows := inboxRows(t, pool, in)
	require.Len(t, rows, 2)
	assert.Equal(t, 3, rows[0].maxAttempts)
	assert.Equal(t, 9, rows[1].maxAttempts)
	assert.NotContains(t, rows[1].metadata, MetaMaxAttempts, "the option steers the inbox and is not stored")
}

func TestInbox_StoreInARolledBackTransactionLeavesNothing(t *testing.T) {
	t.Parallel()
	pool, in := newInbox(t)
	ctx := context.Background()
	msg := received("orders", "k", "", "x")
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	fresh, err := in.Store(ctx, tx, "g", msg)
	require.NoError(t, err)
	assert.Equal(t, []bool{true}, fresh)
	require.NoError(t, tx.Rollback(ctx))
	assert.Empty(t, inboxRows(t, pool, in))

	fresh, err = in.Store(ctx, pool, "g", msg)
	require.NoError(t, err)
	assert.Equal(t, []bool{true}, fresh, "after the rollback the message is new again")
}

func TestInbox_CompletedRowsAreNeverDispatchedAndMakeNoLane(t *testing.T) {
	t.Parallel()
	pool, in := newInbox(t)
	ctx := context.Background()
	msg := received("orders", "k", "", "x")
	fresh, err := in.StoreWith(ctx, pool, StoreOptions{Group: "g", Completed: true}, msg)
	require.NoError(t, err)
	assert.Equal(t, []bool{true}, fresh)
	fresh, err = in.Store(ctx, pool, "g", msg)
	require.NoError(t, err)
	assert.Equal(t, []bool{false}, fresh, "a completed row still deduplicates")

	rows := inboxRows(t, pool, in)
	require.Len(t, rows, 1)
	assert.Equal(t, "completed", rows[0].status)
	var lanes int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+in.q.table.derived("_lanes").quoted()).Scan(&lanes))
	assert.Zero(t, lanes)

	require.NoError(t, in.Remove(ctx, pool, "g", msg))
	assert.Empty(t, inboxRows(t, pool, in))
}

// inboxSubscriber subscribes to the group's rows of in.
func inboxSubscriber(t *testing.T, pool *pgxpool.Pool, in *Inbox, group string) (*Subscriber, <-chan *message.Message) {
	t.Helper()
	sub, err := NewSubscriber(pool, SubscriberConfig{
		Table: in.Table(), Kind: KindInbox, ConsumerGroup: group, PollInterval: 20 * time.Millisecond,
	}, nil)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() {
		cancel()
		require.NoError(t, sub.Close())
	})
	ch, err := sub.Subscribe(ctx, AllTopics)
	require.NoError(t, err)
	return sub, ch
}

func next(t *testing.T, ch <-chan *message.Message) *message.Message {
	t.Helper()
	select {
	case m := <-ch:
		require.NotNil(t, m, "subscription closed")
		return m
	case <-time.After(10 * time.Second):
		t.Fatal("no message within 10s")
		return nil
	}
}

func statusOf(t *testing.T, pool *pgxpool.Pool, in *Inbox, messageID, group string) (status string, lockedBy *string) {
	t.Helper()
	require.NoError(t, pool.QueryRow(context.Background(),
		`SELECT status, locked_by FROM `+in.q.table.quoted()+` WHERE message_id = $1 AND consumer_group = $2`,
		messageID, group).Scan(&status, &lockedBy))
	return status, lockedBy
}

func TestSubscriber_InboxDeliversOneGroupsRowsWithTheirIDs(t *testing.T) {
	t.Parallel()
	pool, in := newInbox(t)
	ctx := context.Background()
	a := received("orders", "k", "order.created", "a")
	odd := received("orders", "k", "order.paid", "b")
	odd.UUID = "evt-odd"
	_, err := in.Store(ctx, pool, "billing", a, odd)
	require.NoError(t, err)
	_, err = in.Store(ctx, pool, "shipping", received("orders", "k", "", "other group"))
	require.NoError(t, err)

	_, ch := inboxSubscriber(t, pool, in, "billing")
	m := next(t, ch)
	assert.Equal(t, "a", string(m.Payload))
	assert.Equal(t, a.UUID, m.UUID)
	assert.Equal(t, "order.created", bus.EventType(m))
	d, ok := bus.DeliveryOf(m)
	require.True(t, ok)
	assert.Equal(t, "orders", d.Topic)
	m.Ack()
	m = next(t, ch)
	assert.Equal(t, "b", string(m.Payload))
	assert.Equal(t, "evt-odd", bus.EventID(m), "a non-UUID message id survives the round trip")
	assert.Equal(t, "evt-odd", m.UUID, "and is the delivered message's UUID")
	m.Ack()
	select {
	case m := <-ch:
		t.Fatalf("got %q of another group", m.Payload)
	case <-time.After(200 * time.Millisecond):
	}
}

func TestSubscriber_CompleteInTxCommitsWithTheEffect(t *testing.T) {
	t.Parallel()
	pool, in := newInbox(t)
	ctx := context.Background()
	effects := testenv.Name(t) + "_fx"
	_, err := pool.Exec(ctx, `CREATE TABLE `+pgx.Identifier{effects}.Sanitize()+` (note text)`)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), `DROP TABLE IF EXISTS `+pgx.Identifier{effects}.Sanitize())
	})

	first := received("orders", "k", "", "first")
	second := received("orders", "k", "", "second")
	_, err = in.Store(ctx, pool, "g", first, second)
	require.NoError(t, err)
	sub, ch := inboxSubscriber(t, pool, in, "g")

	// Rolled back: the completion goes with the effect; the row is still
	// ours and is settled by the nack.
	m := next(t, ch)
	require.Equal(t, "first", string(m.Payload))
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `INSERT INTO `+pgx.Identifier{effects}.Sanitize()+` VALUES ('rolled back')`)
	require.NoError(t, err)
	require.NoError(t, sub.CompleteInTx(ctx, tx, m))
	require.NoError(t, tx.Rollback(ctx))
	status, lockedBy := statusOf(t, pool, in, first.UUID, "g")
	assert.Equal(t, "pending", status)
	assert.Nil(t, lockedBy, "a keyed row is covered by its lane's lease, not written to")
	var runBy *string
	require.NoError(t, pool.QueryRow(ctx, `SELECT run_by FROM `+in.q.table.derived("_lanes").quoted()+`
WHERE consumer_group = 'g' AND partition_key = 'k'`).Scan(&runBy))
	require.NotNil(t, runBy, "still out in the lane's run after the rollback")
	assert.Equal(t, sub.eng.worker, *runBy)
	m.Nack()

	// Committed: effect and completion together; the later ack is a no-op.
	m = next(t, ch)
	require.Equal(t, "first", string(m.Payload), "the nacked head comes back before its successor")
	tx, err = pool.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `INSERT INTO `+pgx.Identifier{effects}.Sanitize()+` VALUES ('committed')`)
	require.NoError(t, err)
	require.NoError(t, sub.CompleteInTx(ctx, tx, m))
	require.NoError(t, tx.Commit(ctx))
	status, lockedBy = statusOf(t, pool, in, first.UUID, "g")
	assert.Equal(t, "completed", status)
	assert.Nil(t, lockedBy)
	m.Ack()

	m = next(t, ch)
	assert.Equal(t, "second", string(m.Payload), "the key moves on after a completion in a transaction")
	m.Ack()
	testenv.Eventually(t, 10*time.Second, func() bool {
		s, _ := statusOf(t, pool, in, second.UUID, "g")
		return s == "completed"
	}, "second completed")
	var notes []string
	rows, err := pool.Query(ctx, `SELECT note FROM `+pgx.Identifier{effects}.Sanitize())
	require.NoError(t, err)
	notes, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	assert.Equal(t, []string{"committed"}, notes)
	var attempts int
	require.NoError(t, pool.QueryRow(ctx, `SELECT attempts FROM `+in.q.table.quoted()+` WHERE message_id = $1`, first.UUID).Scan(&attempts))
	assert.Equal(t, 1, attempts, "the nack after the rollback counted one attempt")
}

func TestSubscriber_CompleteInTxFailsWhenTheLeaseWasLost(t *testing.T) {
	t.Parallel()
	pool, in := newInbox(t)
	ctx := context.Background()
	msg := received("orders", "k", "", "x")
	_, err := in.Store(ctx, pool, "g", msg)
	require.NoError(t, err)
	sub, ch := inboxSubscriber(t, pool, in, "g")
	m := next(t, ch)

	// Another worker took the row over.
	_, err = pool.Exec(ctx, `UPDATE `+in.q.table.quoted()+` SET locked_by = 'someone-else'`)
	require.NoError(t, err)
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	err = sub.CompleteInTx(ctx, tx, m)
	require.ErrorIs(t, err, ErrLeaseLost)
	require.NoError(t, tx.Rollback(ctx))
	m.Nack()
	status, lockedBy := statusOf(t, pool, in, msg.UUID, "g")
	assert.Equal(t, "pending", status)
	require.NotNil(t, lockedBy)
	assert.Equal(t, "someone-else", *lockedBy, "the other worker's lease is untouched")

	foreign := received("orders", "k", "", "y")
	assert.Error(t, sub.CompleteInTx(ctx, tx, foreign), "a message of another source is refused")
}

func TestTxFromContext(t *testing.T) {
	t.Parallel()
	_, ok := TxFromContext(context.Background())
	assert.False(t, ok)
	pool := testenv.Postgres(t)
	tx, err := pool.Begin(context.Background())
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.Background()) }()
	got, ok := TxFromContext(WithTx(context.Background(), tx))
	require.True(t, ok)
	assert.Same(t, tx, got)
	_, ok = TxFromContext(WithTx(context.Background(), nil))
	assert.False(t, ok, "a nil tx is no tx")
	assert.True(t, errors.Is(fmt.Errorf("x: %w", ErrLeaseLost), ErrLeaseLost))
}

type storeRecorder struct{ got []StoreInfo }

func (r *storeRecorder) ObserveStore(s StoreInfo) { r.got = append(r.got, s) }

func TestInbox_ObserverCountsNewAndDuplicates(t *testing.T) {
	t.Parallel()
	pool, in := newInbox(t)
	rec := &storeRecorder{}
	obs, err := NewInbox(InboxConfig{Table: in.Table(), Observer: rec})
	require.NoError(t, err)
	a, b := received("orders", "", "", "a"), received("orders", "", "", "b")
	_, err = obs.Store(context.Background(), pool, "g", a, b)
	require.NoError(t, err)
	_, err = obs.Store(context.Background(), pool, "g", a, b, received("orders", "", "", "c"))
	require.NoError(t, err)
	assert.Equal(t, []StoreInfo{
		{Table: in.Table(), ConsumerGroup: "g", New: 2},
		{Table: in.Table(), ConsumerGroup: "g", New: 1, Duplicates: 2},
	}, rec.got)
}
