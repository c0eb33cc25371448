package postgres

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/omnibus-go/omnibus/bus"
)

type txKey struct{}

// WithTx returns a copy of ctx that carries tx. Processors that run a
// handler inside a transaction (the Dispatcher's transactional option, the
// inline InboxIngest) hand it to the handler this way.
func WithTx(ctx context.Context, tx pgx.Tx) context.Context {
	return context.WithValue(ctx, txKey{}, tx)
}

// TxFromContext returns the transaction a processor runs the current handler
// in. Writes made with it commit together with the completion of the message
// (exactly-once effects) and are rolled back when the handler fails. The
// handler must not commit or roll it back itself. ok is false when the
// handler does not run in a transaction.
func TxFromContext(ctx context.Context) (tx pgx.Tx, ok bool) {
	tx, ok = ctx.Value(txKey{}).(pgx.Tx)
	return tx, ok && tx != nil
}

// ErrLeaseLost is returned by CompleteInTx when the row is no longer leased
// by this worker (its lease expired and another worker took it, or it was
// settled already). The caller must roll back: the other worker delivers it.
var ErrLeaseLost = errors.New("postgres subscriber: lease lost")

// CompleteInTx marks the row msg was delivered from completed, inside tx, so
// that the completion commits or rolls back together with whatever else tx
// wrote. It is guarded by this worker's lease: if the lease was lost it
// changes nothing and returns an error wrapping ErrLeaseLost, and the caller
// must roll back.
//
// Ack msg after tx has committed: the subscriber's batched ack of the row is
// then a no-op (the row no longer carries this worker's lease), and its key
// is released as usual. If tx rolls back, nack or ack msg as the handler's
// outcome says; the row is still leased and settled normally.
//
// Keep the time between CompleteInTx and Commit short: the row stays locked
// until then, and the subscriber's lease renewal waits for that lock.
func (s *Subscriber) CompleteInTx(ctx context.Context, tx pgx.Tx, msg *message.Message) error {
	id, attempts, err := s.deliveredRow(msg)
	if err != nil {
		return err
	}
	tag, err := tx.Exec(ctx, s.eng.q.completeRow, id, s.cfg.WorkerID, attempts)
	if err != nil {
		return fmt.Errorf("complete row %d of %q: %w", id, s.cfg.Table, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("complete row %d of %q: %w", id, s.cfg.Table, ErrLeaseLost)
	}
	return nil
}

// deliveredRow returns the row msg was delivered from and the attempt count
// its lease set. The lease counted this delivery (attempts = d.Attempts +
// 1); the completion takes the count back and is guarded by it, so it
// completes only the delivery it belongs to.
func (s *Subscriber) deliveredRow(msg *message.Message) (id int64, attempts int, err error) {
	d, ok := bus.DeliveryOf(msg)
	if !ok || d.Source != s.cfg.Table {
		return 0, 0, fmt.Errorf("complete message %s in %q: it was not delivered by this subscriber", msg.UUID, s.cfg.Table)
	}
	id, err = strconv.ParseInt(d.ID, 10, 64)
	if err != nil {
		return 0, 0, fmt.Errorf("complete message %s in %q: row id %q: %w", msg.UUID, s.cfg.Table, d.ID, err)
	}
	return id, d.Attempts + 1, nil
}
