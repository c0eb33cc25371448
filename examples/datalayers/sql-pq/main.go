// Command sql-pq writes an order and its event in one database/sql
// transaction on lib/pq, rolls a second one back, and relays the committed
// event to a broker.
//
//	go run ./sql-pq   (in examples/datalayers)
package main

import (
	"context"
	"database/sql"

	"github.com/ThreeDotsLabs/watermill/message"
	_ "github.com/lib/pq" // the "postgres" driver

	"github.com/omnibus-go/omnibus/examples/datalayers/internal/stack"
	"github.com/omnibus-go/omnibus/transports/postgres"
)

func main() { stack.Main("sql-pq", open) }

func open(context.Context) (stack.Write, func() error, error) {
	db, err := sql.Open("postgres", stack.URL())
	if err != nil {
		return nil, nil, err
	}
	return func(ctx context.Context, outbox *postgres.Outbox, orders string, o stack.Order, event *message.Message, rollback bool) error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback() }() // a no-op after Commit
		if _, err := tx.ExecContext(ctx, `INSERT INTO `+orders+` (id, amount) VALUES ($1, $2)`, o.ID, o.Amount); err != nil {
			return err
		}
		// lib/pq needs nothing special: EnqueueSQL sends its arrays as text.
		if err := outbox.EnqueueSQL(ctx, tx, stack.Topic, event); err != nil {
			return err
		}
		if rollback {
			return tx.Rollback()
		}
		return tx.Commit()
	}, db.Close, nil
}
