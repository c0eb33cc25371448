package postgres

import (
	"context"
	"database/sql"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
)

// SQLExecutor is what omnibus needs of a database/sql data layer: the
// ExecContext of a *sql.Tx, *sql.DB or *sql.Conn, and so of every stack
// built on database/sql —
//
//   - database/sql on pgx's stdlib driver or on lib/pq: the *sql.Tx;
//   - sqlx: the *sqlx.Tx (it embeds *sql.Tx);
//   - GORM: tx.Statement.ConnPool of the *gorm.DB that Transaction hands its
//     callback (a *sql.Tx, or GORM's prepared-statement wrapper of one);
//   - bun: the bun.Tx;
//   - ent: the *ent.Tx when the sql/execquery feature is generated, or
//     the *sql.Tx an ent client was opened over (see docs/data-layers.md).
//
// Arguments go to the driver as text (PostgreSQL array literals with
// explicit casts), so every driver passes them the same way.
type SQLExecutor interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// EnqueueSQL is Enqueue for a database/sql data layer: it inserts msgs into
// the outbox for topic with db, the caller's transaction (see SQLExecutor
// for each stack's). It checks and stores exactly what Enqueue does, with
// the same errors, and never begins or commits: the events commit or roll
// back with db's transaction.
func (o *Outbox) EnqueueSQL(ctx context.Context, db SQLExecutor, topic string, msgs ...*message.Message) error {
	rows, err := o.rows(ctx, topic, msgs)
	if err != nil || rows == nil {
		return err
	}
	n := len(rows.ids)
	ids := make([]string, n)
	for i, id := range rows.ids {
		ids[i] = uuid.UUID(id.Bytes).String()
	}
	attempts := make([]string, n)
	for i, a := range rows.attempts {
		attempts[i] = strconv.Itoa(int(a))
	}
	payloads := make([]*string, n)
	metas := make([]*string, n)
	schedules := make([]*string, n)
	for i := range n {
		p := `\x` + hex.EncodeToString(rows.payloads[i])
		payloads[i] = &p
		m := string(rows.metas[i])
		metas[i] = &m
		if at := rows.schedules[i]; at != nil {
			t := at.UTC().Format("2006-01-02 15:04:05.999999Z07:00")
			schedules[i] = &t
		}
	}
	if _, err := db.ExecContext(ctx, o.q.insertOutbox, topic,
		arrayLiteral(ids), nullableArrayLiteral(rows.keys), nullableArrayLiteral(rows.types),
		nullableArrayLiteral(payloads), nullableArrayLiteral(metas), arrayLiteral(attempts), nullableArrayLiteral(schedules),
	); err != nil {
		return fmt.Errorf("enqueue %d events to %q: %w", n, o.cfg.Table, err)
	}
	return nil
}

// SQLPublisher returns a message.Publisher that enqueues into the outbox
// with db, as EnqueueSQL does (the context of the first message is the
// call's). Close is a no-op: db belongs to the caller.
func (o *Outbox) SQLPublisher(db SQLExecutor) message.Publisher {
	return publisherFunc(func(topic string, msgs ...*message.Message) error {
		return o.EnqueueSQL(messagesContext(msgs), db, topic, msgs...)
	})
}

// arrayLiteral writes vs as a PostgreSQL array literal of quoted elements.
func arrayLiteral(vs []string) string {
	var b strings.Builder
	b.WriteByte('{')
	for i, v := range vs {
		if i > 0 {
			b.WriteByte(',')
		}
		quoteElement(&b, v)
	}
	b.WriteByte('}')
	return b.String()
}

// nullableArrayLiteral is arrayLiteral with nil elements written as NULL.
func nullableArrayLiteral(vs []*string) string {
	var b strings.Builder
	b.WriteByte('{')
	for i, v := range vs {
		if i > 0 {
			b.WriteByte(',')
		}
		if v == nil {
			b.WriteString("NULL")
			continue
		}
		quoteElement(&b, *v)
	}
	b.WriteByte('}')
	return b.String()
}

// quoteElement writes v double-quoted, with '"' and '\' escaped by a
// backslash: inside quotes an array element may hold anything else (commas,
// braces, spaces, the word NULL).
func quoteElement(b *strings.Builder, v string) {
	b.WriteByte('"')
	for i := range len(v) {
		if c := v[i]; c == '"' || c == '\\' {
			b.WriteByte('\\')
		}
		b.WriteByte(v[i])
	}
	b.WriteByte('"')
}

type sqlTxKey struct{}

// WithSQLTx returns a copy of ctx that carries tx, the database/sql
// transaction a processor runs a handler in (the Dispatcher with a DB).
func WithSQLTx(ctx context.Context, tx *sql.Tx) context.Context {
	return context.WithValue(ctx, sqlTxKey{}, tx)
}

// SQLTxFromContext returns the database/sql transaction a processor runs the
// current handler in (a Dispatcher configured with a *sql.DB and
// Transactional). What the handler writes with it — directly, or through
// sqlx, GORM, bun or ent opened over it — commits together with the
// completion of the message, and is rolled back when the handler fails. The
// handler must not commit or roll it back itself. ok is false when the
// handler does not run in a database/sql transaction.
func SQLTxFromContext(ctx context.Context) (tx *sql.Tx, ok bool) {
	tx, ok = ctx.Value(sqlTxKey{}).(*sql.Tx)
	return tx, ok && tx != nil
}

// CompleteInSQLTx is CompleteInTx for a database/sql transaction: it marks
// the row msg was delivered from completed with tx, guarded by this worker's
// lease (an error wrapping ErrLeaseLost when the lease was lost; roll back).
func (s *Subscriber) CompleteInSQLTx(ctx context.Context, tx SQLExecutor, msg *message.Message) error {
	id, attempts, err := s.deliveredRow(msg)
	if err != nil {
		return err
	}
	res, err := tx.ExecContext(ctx, s.eng.q.completeRow, id, s.cfg.WorkerID, attempts)
	if err != nil {
		return fmt.Errorf("complete row %d of %q: %w", id, s.cfg.Table, err)
	}
	if n, err := res.RowsAffected(); err != nil || n == 0 {
		return fmt.Errorf("complete row %d of %q: %w", id, s.cfg.Table, ErrLeaseLost)
	}
	return nil
}
