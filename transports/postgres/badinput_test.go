package postgres

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/internal/testenv"
)

// badFailures are handler failures whose settlement PostgreSQL cannot store
// as given: a NUL byte in the error text (22021), invalid UTF-8 (22021), a
// retry time past what timestamptz holds (22008). Every other row is acked.
// The failures retry in an hour, so each row is delivered once here.
var badFailures = map[string]bus.Settlement{
	"nul":  {Class: bus.ClassCounted, Error: "boom\x00 after a NUL", RetryAt: time.Now().Add(time.Hour)},
	"utf8": {Class: bus.ClassCounted, Error: "bad \xff\xfe bytes", RetryAt: time.Now().Add(time.Hour)},
	"far":  {Class: bus.ClassCounted, Error: "see you later", RetryAt: time.Date(300000, 1, 1, 0, 0, 0, 0, time.UTC)},
}

// settleBadFailures subscribes to the table, fails the rows named in
// badFailures once each with their settlement, acks every other row, and
// waits until every row is settled. The lease is long: a row whose
// settlement was not written would come back only after it.
func settleBadFailures(t *testing.T, pool *pgxpool.Pool, cfg SubscriberConfig, rows int) {
	t.Helper()
	cfg.Lease = 5 * time.Minute
	s, err := NewSubscriber(pool, cfg, nil)
	require.NoError(t, err)
	defer s.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := s.Subscribe(ctx, AllTopics)
	require.NoError(t, err)
	failed := map[string]bool{}
	settledAll := make(chan struct{})
	go func() {
		seen := 0
		for m := range ch {
			p := string(m.Payload)
			if st, ok := badFailures[p]; ok && !failed[p] {
				failed[p] = true
				bus.Settle(m, st)
				m.Nack()
			} else {
				m.Ack()
			}
			if seen++; seen == rows {
				close(settledAll)
			}
		}
	}()
	select {
	case <-settledAll:
	case <-time.After(30 * time.Second):
		t.Fatalf("not every row was delivered")
	}
	testenv.Eventually(t, 15*time.Second, func() bool {
		var open int
		require.NoError(t, pool.QueryRow(ctx, fmt.Sprintf(
			`SELECT count(*) FROM %s WHERE locked_by IS NOT NULL OR (status = 'pending' AND attempts = 0)`,
			quoteIdent(cfg.Table))).Scan(&open))
		return open == 0
	}, "every settlement written (acks next to failures PostgreSQL cannot store as given)")
}

// checkBadFailuresStored asserts what was stored for each bad failure: one
// attempt, an error text that is valid UTF-8 without NUL, a retry time
// PostgreSQL holds.
func checkBadFailuresStored(t *testing.T, pool *pgxpool.Pool, table string) {
	t.Helper()
	for p := range badFailures {
		var (
			status    string
			attempts  int
			lastError string
			scheduled time.Time
		)
		require.NoError(t, pool.QueryRow(context.Background(), fmt.Sprintf(
			`SELECT status, attempts, last_error, scheduled_at FROM %s WHERE payload = $1::bytea`, quoteIdent(table)),
			[]byte(p)).Scan(&status, &attempts, &lastError, &scheduled), p)
		assert.Equal(t, "pending", status, p)
		assert.Equal(t, 1, attempts, "%s: the failure is counted once", p)
		assert.True(t, utf8.ValidString(lastError), "%s: stored error text is valid UTF-8: %q", p, lastError)
		assert.NotContains(t, lastError, "\x00", p)
		assert.NotEmpty(t, lastError, p)
		if p == "far" {
			assert.True(t, scheduled.After(time.Now().Add(time.Hour)), "far: the retry stays in the far future, got %s", scheduled)
		}
	}
	assert.Contains(t, lastErrorOf(t, pool, table, "nul"), "boom")
	assert.Contains(t, lastErrorOf(t, pool, table, "nul"), "after a NUL")
}

func lastErrorOf(t *testing.T, pool *pgxpool.Pool, table, payload string) string {
	t.Helper()
	var s string
	require.NoError(t, pool.QueryRow(context.Background(), fmt.Sprintf(
		`SELECT last_error FROM %s WHERE payload = $1::bytea`, quoteIdent(table)), []byte(payload)).Scan(&s))
	return s
}

func badFailureMessages(make func(key, payload string) *message.Message) []*message.Message {
	var msgs []*message.Message
	for _, p := range []string{"ok1", "nul", "ok2", "utf8", "ok3", "far", "ok4"} {
		msgs = append(msgs, make("key-"+p, p))
	}
	return msgs
}

// A failure PostgreSQL cannot store as given (NUL, invalid UTF-8, a retry
// time out of range) must not stop the settlement of every other row.
func TestSettle_BadFailureTextDoesNotStallOtherSettlements(t *testing.T) {
	t.Parallel()
	pool, ob := newOutbox(t)
	msgs := badFailureMessages(event)
	enqueue(t, pool, ob, "t", msgs...)
	settleBadFailures(t, pool, SubscriberConfig{Table: ob.Table()}, len(msgs))
	checkBadFailuresStored(t, pool, ob.Table())
}

