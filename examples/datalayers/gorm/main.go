// Command gorm writes an order and its event in one GORM transaction (with
// prepared statements on), rolls a second one back, and relays the
// committed event to a broker.
//
//	go run ./gorm   (in examples/datalayers)
package main

import (
	"context"
	"errors"

	"github.com/ThreeDotsLabs/watermill/message"
	pgdriver "gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/omnibus-go/omnibus/examples/datalayers/internal/stack"
	"github.com/omnibus-go/omnibus/transports/postgres"
)

func main() { stack.Main("gorm", open) }

// order is the GORM model of the orders table.
type order struct {
	ID     string `gorm:"primaryKey"`
	Amount int
}

// errRollback makes Transaction roll back.
var errRollback = errors.New("rolled back on purpose")

func open(context.Context) (stack.Write, func() error, error) {
	db, err := gorm.Open(pgdriver.Open(stack.URL()), &gorm.Config{PrepareStmt: true, Logger: logger.Discard})
	if err != nil {
		return nil, nil, err
	}
	sqlDB, err := db.DB()
	if err != nil {
		return nil, nil, err
	}
	return func(ctx context.Context, outbox *postgres.Outbox, orders string, o stack.Order, event *message.Message, rollback bool) error {
		err := db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
			if err := tx.Table(orders).Create(&order{ID: o.ID, Amount: o.Amount}).Error; err != nil {
				return err
			}
			// The transaction's connection: a *sql.Tx, or GORM's
			// prepared-statement wrapper of one with PrepareStmt.
			if err := outbox.EnqueueSQL(ctx, tx.Statement.ConnPool, stack.Topic, event); err != nil {
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
	}, sqlDB.Close, nil
}
