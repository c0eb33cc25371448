// Command ent writes an order and its event in one ent transaction, rolls a
// second one back, and relays the committed event to a broker.
//
//	go run ./ent   (in examples/datalayers)
//
// The ent client in ./entdb is generated with the sql/execquery feature,
// which gives *entdb.Tx the ExecContext that Outbox.EnqueueSQL takes.
package main

import (
	"context"
	"database/sql"
	"strings"

	"entgo.io/ent/dialect"
	entsql "entgo.io/ent/dialect/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" driver

	"github.com/omnibus-go/omnibus/examples/datalayers/ent/entdb"
	"github.com/omnibus-go/omnibus/examples/datalayers/internal/stack"
	"github.com/omnibus-go/omnibus/transports/postgres"
)

func main() { stack.Main("ent", open) }

func open(context.Context) (stack.Write, func() error, error) {
	db, err := sql.Open("pgx", stack.URL())
	if err != nil {
		return nil, nil, err
	}
	client := entdb.NewClient(entdb.Driver(entsql.OpenDB(dialect.Postgres, db)))
	return func(ctx context.Context, outbox *postgres.Outbox, orders string, o stack.Order, event *message.Message, rollback bool) error {
		tx, err := client.Tx(ctx)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback() }() // a no-op after Commit
		// The example's plumbing, not the pattern: ent's schema names the
		// table "orders"; this run's lives in a schema of its own.
		schema, _, _ := strings.Cut(orders, ".")
		if _, err := tx.ExecContext(ctx, `SET LOCAL search_path TO `+schema+`, public`); err != nil {
			return err
		}
		if _, err := tx.Order.Create().SetID(o.ID).SetAmount(o.Amount).Save(ctx); err != nil {
			return err
		}
		// *entdb.Tx has ExecContext (the sql/execquery feature): pass it.
		if err := outbox.EnqueueSQL(ctx, tx, stack.Topic, event); err != nil {
			return err
		}
		if rollback {
			return tx.Rollback()
		}
		return tx.Commit()
	}, client.Close, nil
}
