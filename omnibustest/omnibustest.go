// Package omnibustest is a test kit for services that use omnibus: helpers a
// service calls from its own tests to check the events its code enqueues
// and what its handlers do, against a real PostgreSQL.
//
//   - New makes an isolated outbox and inbox per test (a schema of its
//     own, dropped when the test ends), so tests run in parallel.
//   - RequireEnqueued and RequireNoneEnqueued assert what a transaction
//     enqueued (by topic, key, event type and a payload matcher); Enqueued
//     lists it. They see the uncommitted rows of the transaction they are
//     given: pgx's or database/sql's.
//   - Drain relays the outbox through a real OutboxRelay into an in-memory
//     publisher and returns what was published, in order.
//   - Handle stores messages in the inbox, runs a Dispatcher until each is
//     completed or failed, and returns the outcome of each, so a test can
//     assert the handler's effects next to it.
//
// Every helper fails the test with a message that says what was expected
// and what was found.
package omnibustest

import (
	"context"
	"crypto/rand"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/omnibus-go/omnibus/transports/postgres"
)

// TB is the part of testing.TB the kit uses; a *testing.T or *testing.B is
// one.
type TB interface {
	Helper()
	Fatalf(format string, args ...any)
	Cleanup(func())
}

// Env is one test's omnibus tables: an outbox and an inbox in a schema of
// their own.
type Env struct {
	// Pool is the pool New was given.
	Pool *pgxpool.Pool
	// Schema is the test's schema, omnibustest_<random>.
	Schema string
	// Outbox writes to the test's outbox table (Outbox.Table()).
	Outbox *postgres.Outbox
	// Inbox is the test's inbox table (Inbox.Table()).
	Inbox *postgres.Inbox
}

// New creates a schema for the test with a migrated outbox and inbox
// (omnibus_outbox and omnibus_inbox), and drops it, with its migration
// records, when the test ends. Use Env.Outbox in the code under test (or
// give it Env.Outbox.Table()), and a Dispatcher over Env.Inbox.Table().
func New(t TB, pool *pgxpool.Pool) *Env {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	schema := "omnibustest_" + strings.ToLower(rand.Text()[:12])
	if _, err := pool.Exec(ctx, `CREATE SCHEMA `+pgx.Identifier{schema}.Sanitize()); err != nil {
		t.Fatalf("omnibustest: create schema %s: %v", schema, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = pool.Exec(ctx, `DROP SCHEMA IF EXISTS `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)
		_, _ = pool.Exec(ctx, `DELETE FROM omnibus_schema_migrations WHERE starts_with(table_name, $1)`, schema+".")
	})
	outboxTable, inboxTable := schema+".omnibus_outbox", schema+".omnibus_inbox"
	if err := postgres.Migrate(ctx, pool, postgres.OutboxTable(outboxTable), postgres.InboxTable(inboxTable)); err != nil {
		t.Fatalf("omnibustest: migrate %s: %v", schema, err)
	}
	ob, err := postgres.NewOutbox(postgres.OutboxConfig{Table: outboxTable})
	if err != nil {
		t.Fatalf("omnibustest: %v", err)
	}
	in, err := postgres.NewInbox(postgres.InboxConfig{Table: inboxTable})
	if err != nil {
		t.Fatalf("omnibustest: %v", err)
	}
	return &Env{Pool: pool, Schema: schema, Outbox: ob, Inbox: in}
}

// quoted is a schema-qualified table name quoted for SQL.
func quoted(table string) string {
	return pgx.Identifier(strings.Split(table, ".")).Sanitize()
}

// describe formats a list of things for a failure message.
func describe[T fmt.Stringer](xs []T) string {
	if len(xs) == 0 {
		return "none"
	}
	var b strings.Builder
	for _, x := range xs {
		b.WriteString("\n\t")
		b.WriteString(x.String())
	}
	return b.String()
}
