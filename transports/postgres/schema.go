package postgres

import (
	"bytes"
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"
	"text/template"
	"time"

	"github.com/jackc/pgx/v5"
)

// Default table names.
const (
	DefaultOutboxTable = "omnibus_outbox"
	DefaultInboxTable  = "omnibus_inbox"
)

// Kind tells an outbox table from an inbox table.
type Kind int

const (
	// KindOutbox is a table of events written by the application, relayed to a broker.
	KindOutbox Kind = iota
	// KindInbox is a table of received messages, deduplicated per consumer group.
	KindInbox
)

func (k Kind) String() string {
	if k == KindInbox {
		return "inbox"
	}
	return "outbox"
}

// Table names one outbox or inbox table, optionally schema-qualified
// ("events.outbox"). Its companion lanes table is "<name>_lanes" in the same
// schema.
type Table struct {
	Name string
	Kind Kind
	// PartitionInterval, when set, makes Migrate create the table in the
	// partitioned layout: range-partitioned on created_at, one partition per
	// interval (docs/operations.md, "Partitions"). Between MinPartitionInterval
	// and MaxPartitionInterval, a whole number of minutes. It matters only
	// when Migrate creates the table: an existing table keeps its layout, and
	// every other component finds the layout in the database.
	PartitionInterval time.Duration
}

// OutboxTable names an outbox table; "" means DefaultOutboxTable.
func OutboxTable(name string) Table {
	if name == "" {
		name = DefaultOutboxTable
	}
	return Table{Name: name, Kind: KindOutbox}
}

// InboxTable names an inbox table; "" means DefaultInboxTable.
func InboxTable(name string) Table {
	if name == "" {
		name = DefaultInboxTable
	}
	return Table{Name: name, Kind: KindInbox}
}

// DefaultTables is the default outbox and inbox table.
func DefaultTables() []Table { return []Table{OutboxTable(""), InboxTable("")} }

//go:embed migrations/*.sql
var migrationFS embed.FS

type migration struct {
	version int
	name    string
	tmpl    *template.Template
}

var migrations = loadMigrations()

func loadMigrations() []migration {
	entries, err := fs.ReadDir(migrationFS, "migrations")
	if err != nil {
		panic(err)
	}
	var out []migration
	for _, e := range entries {
		v, err := strconv.Atoi(strings.SplitN(e.Name(), "_", 2)[0])
		if err != nil {
			panic(fmt.Sprintf("migration %s: name must start with a version number", e.Name()))
		}
		body, err := migrationFS.ReadFile("migrations/" + e.Name())
		if err != nil {
			panic(err)
		}
		out = append(out, migration{
			version: v,
			name:    e.Name(),
			tmpl:    template.Must(template.New(e.Name()).Parse(string(body))),
		})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].version < out[j].version })
	return out
}

// templateData is what the migration templates see. Every string in it is a
// quoted identifier or literal built from a validated name.
type templateData struct {
	t        tableName
	Inbox    bool
	interval time.Duration // the partitioned layout's; 0 for the single table
}

func (d templateData) Partitioned() bool { return d.interval > 0 }
func (d templateData) Dedup() string     { return d.t.derived("_dedup").quoted() }

// PartitionStorage is the storage settings of each partition (the single
// table's, migrations 0001 and 0006).
func (d templateData) PartitionStorage() string { return partitionStorage }

// PartitionIntervalLiteral is the interval as an SQL literal.
func (d templateData) PartitionIntervalLiteral() string {
	return fmt.Sprintf("interval '%d seconds'", int64(d.interval/time.Second))
}

func (d templateData) Table() string                  { return d.t.quoted() }
func (d templateData) Lanes() string                  { return d.t.derived("_lanes").quoted() }
func (d templateData) Notes() string                  { return d.t.derived("_notes").quoted() }
func (d templateData) LaneLockBuckets() int           { return laneLockBuckets }
func (d templateData) Ident(suffix string) string     { return d.t.ident(suffix) }
func (d templateData) Qualified(suffix string) string { return d.t.qualifiedIdent(suffix) }
func (d templateData) TableLiteral() string {
	return "'" + strings.ReplaceAll(d.t.quoted(), "'", "''") + "'"
}

