// Command sql-pq writes an order and its event in one database/sql
// transaction on lib/pq, rolls a second one back, and relays the committed
// event to a broker. The transaction is stack.SQLWrite: a *sql.Tx, an
// INSERT and Outbox.EnqueueSQL.
//
//	go run ./sql-pq   (in examples/datalayers)
package main

import (
	"context"
	"database/sql"

	_ "github.com/lib/pq" // the "postgres" driver

	"github.com/omnibus-go/omnibus/examples/datalayers/internal/stack"
)

func main() { stack.Main("sql-pq", open) }

func open(context.Context) (stack.Write, func() error, error) {
	db, err := sql.Open("postgres", stack.URL())
	if err != nil {
		return nil, nil, err
	}
	return stack.SQLWrite(db), db.Close, nil
}
