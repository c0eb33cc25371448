// Package demo holds the business side of `omnibus demo`: its orders table,
// which plays the part of a service's own table. Its SQL is in sql/orders.sql;
// omnibus's own tables are reached through postgres.Migrate, Drop and Admin.
package demo

import (
	"context"
	"embed"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/omnibus-go/omnibus/internal/ident"
	"github.com/omnibus-go/omnibus/internal/sqlfile"
)

//go:embed sql/*.sql
var files embed.FS

var statements = sqlfile.MustParse(files, "sql")

// DB is what the statements run on: a pool, a connection or a transaction.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Orders is the demo's orders table with its statements, rendered once.
type Orders struct {
	table                                     string
	create, drop, upsert, appendHandled, list string
}

// NewOrders renders the statements for the table name, which must be a
// plain identifier; it is quoted.
func NewOrders(table string) (Orders, error) {
	if !ident.Plain(table) {
		return Orders{}, fmt.Errorf("orders table %q: want letters, digits and underscores, not starting with a digit", table)
	}
	r := strings.NewReplacer("{ORDERS}", pgx.Identifier{table}.Sanitize())
	return Orders{
		table:         table,
		create:        statements.Render("CreateOrders", r),
		drop:          statements.Render("DropOrders", r),
		upsert:        statements.Render("UpsertOrder", r),
		appendHandled: statements.Render("AppendHandled", r),
		list:          statements.Render("ListOrders", r),
	}, nil
}

// Create creates the table.
func (o Orders) Create(ctx context.Context, db DB) error {
	if _, err := db.Exec(ctx, o.create); err != nil {
		return fmt.Errorf("create the demo's table %s: %w", o.table, err)
	}
	return nil
}

// Drop drops the table if it exists.
func (o Orders) Drop(ctx context.Context, db DB) error {
	if _, err := db.Exec(ctx, o.drop); err != nil {
		return fmt.Errorf("drop the demo's table %s: %w", o.table, err)
	}
	return nil
}

// Upsert sets an order's status: the service's change, written in the
// transaction that enqueues its event.
func (o Orders) Upsert(ctx context.Context, db DB, id, status string) error {
	_, err := db.Exec(ctx, o.upsert, id, status)
	return err
}

// AppendHandled records that a handler applied step to the order: a
// handler's effect, in the transaction that completes its inbox row.
func (o Orders) AppendHandled(ctx context.Context, db DB, id, step string) error {
	_, err := db.Exec(ctx, o.appendHandled, id, step)
	return err
}

// Handled lists, for each order in id order, the steps its handlers applied,
// in the order they applied them.
func (o Orders) Handled(ctx context.Context, db DB) (ids []string, handled [][]string, err error) {
	rows, err := db.Query(ctx, o.list)
	if err != nil {
		return nil, nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var id string
		var h []string
		if err := rows.Scan(&id, &h); err != nil {
			return nil, nil, err
		}
		ids, handled = append(ids, id), append(handled, h)
	}
	return ids, handled, rows.Err()
}