// LaneLockKey is the advisory lock key of the lane of (g, topic, key) as
// migration 0002 computed it (a gated lane's lock; replaced by 0004).
func (d templateData) LaneLockKey(g, topic, key string) string {
	lit := "'" + strings.ReplaceAll(d.t.String(), "'", "''") + "'"
	return "hashtextextended(" + lit + " || '|' || " + g + " || '|' || " + topic + " || '|' || " + key + ", 0)"
}

// LaneLock is the two arguments of the advisory lock of the lane of
// (g, topic, key) (laneLock).
func (d templateData) LaneLock(g, topic, key string) string {
	return laneLock(d.t, g, topic, key)
}

func (d templateData) ChannelLiteral() string {
	return "'" + strings.ReplaceAll(d.t.channel(), "'", "''") + "'"
}

func (t Table) parse() (tableName, error) {
	tn, err := parseTableName(t.Name)
	if err != nil {
		return tableName{}, fmt.Errorf("%s table: %w", t.Kind, err)
	}
	if err := checkPartitionInterval(t.PartitionInterval); err != nil {
		return tableName{}, fmt.Errorf("%s table %q: partition interval: %w", t.Kind, t.Name, err)
	}
	return tn, nil
}

func render(m migration, t Table) (string, error) {
	tn, err := t.parse()
	if err != nil {
		return "", err
	}
	var buf bytes.Buffer
	if err := m.tmpl.Execute(&buf, templateData{t: tn, Inbox: t.Kind == KindInbox, interval: t.PartitionInterval}); err != nil {
		return "", fmt.Errorf("render migration %s for %q: %w", m.name, t.Name, err)
	}
	return buf.String(), nil
}

// MigrationSQL returns the SQL that Migrate applies for tables, in order,
// for users who run their own migration tool. It does not include the
// bookkeeping of applied versions.
func MigrationSQL(tables ...Table) (string, error) {
	if len(tables) == 0 {
		tables = DefaultTables()
	}
	var b strings.Builder
	for _, t := range tables {
		for _, m := range migrations {
			sql, err := render(m, t)
			if err != nil {
				return "", err
			}
			fmt.Fprintf(&b, "-- omnibus %s table %s, migration %s\n%s\n", t.Kind, t.Name, m.name, sql)
		}
	}
	return b.String(), nil
}

// Beginner is anything that can begin a transaction: a *pgxpool.Pool, a
// *pgx.Conn or a pgx.Tx (which begins a savepoint).
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// migrationLockID is the advisory lock key Migrate holds while it works, so
// that services starting at once migrate one after the other.
const migrationLockID int64 = 0x6f6d6e6962757301 // "omnibus\x01"

// Migrate creates or upgrades tables (the default outbox and inbox when none
// are given). It applies the embedded versioned migrations that have not been
// applied yet, in one transaction under an advisory lock; running it again is
// a no-op. Applied versions are recorded in omnibus_schema_migrations in the
// schema of each table.
func Migrate(ctx context.Context, db Beginner, tables ...Table) error {
	if len(tables) == 0 {
		tables = DefaultTables()
	}
	return underMigrationLock(ctx, db, "migrate", tables, migrateTable)
}

