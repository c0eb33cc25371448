package datalayers_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"fmt"
	"strings"
	"testing"
	"time"

	"entgo.io/ent/dialect"
	entsql "entgo.io/ent/dialect/sql"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/jmoiron/sqlx"
	_ "github.com/lib/pq"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/uptrace/bun"
	"github.com/uptrace/bun/dialect/pgdialect"
	pgdriver "gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/examples/datalayers/ent/entdb"
	"github.com/omnibus-go/omnibus/internal/testenv"
	"github.com/omnibus-go/omnibus/transports/postgres"
)

// stackTx is a transaction begun on one stack, as its user holds it.
type stackTx struct {
	exec     postgres.SQLExecutor // what the user passes to EnqueueSQL
	usable   func() error         // runs SELECT 1 in the transaction
	commit   func() error
	rollback func() error
}

// stacks begin a transaction on each data layer.
var stacks = map[string]func(t *testing.T) stackTx{
	"database/sql pgx": func(t *testing.T) stackTx { return sqlTx(t, "pgx") },
	"database/sql pq":  func(t *testing.T) stackTx { return sqlTx(t, "postgres") },
	"sqlx": func(t *testing.T) stackTx {
		db, err := sqlx.Open("pgx", testenv.PostgresURL())
		require.NoError(t, err)
		t.Cleanup(func() { _ = db.Close() })
		tx, err := db.BeginTxx(context.Background(), nil)
		require.NoError(t, err)
		return stackTx{exec: tx, usable: func() error { _, err := tx.Exec(`SELECT 1`); return err }, commit: tx.Commit, rollback: tx.Rollback}
	},
	"gorm with prepared statements": func(t *testing.T) stackTx {
		db, err := gorm.Open(pgdriver.Open(testenv.PostgresURL()), &gorm.Config{PrepareStmt: true, Logger: logger.Discard})
		require.NoError(t, err)
		sqlDB, err := db.DB()
		require.NoError(t, err)
		t.Cleanup(func() { _ = sqlDB.Close() })
		tx := db.Begin()
		require.NoError(t, tx.Error)
		return stackTx{
			exec:     tx.Statement.ConnPool,
			usable:   func() error { return tx.Exec(`SELECT 1`).Error },
			commit:   func() error { return tx.Commit().Error },
			rollback: func() error { return tx.Rollback().Error },
		}
	},
	"ent": func(t *testing.T) stackTx {
		sqlDB, err := sql.Open("pgx", testenv.PostgresURL())
		require.NoError(t, err)
		client := entdb.NewClient(entdb.Driver(entsql.OpenDB(dialect.Postgres, sqlDB)))
		t.Cleanup(func() { _ = client.Close() })
		tx, err := client.Tx(context.Background())
		require.NoError(t, err)
		return stackTx{
			exec:     tx,
			usable:   func() error { _, err := tx.ExecContext(context.Background(), `SELECT 1`); return err },
			commit:   tx.Commit,
			rollback: tx.Rollback,
		}
	},
	"bun": func(t *testing.T) stackTx {
		sqlDB, err := sql.Open("pgx", testenv.PostgresURL())
		require.NoError(t, err)
		db := bun.NewDB(sqlDB, pgdialect.New())
		t.Cleanup(func() { _ = db.Close() })
		tx, err := db.BeginTx(context.Background(), nil)
		require.NoError(t, err)
		return stackTx{exec: tx.Tx, usable: func() error { _, err := tx.Exec(`SELECT 1`); return err }, commit: tx.Commit, rollback: tx.Rollback}
	},
}

func sqlTx(t *testing.T, driver string) stackTx {
	db, err := sql.Open(driver, testenv.PostgresURL())
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	tx, err := db.BeginTx(context.Background(), nil)
	require.NoError(t, err)
	return stackTx{exec: tx, usable: func() error { _, err := tx.Exec(`SELECT 1`); return err }, commit: tx.Commit, rollback: tx.Rollback}
}

// newOutbox migrates an outbox table of the test's own.
func newOutbox(t *testing.T, suffix string) (*pgxpool.Pool, *postgres.Outbox) {
	t.Helper()
	pool := testenv.Postgres(t)
	name := strings.ToLower("dl_"+rand.Text()[:10]) + suffix
	require.NoError(t, postgres.Migrate(context.Background(), pool, postgres.OutboxTable(name)))
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), `DROP TABLE IF EXISTS `+pgx.Identifier{name}.Sanitize()+`, `+pgx.Identifier{name + "_lanes"}.Sanitize()+` CASCADE`)
	})
	ob, err := postgres.NewOutbox(postgres.OutboxConfig{Table: name})
	require.NoError(t, err)
	return pool, ob
}

