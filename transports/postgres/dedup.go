package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/omnibus-go/omnibus/bus"
)

// Deduper runs a handler at most once per message, in effect, for a
// consumer that handles messages as they arrive (not through the inbox's
// Dispatcher). Each call opens a transaction, records the message id in the
// inbox table as a completed row of its consumer group, runs the handler
// with that transaction in its context (TxFromContext), and commits both
// together. A message whose id is already recorded is skipped; a handler
// failure rolls the record back, so the redelivery runs it again.
//
// Writes made with TxFromContext therefore happen exactly once per message
// id and group, however often the broker delivers it. The records are
// ordinary completed inbox rows: `omnibus inbox cleanup` deletes them after
// the inbox retention, which is how long a duplicate is recognised.
//
// middleware.Dedup turns a Deduper into handler middleware.
type Deduper struct {
	pool  *pgxpool.Pool
	inbox *Inbox
	group string
}

// NewDeduper returns a Deduper recording in inbox's table for group. The
// table must be migrated (Migrate with InboxTable).
func NewDeduper(pool *pgxpool.Pool, inbox *Inbox, group string) (*Deduper, error) {
	switch {
	case pool == nil:
		return nil, errors.New("new deduper: pool is nil")
	case inbox == nil:
		return nil, errors.New("new deduper: inbox is nil")
	case group == "":
		return nil, errors.New("new deduper: consumer group: must not be empty")
	}
	return &Deduper{pool: pool, inbox: inbox, group: group}, nil
}

// Do runs fn once for msg: it reports ran = false, without running fn, when
// msg's id (bus.EventID) was recorded for the group before. Otherwise fn
// runs with a context carrying the transaction that records the id; when fn
// fails, the transaction is rolled back and its error returned as is. A
// message that cannot be recorded (an id over MaxMessageIDBytes, say) fails
// permanently; database errors are transient. The source topic recorded is
// that of msg's bus.Delivery, else the topic the router subscribed to.
func (d *Deduper) Do(ctx context.Context, msg *message.Message, fn func(ctx context.Context) error) (ran bool, err error) {
	opts := StoreOptions{Group: d.group, Completed: true}
	if SourceTopic(msg) == "" {
		opts.Topic = message.SubscribeTopicFromCtx(msg.Context())
	}
	tx, err := d.pool.Begin(ctx)
	if err != nil {
		return false, bus.Transient(fmt.Errorf("dedup %s: begin: %w", msg.UUID, err))
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = tx.Rollback(rctx) // a no-op after Commit
	}()
	fresh, err := d.inbox.StoreWith(ctx, tx, opts, msg)
	if err != nil {
		err = fmt.Errorf("dedup %s: %w", msg.UUID, err)
		if invalid := (*InvalidMessageError)(nil); errors.As(err, &invalid) {
			return false, bus.Permanent(err)
		}
		return false, bus.Transient(err)
	}
	if !fresh[0] {
		return false, nil
	}
	if err := fn(WithTx(ctx, tx)); err != nil {
		return true, err
	}
	if err := tx.Commit(ctx); err != nil {
		return true, bus.Transient(fmt.Errorf("dedup %s: commit: %w", msg.UUID, err))
	}
	return true, nil
}

// Deduper is a middleware.Deduplicator (checked here without importing it).
var _ interface {
	Do(context.Context, *message.Message, func(context.Context) error) (bool, error)
} = (*Deduper)(nil)