// The same over an inbox table.
func TestSettle_InboxBadFailureTextDoesNotStallOtherSettlements(t *testing.T) {
	t.Parallel()
	pool, in := newInbox(t)
	msgs := badFailureMessages(func(key, payload string) *message.Message { return received("orders", key, "", payload) })
	_, err := in.Store(context.Background(), pool, "g", msgs...)
	require.NoError(t, err)
	settleBadFailures(t, pool, SubscriberConfig{Table: in.Table(), Kind: KindInbox, ConsumerGroup: "g"}, len(msgs))
	checkBadFailuresStored(t, pool, in.Table())
}

// A batch that still fails after cleaning (here a trigger refuses one row's
// update, standing in for any error we did not foresee) is split: every
// other row is settled, and the refused failure is stored as a failure the
// row can hold, saying why.
func TestSettle_BatchThatStillFailsIsSplit(t *testing.T) {
	t.Parallel()
	pool, ob := newOutbox(t)
	ctx := context.Background()
	_, err := pool.Exec(ctx, fmt.Sprintf(`
CREATE FUNCTION %[1]s() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.last_error LIKE '%%refuse me%%' THEN RAISE EXCEPTION 'refused by test trigger' USING ERRCODE = '22023'; END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER refuse BEFORE UPDATE ON %[2]s FOR EACH ROW EXECUTE FUNCTION %[1]s();`,
		quoteIdent(ob.Table()+"_refuse"), quoteIdent(ob.Table())))
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = pool.Exec(ctx, `DROP FUNCTION IF EXISTS `+quoteIdent(ob.Table()+"_refuse")+` CASCADE`) })

	var msgs []*message.Message
	for i := range 6 {
		msgs = append(msgs, event(fmt.Sprint("k", i), fmt.Sprint("ok", i)))
	}
	msgs = append(msgs, event("bad", "refused"))
	enqueue(t, pool, ob, "t", msgs...)

	s, err := NewSubscriber(pool, SubscriberConfig{Table: ob.Table(), Lease: 5 * time.Minute}, nil)
	require.NoError(t, err)
	defer s.Close()
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ch, err := s.Subscribe(sctx, AllTopics)
	require.NoError(t, err)
	go func() {
		for m := range ch {
			if string(m.Payload) == "refused" {
				bus.Settle(m, bus.Settlement{Class: bus.ClassCounted, Error: "please refuse me", RetryAt: time.Now().Add(time.Hour)})
				m.Nack()
				continue
			}
			m.Ack()
		}
	}()
	testenv.Eventually(t, 15*time.Second, func() bool {
		var done int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+quoteIdent(ob.Table())+` WHERE status = 'completed'`).Scan(&done))
		return done == 6
	}, "the acks next to a failure the database refuses are written")
	testenv.Eventually(t, 15*time.Second, func() bool {
		// A keyed row is not written to when it is handed out (its lane's
		// lease covers it), so the settlement shows in last_error alone.
		var stored bool
		require.NoError(t, pool.QueryRow(ctx, `SELECT last_error IS NOT NULL FROM `+quoteIdent(ob.Table())+` WHERE payload = 'refused'::bytea`).Scan(&stored))
		return stored
	}, "the refused failure stored in a form the row can hold")
	var (
		attempts  int
		lastError string
	)
	require.NoError(t, pool.QueryRow(ctx, `SELECT attempts, last_error FROM `+quoteIdent(ob.Table())+` WHERE payload = 'refused'::bytea`).Scan(&attempts, &lastError))
	assert.Equal(t, 1, attempts, "the failure is still counted")
	assert.Contains(t, lastError, "could not be stored", "last_error says the settlement was refused")
	assert.Contains(t, lastError, "22023", "last_error names the database's refusal")
	var retryIn time.Duration
	require.NoError(t, pool.QueryRow(ctx, `SELECT scheduled_at - now() FROM `+quoteIdent(ob.Table())+` WHERE payload = 'refused'::bytea`).Scan(&retryIn))
	assert.Greater(t, retryIn, 30*time.Minute, "the failure's retry time is kept: the row is not due at once")
}

