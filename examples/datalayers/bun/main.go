// Command bun writes an order and its event in one bun transaction, rolls a
// second one back, and relays the committed event to a broker.
//
//	go run ./bun   (in examples/datalayers)
package main

import (
	"context"
	"database/sql"
	"errors"

	"github.com/ThreeDotsLabs/watermill/message"
	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" driver
	"github.com/uptrace/bun"
	"github.com/uptrace/bun/dialect/pgdialect"

	"github.com/omnibus-go/omnibus/examples/datalayers/internal/stack"
	"github.com/omnibus-go/omnibus/transports/postgres"
)

func main() { stack.Main("bun", open) }

// order is the bun model of the orders table (its name is set per query).
type order struct {
	ID     string `bun:"id,pk"`
	Amount int    `bun:"amount"`
}

// errRollback makes RunInTx roll back.
var errRollback = errors.New("rolled back on purpose")

func open(context.Context) (stack.Write, func() error, error) {
	sqlDB, err := sql.Open("pgx", stack.URL())
	if err != nil {
		return nil, nil, err
	}
	db := bun.NewDB(sqlDB, pgdialect.New())
	return func(ctx context.Context, outbox *postgres.Outbox, orders string, o stack.Order, event *message.Message, rollback bool) error {
		err := db.RunInTx(ctx, nil, func(ctx context.Context, tx bun.Tx) error {
			if _, err := tx.NewInsert().Model(&order{ID: o.ID, Amount: o.Amount}).ModelTableExpr(orders).Exec(ctx); err != nil {
				return err
			}
			// tx.Tx, the *sql.Tx under bun.Tx: bun's own ExecContext
			// rewrites ? placeholders and would drop $n arguments.
			if err := outbox.EnqueueSQL(ctx, tx.Tx, stack.Topic, event); err != nil {
				return err
			}
			if rollback {
				return errRollback
			}
			return nil
		})
		if errors.Is(err, errRollback) {
			return nil
		}
		return err
	}, db.Close, nil
}
