// Command sqlx writes an order and its event in one sqlx transaction, rolls
// a second one back, and relays the committed event to a broker.
//
//	go run ./sqlx   (in examples/datalayers)
package main

import (
	"context"

	"github.com/ThreeDotsLabs/watermill/message"
	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" driver
	"github.com/jmoiron/sqlx"

	"github.com/omnibus-go/omnibus/examples/datalayers/internal/stack"
	"github.com/omnibus-go/omnibus/transports/postgres"
)

func main() { stack.Main("sqlx", open) }

func open(context.Context) (stack.Write, func() error, error) {
	db, err := sqlx.Open("pgx", stack.URL())
	if err != nil {
		return nil, nil, err
	}
	return func(ctx context.Context, outbox *postgres.Outbox, orders string, o stack.Order, event *message.Message, rollback bool) error {
		tx, err := db.BeginTxx(ctx, nil)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback() }() // a no-op after Commit
		if _, err := tx.NamedExecContext(ctx, `INSERT INTO `+orders+` (id, amount) VALUES (:id, :amount)`,
			map[string]any{"id": o.ID, "amount": o.Amount}); err != nil {
			return err
		}
		// *sqlx.Tx embeds *sql.Tx: pass it as it is.
		if err := outbox.EnqueueSQL(ctx, tx, stack.Topic, event); err != nil {
			return err
		}
		if rollback {
			return tx.Rollback()
		}
		return tx.Commit()
	}, db.Close, nil
}
