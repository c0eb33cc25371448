// Command sql-pgx writes an order and its event in one database/sql
// transaction on pgx's stdlib driver, rolls a second one back, and relays the committed
// event to a broker. The transaction is stack.SQLWrite: a *sql.Tx, an
// INSERT and Outbox.EnqueueSQL.
//
//	go run ./sql-pgx   (in examples/datalayers)
package main

import (
	"context"
	"database/sql"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" driver

	"github.com/omnibus-go/omnibus/examples/datalayers/internal/stack"
)

func main() { stack.Main("sql-pgx", open) }

func open(context.Context) (stack.Write, func() error, error) {
	db, err := sql.Open("pgx", stack.URL())
	if err != nil {
		return nil, nil, err
	}
	return stack.SQLWrite(db), db.Close, nil
}