// underMigrationLock validates tables, then runs each for every table in one
// transaction that holds Migrate's advisory lock; op names the work in errors.
func underMigrationLock(ctx context.Context, db Beginner, op string, tables []Table, each func(context.Context, pgx.Tx, Table) error) error {
	for _, t := range tables {
		if _, err := t.parse(); err != nil {
			return fmt.Errorf("%s: %w", op, err)
		}
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("%s: begin: %w", op, err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, fixedSQL("MigrationLock"), migrationLockID); err != nil {
		return fmt.Errorf("%s: take advisory lock: %w", op, err)
	}
	for _, t := range tables {
		if err := each(ctx, tx, t); err != nil {
			return err
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("%s: commit: %w", op, err)
	}
	return nil
}

func migrateTable(ctx context.Context, tx pgx.Tx, t Table) error {
	tn, _ := t.parse()
	r := vocab{t: tn, inbox: t.Kind == KindInbox}.renderer()
	if tn.schema != "" {
		if _, err := tx.Exec(ctx, r.sql("CreateSchema")); err != nil {
			return fmt.Errorf("migrate %q: create schema: %w", t.Name, err)
		}
	}
	if _, err := tx.Exec(ctx, r.sql("CreateMigrationsTable")); err != nil {
		return fmt.Errorf("migrate %q: create bookkeeping table: %w", t.Name, err)
	}
	var current int
	if err := tx.QueryRow(ctx, r.sql("AppliedVersion"), tn.name).Scan(&current); err != nil {
		return fmt.Errorf("migrate %q: read applied version: %w", t.Name, err)
	}
	record := r.sql("RecordVersion")
	for _, m := range migrations {
		if m.version <= current {
			continue
		}
		sql, err := render(m, t)
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, sql); err != nil {
			return fmt.Errorf("migrate %q: apply %s: %w", t.Name, m.name, err)
		}
		if _, err := tx.Exec(ctx, record, tn.name, m.version); err != nil {
			return fmt.Errorf("migrate %q: record %s: %w", t.Name, m.name, err)
		}
	}
	if t.PartitionInterval > 0 {
		return createPartitions(ctx, tx, t, tn)
	}
	return nil
}

// createPartitions checks that a table Migrate was asked to partition is
// partitioned, by the same interval, and creates its current partition and
// the PartitionsAhead after it.
func createPartitions(ctx context.Context, tx pgx.Tx, t Table, tn tableName) error {
	p := newPartitioner(nil, tn, t.Kind == KindInbox)
	got, err := p.interval(ctx, tx)
	switch {
	case err != nil:
		return fmt.Errorf("migrate %q: %w", t.Name, err)
	case got == 0:
		return fmt.Errorf("migrate %q: partition interval %s: the table exists as a single table; "+
			"convert it first (docs/operations.md, \"Converting a single table\") or leave the interval unset", t.Name, t.PartitionInterval)
	case got != t.PartitionInterval:
		return fmt.Errorf("migrate %q: partition interval %s: the table is partitioned by %s, which cannot change", t.Name, t.PartitionInterval, got)
	}
	names, err := p.partitions(ctx, tx)
	if err != nil {
		return fmt.Errorf("migrate %q: %w", t.Name, err)
	}
	have := map[string]bool{}
	for _, n := range names {
		have[n] = true
	}
	var now time.Time
	if err := tx.QueryRow(ctx, "SELECT now()").Scan(&now); err != nil {
		return fmt.Errorf("migrate %q: %w", t.Name, err)
	}
	var rep PartitionReport
	if err := p.createAhead(ctx, tx, got, now, have, &rep); err != nil {
		return fmt.Errorf("migrate %q: %w", t.Name, err)
	}
	return nil
}

// Drop removes tables (at least one must be given) with everything Migrate
// made for them: each table and its lanes table (their data, triggers and
// indexes), their trigger functions, and their migration records, so that a
// later Migrate starts over. Tables that do not exist are skipped, and a
// table's Kind does not matter. It runs in
// one transaction under Migrate's advisory lock. It is for tests, demos and
// tearing down an environment; it never runs on its own.
func Drop(ctx context.Context, db Beginner, tables ...Table) error {
	if len(tables) == 0 {
		return errors.New("drop: no tables given")
	}
	return underMigrationLock(ctx, db, "drop", tables, dropTable)
}

func dropTable(ctx context.Context, tx pgx.Tx, t Table) error {
	tn, _ := t.parse()
	r := vocab{t: tn, inbox: t.Kind == KindInbox}.renderer()
	if _, err := tx.Exec(ctx, r.sql("DropTables")); err != nil {
		return fmt.Errorf("drop %q: %w", t.Name, err)
	}
	if _, err := tx.Exec(ctx, r.sql("DropFunctions")); err != nil {
		return fmt.Errorf("drop %q: trigger functions: %w", t.Name, err)
	}
	var booked bool
	err := tx.QueryRow(ctx, r.sql("SchemaObjects"), tn.quoted(), tn.derived("_lanes").quoted(), migrationsBook(tn)).
		Scan(new(bool), &booked)
	if err != nil {
		return fmt.Errorf("drop %q: %w", t.Name, err)
	}
	if booked {
		if _, err := tx.Exec(ctx, r.sql("ForgetMigrations"), tn.name); err != nil {
			return fmt.Errorf("drop %q: migration records: %w", t.Name, err)
		}
	}
	return nil
}
