package postgresbench

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	_ "github.com/lib/pq"
	pgdriver "gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/omnibus-go/omnibus/bench/internal/pgbench"
	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/internal/testenv"
	"github.com/omnibus-go/omnibus/transports/postgres"
)

// enqueueTx is one business transaction of a stack: begin, enqueue msgs,
// commit.
type enqueueTx func(ctx context.Context, ob *postgres.Outbox, msgs []*message.Message) error

// BenchmarkEnqueueStacks is the cost of writing events from each data layer
// (issue 29): transactions of 1 and of 100 events each, one writer, through
// pgx (a pgx.Tx), database/sql on pgx's stdlib driver, database/sql on
// lib/pq, and GORM (PrepareStmt, tx.Statement.ConnPool). Each stack writes
// to a table of its own; the stacks take turns, five rounds (300 transactions of 1 event or 60
// of 100 each), and each
// figure is the median of its rounds. It reports events/s per stack and
// size, and sql-pgx/pgx-100-% and pq/pgx-100-% (target: at least 85).
func BenchmarkEnqueueStacks(b *testing.B) {
	ctx := context.Background()
	pool := pgbench.NewPool(b, 4, nil)
	stdDB := stdlib.OpenDBFromPool(pool)
	b.Cleanup(func() { _ = stdDB.Close() })
	pqDB, err := sql.Open("postgres", testenv.PostgresURL())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = pqDB.Close() })
	gormDB, err := gorm.Open(pgdriver.Open(testenv.PostgresURL()), &gorm.Config{PrepareStmt: true, Logger: logger.Discard})
	if err != nil {
		b.Fatal(err)
	}
	if g, err := gormDB.DB(); err == nil {
		b.Cleanup(func() { _ = g.Close() })
	}
	inSQLTx := func(db *sql.DB) enqueueTx {
		return func(ctx context.Context, ob *postgres.Outbox, msgs []*message.Message) error {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				return err
			}
			defer func() { _ = tx.Rollback() }()
			if err := ob.EnqueueSQL(ctx, tx, "orders", msgs...); err != nil {
				return err
			}
			return tx.Commit()
		}
	}
	stacks := []struct {
		name string
		tx   enqueueTx
	}{
		{"pgx", func(ctx context.Context, ob *postgres.Outbox, msgs []*message.Message) error {
			return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return ob.Enqueue(ctx, tx, "orders", msgs...) })
		}},
		{"sql-pgx", inSQLTx(stdDB)},
		{"pq", inSQLTx(pqDB)},
		{"gorm", func(ctx context.Context, ob *postgres.Outbox, msgs []*message.Message) error {
			return gormDB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
				return ob.EnqueueSQL(ctx, tx.Statement.ConnPool, "orders", msgs...)
			})
		}},
	}
	payload := []byte(`{"order":"order-0000","amount":4200,"currency":"EUR","note":"a payload of about 128 bytes, as the other benchmarks use"}`)
	rates := map[string][]float64{}
	b.ResetTimer()
	for range b.N {
		for range 5 {
			for _, perTx := range []int{1, 100} {
				txs := 300
				if perTx == 100 {
					txs = 60
				}
				for _, s := range stacks {
					b.StopTimer()
					t := pgbench.NewTable(b, pool, postgres.KindOutbox, "stack")
					ob, err := postgres.NewOutbox(postgres.OutboxConfig{Table: t.Name})
					if err != nil {
						b.Fatal(err)
					}
					batches := make([][]*message.Message, txs)
					for i := range batches {
						for j := range perTx {
							msg := message.NewMessage(watermill.NewUUID(), payload)
							bus.SetPartitionKey(msg, fmt.Sprintf("order-%d", (i*perTx+j)%1000))
							bus.SetEventType(msg, "order.placed")
							batches[i] = append(batches[i], msg)
						}
					}
					b.StartTimer()
					start := time.Now()
					for _, msgs := range batches {
						if err := s.tx(ctx, ob, msgs); err != nil {
							b.Fatalf("%s: %v", s.name, err)
						}
					}
					key := fmt.Sprintf("%s-%d", s.name, perTx)
					rates[key] = append(rates[key], pgbench.PerSecond(txs*perTx, time.Since(start)))
				}
			}
		}
	}
	b.StopTimer()
	med := func(key string) float64 {
		xs := slices.Clone(rates[key])
		slices.Sort(xs)
		return xs[len(xs)/2]
	}
	for _, s := range stacks {
		for _, perTx := range []int{1, 100} {
			b.ReportMetric(med(fmt.Sprintf("%s-%d", s.name, perTx)), fmt.Sprintf("%s-%d-events/s", s.name, perTx))
		}
	}
	b.ReportMetric(100*med("sql-pgx-100")/med("pgx-100"), "sql-pgx/pgx-100-%")
	b.ReportMetric(100*med("pq-100")/med("pgx-100"), "pq/pgx-100-%")
	b.ReportMetric(100*med("gorm-100")/med("pgx-100"), "gorm/pgx-100-%")
}
