package datalayers_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	pgdriver "gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/internal/testenv"
	"github.com/omnibus-go/omnibus/middleware"
	"github.com/omnibus-go/omnibus/processors"
	"github.com/omnibus-go/omnibus/transports/postgres"
)

// payment is the GORM model a handler writes.
type payment struct {
	EventID string `gorm:"primaryKey"`
	Amount  int
}

type paid struct {
	Amount int `json:"amount"`
}

// A handler whose data layer is GORM does its work in the inbox
// transaction: GORM opened over postgres.SQLTxFromContext. Its first call
// fails after its write; the write is rolled back with it, and the retry's
// write commits together with the completion of the row: one effect.
func TestDispatcher_GORMHandlerHasExactlyOnceEffects(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	name := strings.ToLower("dl_" + rand.Text()[:10])
	require.NoError(t, postgres.Migrate(ctx, pool, postgres.InboxTable(name)))
	_, err := pool.Exec(ctx, `CREATE TABLE `+name+`_payments (event_id text PRIMARY KEY, amount integer NOT NULL)`)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = pool.Exec(ctx, `DROP TABLE IF EXISTS `+pgx.Identifier{name}.Sanitize()+`, `+pgx.Identifier{name + "_lanes"}.Sanitize()+`, `+name+`_payments CASCADE`)
	})
	in, err := postgres.NewInbox(postgres.InboxConfig{Table: name})
	require.NoError(t, err)
	msg := message.NewMessage(watermill.NewUUID(), []byte(`{"amount":4200}`))
	bus.SetPartitionKey(msg, "order-1")
	bus.SetEventType(msg, "order.paid")
	_, err = in.StoreWith(ctx, pool, postgres.StoreOptions{Group: "g", Topic: "orders"}, msg)
	require.NoError(t, err)

	sqlDB, err := sql.Open("pgx", testenv.PostgresURL())
	require.NoError(t, err)
	t.Cleanup(func() { _ = sqlDB.Close() })
	d, err := processors.NewDispatcher(pool, processors.DispatcherConfig{
		Subscriber:    postgres.SubscriberConfig{Table: name, ConsumerGroup: "g", PollInterval: 20 * time.Millisecond},
		Retry:         middleware.RetryConfig{Base: time.Millisecond, Cap: 10 * time.Millisecond},
		Transactional: true,
		SQLDB:         sqlDB,
	}, nil)
	require.NoError(t, err)
	var calls atomic.Int64
	processors.Handle(d, "order.paid", func(ctx context.Context, ev paid, m *message.Message) error {
		tx, ok := postgres.SQLTxFromContext(ctx)
		if !ok {
			return bus.Permanent(errors.New("no database/sql transaction"))
		}
		db, err := gorm.Open(pgdriver.New(pgdriver.Config{Conn: tx}), &gorm.Config{Logger: logger.Discard})
		if err != nil {
			return err
		}
		if err := db.WithContext(ctx).Table(name + "_payments").Create(&payment{EventID: m.UUID, Amount: ev.Amount}).Error; err != nil {
			return err
		}
		if calls.Add(1) == 1 {
			return errors.New("the card network timed out")
		}
		return nil
	})
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- d.Run(runCtx) }()
	t.Cleanup(func() { cancel(); assert.NoError(t, <-done) })

	testenv.Eventually(t, 20*time.Second, func() bool {
		var status string
		_ = pool.QueryRow(ctx, `SELECT status FROM `+pgx.Identifier{name}.Sanitize()+` WHERE message_id = $1`, msg.UUID).Scan(&status)
		return status == "completed"
	}, "the retry completes the row")
	var n, amount int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*), max(amount) FROM `+name+`_payments`).Scan(&n, &amount))
	assert.Equal(t, 1, n, "the failed call's write was rolled back: one effect")
	assert.Equal(t, 4200, amount)
	assert.Equal(t, int64(2), calls.Load())
}