// awkward returns events whose columns hold what text encoding must get
// right: quotes, backslashes, commas, braces, the word NULL, every byte
// value, an empty payload, no key, a deliver-at time.
func awkward() []*message.Message {
	var all []byte
	for b := range 256 {
		all = append(all, byte(b))
	}
	var out []*message.Message
	for i, key := range []string{`say "hi"`, `back\slash`, `a,b`, `{x}`, `NULL`, ``} {
		msg := message.NewMessage(watermill.NewUUID(), fmt.Appendf(nil, `{"n":%d,"s":"\"\\"}`, i))
		if key != "" {
			bus.SetPartitionKey(msg, key)
		}
		bus.SetEventType(msg, `type "`+key+`"`)
		msg.Metadata.Set(`k "`+key+`"`, `v \ `+key)
		switch i {
		case 1:
			msg.Payload = all
		case 2:
			msg.Payload = nil
		case 3:
			postgres.SetDeliverAt(msg, time.Date(2026, 12, 5, 8, 30, 15, 123456789, time.UTC))
		}
		out = append(out, msg)
	}
	return out
}

// stored reads the columns Enqueue writes, in insertion order.
func stored(t *testing.T, pool *pgxpool.Pool, ob *postgres.Outbox) []string {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT event_id, topic, partition_key, event_type, payload, metadata, max_attempts,
		CASE WHEN scheduled_at = created_at THEN NULL ELSE scheduled_at END FROM `+pgx.Identifier{ob.Table()}.Sanitize()+` ORDER BY id`)
	require.NoError(t, err)
	var out []string
	for rows.Next() {
		vals, err := rows.Values()
		require.NoError(t, err)
		out = append(out, fmt.Sprintf("%#v", vals))
	}
	require.NoError(t, rows.Err())
	return out
}

func count(t *testing.T, pool *pgxpool.Pool, ob *postgres.Outbox) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM `+pgx.Identifier{ob.Table()}.Sanitize()).Scan(&n))
	return n
}

func TestEnqueueSQL_FromEveryStack(t *testing.T) {
	t.Parallel()
	for name, begin := range stacks {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()

			t.Run("stores what pgx's Enqueue stores", func(t *testing.T) {
				pool, viaPgx := newOutbox(t, "_pgx")
				_, viaStack := newOutbox(t, "_stack")
				events := awkward()
				copies := make([]*message.Message, len(events))
				for i, e := range events {
					copies[i] = e.Copy()
				}
				require.NoError(t, viaPgx.Enqueue(ctx, pool, "orders", events...))
				tx := begin(t)
				require.NoError(t, viaStack.EnqueueSQL(ctx, tx.exec, "orders", copies...))
				require.NoError(t, tx.commit())
				want := stored(t, pool, viaPgx)
				require.Len(t, want, len(events))
				assert.Equal(t, want, stored(t, pool, viaStack))
			})

			t.Run("a rollback leaves nothing", func(t *testing.T) {
				pool, ob := newOutbox(t, "")
				tx := begin(t)
				require.NoError(t, ob.EnqueueSQL(ctx, tx.exec, "orders", awkward()...))
				require.NoError(t, tx.rollback())
				assert.Zero(t, count(t, pool, ob))
			})

			t.Run("bad input is refused and the transaction goes on", func(t *testing.T) {
				pool, ob := newOutbox(t, "")
				bad := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
				bus.SetPartitionKey(bad, "k\x00")
				tx := begin(t)
				err := ob.EnqueueSQL(ctx, tx.exec, "orders", awkward()[0], bad)
				var invalid *postgres.InvalidMessageError
				require.ErrorAs(t, err, &invalid)
				assert.Equal(t, bus.KeyPartitionKey, invalid.Field)
				assert.Contains(t, err.Error(), "contains a NUL byte")
				require.NoError(t, tx.usable(), "the caller's transaction is not aborted")
				require.NoError(t, tx.commit())
				assert.Zero(t, count(t, pool, ob), "nothing of a refused call is written")
			})
		})
	}
}
