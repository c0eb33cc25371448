package bus

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestConfig_NumbersFitWhereTheyAreStored refuses numbers that would be
// truncated on their way to PostgreSQL (int32 columns and pool sizes) or that
// ask for absurd allocations, naming the key and the limit.
func TestConfig_NumbersFitWhereTheyAreStored(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		mutate func(*Config)
		field  string
		reason string
	}{
		{"outbox attempts 2^32 (stored as 0 in an int32)", func(c *Config) { c.Outbox.MaxAttempts = 1 << 32 }, "outbox.max_attempts", fmt.Sprintf("at most %d", MaxAttemptsLimit)},
		{"outbox attempts over the limit", func(c *Config) { c.Outbox.MaxAttempts = 5000 }, "outbox.max_attempts", fmt.Sprintf("at most %d", MaxAttemptsLimit)},
		{"inbox attempts over the limit", func(c *Config) { c.Inbox.MaxAttempts = MaxAttemptsLimit + 1 }, "inbox.max_attempts", fmt.Sprintf("at most %d", MaxAttemptsLimit)},
		{"max conns 2^32+1 (stored as 1 in an int32)", func(c *Config) { c.Postgres.MaxConns = 1<<32 + 1 }, "postgres.max_conns", fmt.Sprintf("at most %d", MaxPostgresConns)},
		{"relay batch 2^40", func(c *Config) { c.Relay.BatchSize = 1 << 40 }, "relay.batch_size", fmt.Sprintf("at most %d", MaxRelayBatchSize)},
		{"relay run 2^40", func(c *Config) { c.Relay.RunLength = 1 << 40 }, "relay.run_length", fmt.Sprintf("at most %d", MaxRelayRunLength)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var c Config
			tc.mutate(&c)
			err := c.Validate()
			require.Error(t, err, "%s must not validate", tc.field)
			var ce *ConfigError
			require.ErrorAs(t, err, &ce)
			assert.Equal(t, tc.field, ce.Field)
			assert.Contains(t, ce.Reason, tc.reason)
		})
	}
	at := Config{Outbox: OutboxConfig{MaxAttempts: MaxAttemptsLimit}, Inbox: InboxConfig{MaxAttempts: MaxAttemptsLimit},
		Postgres: PostgresConfig{MaxConns: MaxPostgresConns}, Relay: RelayConfig{BatchSize: MaxRelayBatchSize, RunLength: MaxRelayRunLength}}
	assert.NoError(t, at.Validate(), "the limits themselves are valid")
}

// TestConfig_TablesWhoseDerivedNamesCollideAreRefused: each table brings
// objects named after it (its lanes table, indexes, functions); two tables
// must not claim the same name, or migrating the second would silently reuse
// the first one's objects (CREATE … IF NOT EXISTS).
func TestConfig_TablesWhoseDerivedNamesCollideAreRefused(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name          string
		outbox, inbox string
		queue         string
		field         string
		reason        string
	}{
		{"inbox is the outbox's lanes table", "x", "x_lanes", "", "inbox.table", `"x_lanes" collides with outbox.table "x": both need "x_lanes"`},
		{"outbox is the inbox's lanes table", "y_lanes", "y", "", "inbox.table", `"y" collides with outbox.table "y_lanes": both need "y_lanes"`},
		{"schema public is the default schema", "public.x", "x_lanes", "", "inbox.table", `collides with outbox.table "public.x"`},
		{"queue is the inbox's lanes table", "", "q", "q_lanes", "postgres.queue_table", `"q_lanes" collides with inbox.table "q"`},
		{"the same table twice", "t", "public.t", "", "inbox.table", `"public.t" is also outbox.table`},
		{"the migrations book", "omnibus_schema_migrations", "", "", "outbox.table", "omnibus_schema_migrations is the table of applied migrations"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := Config{Outbox: OutboxConfig{Table: tc.outbox}, Inbox: InboxConfig{Table: tc.inbox}, Postgres: PostgresConfig{QueueTable: tc.queue}}
			err := c.Validate()
			require.Error(t, err)
			var ce *ConfigError
			require.ErrorAs(t, err, &ce)
			assert.Equal(t, tc.field, ce.Field, "%v", err)
			assert.Contains(t, ce.Reason, tc.reason)
		})
	}
	for _, c := range []Config{
		{Outbox: OutboxConfig{Table: "a.x"}, Inbox: InboxConfig{Table: "b.x_lanes"}},
		{Outbox: OutboxConfig{Table: "x"}, Inbox: InboxConfig{Table: "x_lane"}},
		{Outbox: OutboxConfig{Table: "X"}, Inbox: InboxConfig{Table: "x"}},
	} {
		assert.NoError(t, c.Validate(), "%s / %s", c.Outbox.Table, c.Inbox.Table)
	}
}

// TestTableObjectSuffixes_CoverTheMigrations keeps the names Validate checks
// for collisions in step with the objects the postgres migrations create.
func TestTableObjectSuffixes_CoverTheMigrations(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob("../transports/postgres/migrations/*.sql")
	require.NoError(t, err)
	require.NotEmpty(t, files)
	suffixRE := regexp.MustCompile(`\{\{\.(?:Ident|Qualified) "([^"]+)"\}\}`)
	for _, f := range files {
		sql, err := os.ReadFile(f)
		require.NoError(t, err)
		for _, m := range suffixRE.FindAllStringSubmatch(string(sql), -1) {
			assert.Contains(t, tableObjectSuffixes, m[1], "%s creates an object named table+%q", filepath.Base(f), m[1])
		}
		if regexp.MustCompile(`\{\{\.Lanes\}\}`).Match(sql) {
			assert.Contains(t, tableObjectSuffixes, "_lanes")
		}
	}
}
