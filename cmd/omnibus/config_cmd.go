package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/transports/postgres"
)

func (a *app) configCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "config",
		Short: "Inspect the configuration",
		Args:  cobra.ArbitraryArgs,
		RunE:  group,
	}
	cmd.AddCommand(&cobra.Command{
		Use:   "check",
		Short: "Load and validate the configuration, then print it with secrets redacted",
		Long: `check loads --config and the OMNIBUS_* environment variables, fills in the
defaults, validates the result and prints it as YAML with every secret
redacted. It exits 2, naming the key at fault, when the configuration is
invalid. It does not connect to anything.`,
		Args: noArgs,
		RunE: a.runE(func(cmd *cobra.Command, _ []string) error {
			raw, cfg, err := a.loadConfigs()
			if err != nil {
				return err
			}
			source := "defaults and environment"
			if a.configPath != "" {
				source = a.configPath
			}
			fmt.Fprintf(a.stdout, "# configuration OK (from %s); secrets redacted\n%s", source, cfg.String())
			if raw.Observability.MetricsAddr == "" {
				fmt.Fprintf(a.stdout, "# observability.metrics_addr is not set: relay serves on %s, ingest on %s\n",
					defaultMetricsAddr("relay"), defaultMetricsAddr("ingest"))
			}
			return nil
		}),
	})
	return cmd
}

// migrationTables are the tables migrate creates for cfg: the outbox; the
// inbox when raw (the config before defaults) configures one (inbox.table,
// inbox.topics or inbox.consumer_group), so a service that only writes
// events gets no inbox it does not use; and the queue table when the broker
// is postgres.
func migrationTables(raw, cfg bus.Config) []postgres.Table {
	tables := omnibus.Tables(cfg)
	if raw.Inbox.Table == "" && len(raw.Inbox.Topics) == 0 && raw.Inbox.ConsumerGroup == "" {
		tables = tables[:1] // the outbox
	}
	if cfg.Broker == bus.BrokerPostgres {
		queue := postgres.InboxTable(cfg.Postgres.QueueTable)
		queue.PartitionInterval = cfg.Inbox.PartitionInterval
		tables = append(tables, queue)
	}
	return tables
}

func (a *app) migrateCommand() *cobra.Command {
	var print bool
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Create or upgrade the outbox and inbox tables",
		Long: `migrate applies omnibus's versioned migrations to the outbox table, the inbox
table (when the config sets inbox.table, inbox.topics or inbox.consumer_group)
and, with broker postgres, the queue table, under an advisory lock;
running it again is a no-op. With --print it prints the SQL instead, for
your own migration tool, without connecting.`,
		Args: noArgs,
		RunE: a.runE(func(cmd *cobra.Command, _ []string) error {
			raw, err := a.loadRawConfig()
			if err != nil {
				return err
			}
			cfg := raw.WithDefaults()
			if err := cfg.Validate(); err != nil {
				return err
			}
			tables := migrationTables(raw, cfg)
			if print {
				sql, err := postgres.MigrationSQL(tables...)
				if err != nil {
					return err
				}
				fmt.Fprint(a.stdout, sql)
				return nil
			}
			return a.migrate(cmd.Context(), cfg, tables)
		}),
	}
	cmd.Flags().BoolVar(&print, "print", false, "print the SQL instead of applying it")
	return cmd
}

func (a *app) migrate(ctx context.Context, cfg bus.Config, tables []postgres.Table) error {
	pool, err := omnibus.Connect(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	// Read the tables' versions first, to say whether migrate applied anything.
	current := true
	for _, t := range tables {
		adm, err := postgres.NewAdmin(pool, t)
		if err != nil {
			return err
		}
		st, err := adm.SchemaState(ctx)
		if err != nil {
			return err
		}
		current = current && st.Exists && st.Version >= st.Latest
	}
	if err := postgres.Migrate(ctx, pool, tables...); err != nil {
		return err
	}
	names := make([]string, len(tables))
	for i, t := range tables {
		names[i] = fmt.Sprintf("%s (%s)", t.Name, t.Kind)
	}
	if current {
		fmt.Fprintf(a.stdout, "already up to date: %s at version %d\n", strings.Join(names, ", "), postgres.LatestSchemaVersion())
		return nil
	}
	fmt.Fprintf(a.stdout, "migrated %s to version %d\n", strings.Join(names, ", "), postgres.LatestSchemaVersion())
	return nil
}
