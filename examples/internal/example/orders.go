package example

import (
	"context"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/transports/postgres"
)

// WriteOrders is the service of the outbox examples: for each step, each
// order moves to it in table (id text PRIMARY KEY, status text) and its
// event "order.<step>", keyed by the order id, is enqueued to topic — the
// two in one transaction. It returns how many events it wrote.
func WriteOrders(ctx context.Context, pool *pgxpool.Pool, outbox *postgres.Outbox, table, topic string, orders, steps []string) (int, error) {
	n := 0
	for _, step := range steps {
		for _, id := range orders {
			if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, `INSERT INTO `+table+` (id, status) VALUES ($1, $2)
					ON CONFLICT (id) DO UPDATE SET status = EXCLUDED.status`, id, step); err != nil {
					return err
				}
				msg := message.NewMessage(watermill.NewUUID(), fmt.Appendf(nil, `{"order":%q,"status":%q}`, id, step))
				bus.SetPartitionKey(msg, id)
				bus.SetEventType(msg, "order."+step)
				return outbox.Enqueue(ctx, tx, topic, msg)
			}); err != nil {
				return n, fmt.Errorf("write %s %s: %w", id, step, err)
			}
			n++
		}
	}
	return n, nil
}
