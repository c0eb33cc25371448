package postgres

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/puddle/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omnibus-go/omnibus/bus"
)

// Every error a PostgreSQL write for a message can meet, with its class:
// the database unreachable or unable to take the statement for now is
// transient, what the message holds that a column cannot is permanent,
// anything else the database refuses is counted.
func TestClassifyError_EveryKindHasItsClass(t *testing.T) {
	t.Parallel()
	pg := func(code string) error { return fmt.Errorf("store: %w", &pgconn.PgError{Code: code, Message: "m"}) }
	transient, counted, permanent := bus.ClassTransient, bus.ClassCounted, bus.ClassPermanent
	cases := []struct {
		name string
		err  error
		want bus.Class
	}{
		{"connection refused", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, transient},
		{"connection reset", &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}, transient},
		{"connect error", &pgconn.ConnectError{}, transient},
		{"EOF", io.EOF, transient},
		{"unexpected EOF", io.ErrUnexpectedEOF, transient},
		{"conn closed", pgconn.ErrConnClosed, transient},
		{"pool closed", puddle.ErrClosedPool, transient},
		{"cancelled (shutdown)", context.Canceled, transient},
		{"deadline (attempted, timed out)", context.DeadlineExceeded, counted},
		{"08006 connection failure", pg("08006"), transient},
		{"08001 cannot connect", pg("08001"), transient},
		{"53300 too many connections", pg("53300"), transient},
		{"53100 disk full", pg("53100"), transient},
		{"57P01 admin shutdown", pg("57P01"), transient},
		{"57P03 cannot connect now", pg("57P03"), transient},
		{"58030 io error", pg("58030"), transient},
		{"28P01 invalid password", pg("28P01"), transient},
		{"40001 serialization failure", pg("40001"), transient},
		{"40P01 deadlock", pg("40P01"), transient},
		{"55P03 lock not available", pg("55P03"), transient},
		{"25006 read-only transaction (standby)", pg("25006"), transient},
		{"3D000 database missing", pg("3D000"), transient},
		{"42P01 table missing (run migrate)", pg("42P01"), transient},
		{"42703 column missing (schema behind)", pg("42703"), transient},
		{"42883 function missing (schema behind)", pg("42883"), transient},
		{"22021 bad UTF-8", pg("22021"), permanent},
		{"22P05 untranslatable character", pg("22P05"), permanent},
		{"22008 timestamp out of range", pg("22008"), permanent},
		{"54000 program limit", pg("54000"), permanent},
		{"invalid message", &InvalidMessageError{Field: "topic", Why: "contains a NUL byte"}, permanent},
		{"23503 foreign key violation", pg("23503"), counted},
		{"23514 check violation", pg("23514"), counted},
		{"P0001 raised by a trigger", pg("P0001"), counted},
		{"42601 syntax error", pg("42601"), counted},
		{"any other error", errors.New("something else"), counted},
		{"already transient", bus.Transient(errors.New("x")), transient},
		{"already permanent", bus.Permanent(pg("08006")), permanent},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := ClassifyError(c.err)
			assert.Equal(t, c.want, bus.ClassOf(got), "class of %v", c.err)
			assert.ErrorIs(t, got, c.err, "the error is kept")
		})
	}
	assert.NoError(t, ClassifyError(nil))
}

// The postgres broker's Publish classifies what the database says: a
// refusal of the write (here a trigger raising an error, as a user's
// constraint would) is counted, so the relay spends the message's attempts
// instead of retrying it for ever as if the database were down.
func TestQueuePublisher_DatabaseRefusalIsCountedNotTransient(t *testing.T) {
	t.Parallel()
	pool, in := newInbox(t)
	ctx := context.Background()
	fn := quoteIdent(in.Table() + "_refuse")
	_, err := pool.Exec(ctx, `CREATE FUNCTION `+fn+`() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'refused by test trigger'; END $$;
CREATE TRIGGER refuse BEFORE INSERT ON `+quoteIdent(in.Table())+` FOR EACH ROW EXECUTE FUNCTION `+fn+`();`)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = pool.Exec(ctx, `DROP FUNCTION IF EXISTS `+fn+` CASCADE`) })

	pub := queuePublisher{&queueBroker{pool: pool, inbox: in, groups: []string{"g"}}}
	err = pub.Publish("orders", event("k", "refused"))
	require.Error(t, err)
	assert.Equal(t, bus.ClassCounted, bus.ClassOf(err), "a refused write is not an outage: %v", err)

	bad := event("k", "bad")
	bad.Metadata.Set("note", "a\x00b")
	err = pub.Publish("orders", bad)
	assert.Equal(t, bus.ClassPermanent, bus.ClassOf(err), "a message the table cannot hold is permanent: %v", err)
}
