// Command sql-pgx writes an order and its event in one database/sql
// transaction on pgx's stdlib driver, rolls a second one back, and relays
// the committed event to a broker.
//
//	go run ./sql-pgx   (in examples/datalayers)
package main

import (
	"context"
	"database/sql"

	"github.com/ThreeDotsLabs/watermill/message"
	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" driver

	"github.com/omnibus-go/omnibus/examples/datalayers/internal/stack"
	"github.com/omnibus-go/omnibus/transports/postgres"
)

func main() { stack.Main("sql-pgx", open) }

func open(context.Context) (stack.Write, func() error, error) {
	db, err := sql.Open("pgx", stack.URL())
	if err != nil {
		return nil, nil, err
	}
	return func(ctx context.Context, outbox *postgres.Outbox, orders string, o stack.Order, event *message.Message, rollback bool) error {
		return placeOrder(ctx, db, outbox, orders, o, event, rollback)
	}, db.Close, nil
}

// placeOrder is the whole pattern for database/sql: the business row and the
// event in one *sql.Tx.
func placeOrder(ctx context.Context, db *sql.DB, outbox *postgres.Outbox, orders string, o stack.Order, event *message.Message, rollback bool) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }() // a no-op after Commit
	if _, err := tx.ExecContext(ctx, `INSERT INTO `+orders+` (id, amount) VALUES ($1, $2)`, o.ID, o.Amount); err != nil {
		return err
	}
	if err := outbox.EnqueueSQL(ctx, tx, stack.Topic, event); err != nil {
		return err
	}
	if rollback {
		return tx.Rollback()
	}
	return tx.Commit()
}
