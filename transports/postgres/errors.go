package postgres

import (
	"context"
	"errors"
	"io"
	"net"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/puddle/v2"

	"github.com/omnibus-go/omnibus/bus"
)

// ClassifyError marks an error of a PostgreSQL write done for a message
// (the postgres broker's Publish, an inbox Store, a dispatcher's
// transaction) with its failure class (DESIGN §3), and returns err
// otherwise unchanged:
//
//   - transient (no attempt spent): the database could not be reached or
//     could not take the statement for now — connection errors (refused,
//     reset, EOF, a connection or pool closed, pgconn's safe-to-retry
//     errors), SQLSTATE classes 08 (connection), 53 (insufficient
//     resources), 57 (server shutting down, cannot connect now), 58 (system
//     error), 28 (authorization: an operator fixes it for every message at
//     once), 40 (serialization failure, deadlock: retrying is the cure),
//     55P03 (lock not available), 25006 (read-only: a standby after a
//     failover), 3D000 (database missing), and 42P01, 42703, 42883 (our
//     table, column or function missing: the schema is missing or older
//     than the binary, and `omnibus migrate` fixes it); a context
//     cancellation (shutdown).
//   - permanent (no retry): an InvalidMessageError, and SQLSTATE classes 22
//     (data exception: the message holds what the column cannot) and 54
//     (program limit exceeded).
//   - counted: everything else, including a context deadline (the write
//     was attempted and timed out) and any other refusal (integrity
//     violations, errors raised by a user's trigger), so a message the
//     database keeps refusing runs out of attempts instead of holding its
//     key forever.
//
// An error that already carries a class keeps it.
func ClassifyError(err error) error {
	if err == nil {
		return nil
	}
	var ce *bus.ClassifiedError
	if errors.As(err, &ce) {
		return err
	}
	switch classOf(err) {
	case bus.ClassTransient:
		return bus.Transient(err)
	case bus.ClassPermanent:
		return bus.Permanent(err)
	}
	return err
}

func classOf(err error) bus.Class {
	var (
		invalid *InvalidMessageError
		pgErr   *pgconn.PgError
		connErr *pgconn.ConnectError
		netErr  net.Error
	)
	switch {
	case errors.As(err, &invalid):
		return bus.ClassPermanent
	case errors.As(err, &pgErr):
		return sqlStateClass(pgErr.Code)
	case errors.As(err, &connErr):
		return bus.ClassTransient
	case errors.Is(err, context.DeadlineExceeded):
		return bus.ClassCounted
	case errors.Is(err, context.Canceled),
		errors.Is(err, pgconn.ErrConnClosed),
		errors.Is(err, io.EOF),
		errors.Is(err, io.ErrUnexpectedEOF),
		errors.As(err, &netErr),
		pgconn.SafeToRetry(err),
		errors.Is(err, puddle.ErrClosedPool): // pgxpool closed
		return bus.ClassTransient
	}
	return bus.ClassCounted
}

func sqlStateClass(code string) bus.Class {
	switch code {
	case "55P03", "25006", "3D000", "42P01", "42703", "42883":
		return bus.ClassTransient
	}
	if len(code) < 2 {
		return bus.ClassCounted
	}
	switch code[:2] {
	case "08", "53", "57", "58", "28", "40":
		return bus.ClassTransient
	case "22", "54":
		return bus.ClassPermanent
	}
	return bus.ClassCounted
}
