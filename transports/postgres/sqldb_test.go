package postgres

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/omnibus-go/omnibus/bus"
)

// sqlDB is database/sql over the test's pool (pgx's stdlib driver).
func sqlDB(t *testing.T, pool *pgxpool.Pool) *sql.DB {
	t.Helper()
	db := stdlib.OpenDBFromPool(pool)
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// awkwardEvents are events whose every column holds what an array literal
// must escape: quotes, backslashes, commas, braces, the word NULL, blanks,
// all 256 byte values, an empty payload, a missing key.
func awkwardEvents() []*message.Message {
	var all []byte
	for b := range 256 {
		all = append(all, byte(b))
	}
	keys := []string{`say "hi"`, `back\slash`, `a,b`, `{braces}`, `NULL`, ` padded `, `ключ`, ``}
	out := make([]*message.Message, 0, len(keys))
	for i, k := range keys {
		msg := event(k, fmt.Sprintf(`{"n":%d,"quote":"\"","bs":"\\"}`, i))
		bus.SetEventType(msg, fmt.Sprintf(`type "%d" \ ,{}`, i))
		msg.Metadata.Set(`meta "key"`, `value \ with , "all" {}`)
		switch i {
		case 1:
			msg.Payload = all
		case 2:
			msg.Payload = nil
		case 3:
			SetDeliverAt(msg, time.Date(2026, 12, 5, 8, 30, 15, 123456789, time.FixedZone("x", 3600)))
		case 4:
			SetMaxAttempts(msg, 3)
		}
		out = append(out, msg)
	}
	return out
}

// storedRows reads every column Enqueue writes, in insertion order
// (scheduled_at as NULL when it is the insertion time).
func storedRows(t *testing.T, pool *pgxpool.Pool, ob *Outbox) []string {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT event_id, topic, partition_key, event_type, payload, metadata, max_attempts, CASE WHEN scheduled_at = created_at THEN NULL ELSE scheduled_at END, status, attempts FROM `+ob.q.table.quoted()+` ORDER BY id`)
	require.NoError(t, err)
	defer rows.Close()
	var out []string
	for rows.Next() {
		vals, err := rows.Values()
		require.NoError(t, err)
		out = append(out, fmt.Sprintf("%#v", vals))
	}
	require.NoError(t, rows.Err())
	return out
}

func TestEnqueueSQL_StoresExactlyWhatEnqueueStores(t *testing.T) {
	t.Parallel()
	pool, viaPgx := newOutbox(t)
	_, viaSQL := newOutbox(t)
	ctx := context.Background()
	events := awkwardEvents()
	require.NoError(t, viaPgx.Enqueue(ctx, pool, "orders", events...))

	db := sqlDB(t, pool)
	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	require.NoError(t, viaSQL.EnqueueSQL(ctx, tx, "orders", awkwardEventsWithIDs(events)...))
	require.NoError(t, tx.Commit())

	want := storedRows(t, pool, viaPgx)
	require.Len(t, want, len(events))
	assert.Equal(t, want, storedRows(t, pool, viaSQL))
}

// awkwardEventsWithIDs copies events (a message is enqueued once per call).
func awkwardEventsWithIDs(events []*message.Message) []*message.Message {
	out := make([]*message.Message, len(events))
	for i, e := range events {
		out[i] = e.Copy()
	}
	return out
}

func TestEnqueueSQL_CommitsAndRollsBackWithTheCallersTransaction(t *testing.T) {
	t.Parallel()
	pool, ob := newOutbox(t)
	db := sqlDB(t, pool)
	ctx := context.Background()
	count := func() int {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+ob.q.table.quoted()).Scan(&n))
		return n
	}

	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	require.NoError(t, ob.EnqueueSQL(ctx, tx, "orders", event("k", "rolled back")))
	require.NoError(t, tx.Rollback())
	assert.Zero(t, count(), "a rollback leaves nothing")

	tx, err = db.BeginTx(ctx, nil)
	require.NoError(t, err)
	first := event("k", "committed")
	require.NoError(t, ob.SQLPublisher(tx).Publish("orders", first))
	require.NoError(t, ob.EnqueueSQL(ctx, tx, "orders", first.Copy()), "an event already enqueued is skipped")
	var one int
	require.NoError(t, tx.QueryRowContext(ctx, `SELECT 1`).Scan(&one), "and the transaction goes on")
	require.NoError(t, tx.Commit())
	assert.Equal(t, 1, count())
}

func TestEnqueueSQL_RefusesBadInputLikeEnqueueAndKeepsTheTransaction(t *testing.T) {
	t.Parallel()
	pool, ob := newOutbox(t)
	db := sqlDB(t, pool)
	ctx := context.Background()
	for _, c := range []struct {
		name, field, topic string
		edit               func(*message.Message)
	}{
		{"topic with NUL", "topic", "or\x00ders", nil},
		{"not a UUID", "UUID", "t", func(m *message.Message) { m.UUID = "order-1" }},
		{"partition key with NUL", bus.KeyPartitionKey, "t", func(m *message.Message) { bus.SetPartitionKey(m, "k\x00") }},
		{"metadata value not UTF-8", "Metadata", "t", func(m *message.Message) { m.Metadata.Set("note", "caf\xe9") }},
		{"payload too large", "Payload", "t", func(m *message.Message) { m.Payload = []byte(strings.Repeat("x", DefaultMaxPayloadBytes+1)) }},
		{"attempts out of range", MetaMaxAttempts, "t", func(m *message.Message) { m.Metadata.Set(MetaMaxAttempts, "0") }},
	} {
		t.Run(c.name, func(t *testing.T) {
			msg := event("", "payload")
			if c.edit != nil {
				c.edit(msg)
			}
			tx, err := db.BeginTx(ctx, nil)
			require.NoError(t, err)
			defer func() { _ = tx.Rollback() }()
			err = ob.EnqueueSQL(ctx, tx, c.topic, event("ok", "fine"), msg)
			var invalid *InvalidMessageError
			require.ErrorAs(t, err, &invalid, "want an InvalidMessageError, got %v", err)
			assert.Equal(t, c.field, invalid.Field)
			var one int
			require.NoError(t, tx.QueryRowContext(ctx, `SELECT 1`).Scan(&one), "the caller's transaction is not aborted")
			require.NoError(t, tx.Commit())
			var n int
			require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+ob.q.table.quoted()).Scan(&n))
			assert.Zero(t, n, "nothing of a refused batch is written")
		})
	}
}

func TestEnqueueSQL_StoresTheCallersTraceContext(t *testing.T) {
	t.Parallel()
	pool, ob := newOutbox(t)
	tp := sdktrace.NewTracerProvider()
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	ctx, span := tp.Tracer("test").Start(context.Background(), "place order")
	defer span.End()
	require.NoError(t, ob.EnqueueSQL(ctx, sqlDB(t, pool), "t", event("k", "traced")))

	var raw []byte
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT metadata FROM `+ob.q.table.quoted()).Scan(&raw))
	var meta map[string]string
	require.NoError(t, json.Unmarshal(raw, &meta))
	sc := span.SpanContext()
	assert.Equal(t, "00-"+sc.TraceID().String()+"-"+sc.SpanID().String()+"-01", meta[bus.KeyTraceparent])
}