// Enqueue checks text the way the inbox does: a NUL byte or invalid UTF-8
// in any text the outbox stores is an InvalidMessageError naming the field,
// before any SQL runs, so the caller's transaction stays usable and nothing
// is stored altered.
func TestEnqueue_TextPostgreSQLCannotStoreIsRefusedByField(t *testing.T) {
	t.Parallel()
	pool, ob := newOutbox(t)
	ctx := context.Background()
	cases := []struct {
		name, field, topic string
		edit               func(*message.Message)
	}{
		{"topic with NUL", "topic", "or\x00ders", nil},
		{"topic not UTF-8", "topic", "or\xffders", nil},
		{"topic with a control character", "topic", "ord\x01ers", nil},
		{"topic with a zero-width space", "topic", "ord\u200bers", nil},
		{"topic too long", "topic", strings.Repeat("t", bus.MaxTopicLength+1), nil},
		{"partition key with NUL", bus.KeyPartitionKey, "t", func(m *message.Message) { bus.SetPartitionKey(m, "k\x00") }},
		{"partition key not UTF-8", bus.KeyPartitionKey, "t", func(m *message.Message) { bus.SetPartitionKey(m, "k\xc3") }},
		{"event type with NUL", bus.KeyEventType, "t", func(m *message.Message) { bus.SetEventType(m, "order\x00paid") }},
		{"event type not UTF-8", bus.KeyEventType, "t", func(m *message.Message) { bus.SetEventType(m, "order\xffpaid") }},
		{"metadata key with NUL", "Metadata", "t", func(m *message.Message) { m.Metadata.Set("a\x00b", "v") }},
		{"metadata key not UTF-8", "Metadata", "t", func(m *message.Message) { m.Metadata.Set("a\xffb", "v") }},
		{"metadata value with NUL", "Metadata", "t", func(m *message.Message) { m.Metadata.Set("note", "v\x00") }},
		{"metadata value not UTF-8", "Metadata", "t", func(m *message.Message) { m.Metadata.Set("note", "caf\xe9") }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			msg := event("", "payload")
			if c.edit != nil {
				c.edit(msg)
			}
			tx, err := pool.Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = tx.Rollback(ctx) }()
			err = ob.Enqueue(ctx, tx, c.topic, event("ok", "fine"), msg)
			var invalid *InvalidMessageError
			require.ErrorAs(t, err, &invalid, "want an InvalidMessageError, got %v", err)
			assert.Equal(t, c.field, invalid.Field)
			if c.field == "topic" {
				assert.ErrorIs(t, err, bus.ErrInvalidTopic)
			}
			var one int
			require.NoError(t, tx.QueryRow(ctx, `SELECT 1`).Scan(&one), "the caller's transaction is not aborted")
			require.NoError(t, tx.Commit(ctx))
			var n int
			require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+quoteIdent(ob.Table())).Scan(&n))
			assert.Zero(t, n, "nothing of a refused batch is written")
		})
	}
}

// Over an inbox table too, a row whose lease expired max_attempts times
// without a settlement (its handler killed the process each time) is failed
// by the next fetch, saying so, instead of being handed out again.
func TestInbox_RowWhoseLeaseExpiredMaxAttemptsTimesFails(t *testing.T) {
	t.Parallel()
	pool, in := newInbox(t)
	ctx := context.Background()
	killer := received("orders", "k", "", "killer")
	SetMaxAttempts(killer, 3)
	_, err := in.Store(ctx, pool, "g", killer, received("orders", "k", "", "after"))
	require.NoError(t, err)
	e := &engine{pool: pool, q: newQueries(in.q.table, true), worker: "w", group: "g", lease: 30 * time.Second, run: 1}
	expire := func() {
		_, err := pool.Exec(ctx, `UPDATE `+in.q.table.quoted()+` SET locked_until = now() - interval '1 second' WHERE locked_by IS NOT NULL`)
		require.NoError(t, err)
		_, err = pool.Exec(ctx, `UPDATE `+in.q.table.derived("_lanes").quoted()+` SET locked_until = now() - interval '1 second' WHERE locked_by IS NOT NULL`)
		require.NoError(t, err)
	}
	for crash := 1; crash <= 3; crash++ {
		res, err := e.fetch(ctx, AllTopics, 10, 10)
		require.NoError(t, err)
		require.Len(t, res.units, 1, "delivery %d", crash)
		require.Equal(t, "killer", string(res.units[0].rows[0].payload), "delivery %d", crash)
		assert.Equal(t, crash-1, res.units[0].rows[0].attempts, "the delivery reports the attempts spent before it")
		expire() // the process died: nothing is settled, the lease runs out
	}
	res, err := e.fetch(ctx, AllTopics, 10, 10)
	require.NoError(t, err)
	for _, u := range res.units {
		for _, r := range u.rows {
			assert.NotEqual(t, "killer", string(r.payload), "a row whose budget the crashes spent is not handed out again")
		}
	}
	var (
		status, lastError string
		attempts          int
	)
	require.NoError(t, pool.QueryRow(ctx, `SELECT status, attempts, last_error FROM `+in.q.table.quoted()+` WHERE payload = 'killer'::bytea`).
		Scan(&status, &attempts, &lastError))
	assert.Equal(t, "failed", status)
	assert.Equal(t, 3, attempts)
	assert.Contains(t, lastError, "lease expired without a settlement")
}
