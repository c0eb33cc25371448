package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/transports/postgres"
)

// adminCommand builds `omnibus outbox …` or `omnibus inbox …` (kind).
func (a *app) adminCommand(kind string) *cobra.Command {
	var groupFlag string
	cmd := &cobra.Command{
		Use:   kind,
		Short: "Inspect and repair the " + kind + " table: stats, failed, show, requeue, cleanup, release-leases, sweep-lanes",
		Args:  cobra.ArbitraryArgs,
		RunE:  group,
	}
	if kind == "inbox" {
		cmd.PersistentFlags().StringVar(&groupFlag, "group", "", "restrict to one consumer group (default: every group)")
	}

	// withAdmin loads the config, connects and runs f with the table's Admin.
	withAdmin := func(ctx context.Context, f func(cfg bus.Config, pool *pgxpool.Pool, adm *postgres.Admin) error) error {
		cfg, err := a.loadConfig()
		if err != nil {
			return err
		}
		pool, err := omnibus.Connect(ctx, cfg)
		if err != nil {
			return err
		}
		defer pool.Close()
		var adm *postgres.Admin
		if kind == "outbox" {
			adm, err = postgres.NewAdmin(pool, postgres.OutboxTable(cfg.Outbox.Table))
		} else {
			adm, err = postgres.NewAdmin(pool, postgres.InboxTable(cfg.Inbox.Table))
			if err == nil && groupFlag != "" {
				adm, err = adm.WithConsumerGroup(groupFlag)
			}
		}
		if err != nil {
			return err
		}
		if err := f(cfg, pool, adm); err != nil {
			return explainSchemaError(ctx, adm, err)
		}
		return nil
	}

	var asJSON bool
	stats := &cobra.Command{
		Use:   "stats",
		Short: "Count the table's rows by state, its keys and the age of the oldest pending row",
		Args:  noArgs,
		RunE: a.runE(func(cmd *cobra.Command, _ []string) error {
			return withAdmin(cmd.Context(), func(cfg bus.Config, _ *pgxpool.Pool, adm *postgres.Admin) error {
				st, err := adm.Stats(cmd.Context())
				if err != nil {
					return err
				}
				var shards []topicShards
				if kind == "inbox" {
					shards = a.inboxShards(cmd.Context(), cfg, groupFlag)
				}
				if asJSON {
					return a.printStatsJSON(adm, st, shards)
				}
				a.printStats(adm, st)
				a.printShards(shards)
				return nil
			})
		}),
	}
	stats.Flags().BoolVar(&asJSON, "json", false, "print JSON")

	var limit int
	var after int64
	var failedJSON bool
	failed := &cobra.Command{
		Use:   "failed",
		Short: "List failed rows (spent their attempts or failed permanently), oldest first",
		Long: `failed lists the rows that spent their attempts or failed permanently, in id
order, --limit at a time; page with --after the last id listed. With --json
it prints a JSON array of objects (id, consumer_group for the inbox,
event_id, topic, partition_key, event_type, attempts, max_attempts,
last_error in full, created_at) and the paging hint on stderr.`,
		Args: noArgs,
		RunE: a.runE(func(cmd *cobra.Command, _ []string) error {
			if limit < 1 {
				return usagef("--limit must be at least 1, got %d", limit)
			}
			return withAdmin(cmd.Context(), func(_ bus.Config, _ *pgxpool.Pool, adm *postgres.Admin) error {
				rows, err := adm.ListFailed(cmd.Context(), limit, after)
				if err != nil {
					return err
				}
				if failedJSON {
					return a.printFailedJSON(adm, rows, limit)
				}
				a.printFailed(adm, rows, limit)
				return nil
			})
		}),
	}
	failed.Flags().IntVar(&limit, "limit", postgres.DefaultListLimit, "rows to list at most")
	failed.Flags().Int64Var(&after, "after", 0, "list rows with an id greater than this (paging)")
	failed.Flags().BoolVar(&failedJSON, "json", false, "print a JSON array")

	show := &cobra.Command{
		Use:   "show ID",
		Short: "Print one row in full: every column, metadata, last error and payload",
		Long: `show prints the row ID with every column, its metadata, its full last error
and its payload: indented when it is JSON, as text when it is UTF-8, with
every byte that is not valid UTF-8 written as \xNN otherwise. Control
characters other than newline and tab are escaped too, so no stored byte
can drive the terminal.`,
		Args: exactArgs(1),
		RunE: a.runE(func(cmd *cobra.Command, args []string) error {
			id, err := strconv.ParseInt(args[0], 10, 64)
			if err != nil || id < 1 {
				return usagef("%q is not a row id", args[0])
			}
			return withAdmin(cmd.Context(), func(_ bus.Config, _ *pgxpool.Pool, adm *postgres.Admin) error {
				row, err := adm.Row(cmd.Context(), id)
				if errors.Is(err, postgres.ErrNotFound) {
					return fmt.Errorf("no row %d in %s", id, describe(adm))
				}
				if err != nil {
					return err
				}
				a.printRow(adm, row)
				return nil
			})
		}),
	}

	var all bool
	var batch int
	requeue := &cobra.Command{
		Use:   "requeue {ID... | --all}",
		Short: "Give failed rows a fresh start (pending, 0 attempts, due now)",
		Long: `requeue makes failed rows pending again with their attempts reset, so a relay
or dispatcher delivers them on its next fetch. With the default failed policy
(skip) the rows of their key that went on without them were delivered
already: a requeued row is delivered out of order.`,
		Args: cobra.ArbitraryArgs,
		RunE: a.runE(func(cmd *cobra.Command, args []string) error {
			if all == (len(args) > 0) {
				return usagef("requeue takes row ids or --all, not both and not neither")
			}
			if batch < 1 {
				return usagef("--batch must be at least 1, got %d", batch)
			}
			ids := make([]int64, len(args))
			for i, s := range args {
				id, err := strconv.ParseInt(s, 10, 64)
				if err != nil || id < 1 {
					return usagef("%q is not a row id", s)
				}
				ids[i] = id
			}
			return withAdmin(cmd.Context(), func(_ bus.Config, _ *pgxpool.Pool, adm *postgres.Admin) error {
				ctx := cmd.Context()
				if all {
					st, err := adm.Stats(ctx)
					if err != nil {
						return err
					}
					p := newProgress(a.stderr, "requeue", "rows", st.Failed)
					n, err := adm.RequeueAllFailed(ctx, batch, p.update)
					p.finish()
					fmt.Fprintf(a.stdout, "requeued %s of %s\n", plural(n, "failed row"), describe(adm))
					return err
				}
				var errs []error
				for _, id := range ids {
					if err := adm.Requeue(ctx, id); err != nil {
						if errors.Is(err, postgres.ErrNotFound) {
							err = fmt.Errorf("no failed row %d in %s", id, describe(adm))
						}
						errs = append(errs, err)
						continue
					}
					fmt.Fprintf(a.stdout, "requeued row %d of %s\n", id, describe(adm))
				}
				return errors.Join(errs...)
			})
		}),
	}
	requeue.Flags().BoolVar(&all, "all", false, "requeue every failed row")
	requeue.Flags().IntVar(&batch, "batch", 1000, "rows per transaction with --all")

	var olderThan time.Duration
	var cleanBatch int
	cleanup := &cobra.Command{
		Use:   "cleanup",
		Short: "Delete completed rows older than the retention, in batches",
		Long: `cleanup deletes completed rows that completed more than --older-than ago
(default: the table's retention key, 7 days) in batches of --batch rows.
Pending and failed rows are never deleted. Interrupting it keeps what was
deleted so far.`,
		Args: noArgs,
		RunE: a.runE(func(cmd *cobra.Command, _ []string) error {
			if cleanBatch < 1 {
				return usagef("--batch must be at least 1, got %d", cleanBatch)
			}
			if olderThan < 0 {
				return usagef("--older-than must not be negative, got %s", olderThan)
			}
			return withAdmin(cmd.Context(), func(cfg bus.Config, _ *pgxpool.Pool, adm *postgres.Admin) error {
				ctx := cmd.Context()
				age := olderThan
				if !cmd.Flags().Changed("older-than") {
					age = cfg.Outbox.Retention
					if kind == "inbox" {
						age = cfg.Inbox.Retention
					}
				}
				total, err := adm.CountCompletedOlderThan(ctx, age)
				if err != nil {
					return fmt.Errorf("count completed rows of %s: %w", describe(adm), err)
				}
				p := newProgress(a.stderr, "cleanup", "rows", total)
				n, err := adm.Cleanup(ctx, age, cleanBatch, p.update)
				p.finish()
				fmt.Fprintf(a.stdout, "deleted %s older than %s from %s\n", plural(n, "completed row"), age, describe(adm))
				return err
			})
		}),
	}
	cleanup.Flags().DurationVar(&olderThan, "older-than", 0, "delete rows completed longer ago than this (default: the retention key of the table)")
	cleanup.Flags().IntVar(&cleanBatch, "batch", 1000, "rows per delete statement")

	releaseLeases := &cobra.Command{
		Use:   "release-leases",
		Short: "Clear expired leases on pending rows and lanes",
		Long: `release-leases clears the leases that have expired on pending rows and on
lanes: what a relay or dispatcher left behind when it stopped without settling.
Relays take over expired leases by themselves; this makes the table (and stats)
read true at once. Rows and lanes being locked right now are skipped, and live
leases are never touched.`,
		Args: noArgs,
		RunE: a.runE(func(cmd *cobra.Command, _ []string) error {
			return withAdmin(cmd.Context(), func(_ bus.Config, _ *pgxpool.Pool, adm *postgres.Admin) error {
				rows, lanes, err := adm.ReleaseExpiredLeases(cmd.Context())
				if err != nil {
					return err
				}
				fmt.Fprintf(a.stdout, "released expired leases of %s and %s in %s\n",
					plural(rows, "row"), plural(lanes, "lane"), describe(adm))
				return nil
			})
		}),
	}

	sweepLanes := &cobra.Command{
		Use:   "sweep-lanes",
		Short: "Recreate the lane of every key that has pending rows but no lane",
		Long: `sweep-lanes creates the missing lane of every key with pending rows but
without a lane (rows inserted with triggers disabled, lanes deleted by hand), so
relays see those keys again. Relays run the same sweep periodically
(sweep_interval); this does it now. It covers every consumer group.`,
		Args: noArgs,
		RunE: a.runE(func(cmd *cobra.Command, _ []string) error {
			return withAdmin(cmd.Context(), func(_ bus.Config, _ *pgxpool.Pool, adm *postgres.Admin) error {
				n, err := adm.SweepLanes(cmd.Context())
				if err != nil {
					return err
				}
				fmt.Fprintf(a.stdout, "created %s in %s\n", plural(n, "missing lane"), adm.Table().Name)
				return nil
			})
		}),
	}

	cmd.AddCommand(stats, failed, show, requeue, cleanup, releaseLeases, sweepLanes)
	return cmd
}

// describe names the admin's table (and group) for output.
func describe(adm *postgres.Admin) string {
	if g := adm.ConsumerGroup(); g != "" {
		return fmt.Sprintf("%s (group %s)", adm.Table().Name, g)
	}
	return adm.Table().Name
}

// formatAge renders a duration to the second ("-" for none).
func formatAge(d time.Duration) string {
	if d <= 0 {
		return "-"
	}
	return d.Round(time.Second).String()
}

func (a *app) printStats(adm *postgres.Admin, st postgres.Stats) {
	w := tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintf(w, "table\t%s\n", describe(adm))
	fmt.Fprintf(w, "pending\t%d\n", st.Pending)
	fmt.Fprintf(w, "  due\t%d\n", st.Due)
	fmt.Fprintf(w, "  leased\t%d\n", st.Leased)
	fmt.Fprintf(w, "  expired leases\t%d\n", st.ExpiredLeases)
	fmt.Fprintf(w, "failed\t%d\n", st.Failed)
	fmt.Fprintf(w, "completed\t%d\n", st.Completed)
	fmt.Fprintf(w, "oldest pending age\t%s\n", formatAge(st.OldestPendingAge))
	fmt.Fprintf(w, "keys with pending rows\t%d\n", st.Lanes)
	fmt.Fprintf(w, "keys held by a retrying head\t%d\n", st.HeldKeys)
	fmt.Fprintf(w, "keys blocked by a failed row\t%d\n", st.BlockedKeys)
	_ = w.Flush()
}

func (a *app) printStatsJSON(adm *postgres.Admin, st postgres.Stats, shards []topicShards) error {
	out := struct {
		Table             string        `json:"table"`
		ConsumerGroup     string        `json:"consumer_group,omitempty"`
		Pending           int64         `json:"pending"`
		Due               int64         `json:"due"`
		Leased            int64         `json:"leased"`
		ExpiredLeases     int64         `json:"expired_leases"`
		Failed            int64         `json:"failed"`
		Completed         int64         `json:"completed"`
		OldestPendingSecs float64       `json:"oldest_pending_age_seconds"`
		Lanes             int64         `json:"keys_with_pending_rows"`
		HeldKeys          int64         `json:"held_keys"`
		BlockedKeys       int64         `json:"blocked_keys"`
		Shards            []topicShards `json:"shards,omitempty"`
	}{adm.Table().Name, adm.ConsumerGroup(), st.Pending, st.Due, st.Leased, st.ExpiredLeases, st.Failed,
		st.Completed, st.OldestPendingAge.Seconds(), st.Lanes, st.HeldKeys, st.BlockedKeys, shards}
	enc := json.NewEncoder(a.stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}

func (a *app) printFailed(adm *postgres.Admin, rows []postgres.FailedRow, limit int) {
	if len(rows) == 0 {
		fmt.Fprintf(a.stdout, "no failed rows in %s\n", describe(adm))
		return
	}
	inbox := adm.Table().Kind == postgres.KindInbox
	w := tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', 0)
	header := "ID\tEVENT ID\tTOPIC\tKEY\tTYPE\tATTEMPTS\tCREATED\tERROR"
	if inbox {
		header = "ID\tGROUP\tEVENT ID\tTOPIC\tKEY\tTYPE\tATTEMPTS\tCREATED\tERROR"
	}
	fmt.Fprintln(w, header)
	for _, r := range rows {
		cols := []string{strconv.FormatInt(r.ID, 10)}
		if inbox {
			cols = append(cols, orDash(r.ConsumerGroup))
		}
		cols = append(cols, orDash(r.EventID), r.Topic, orDash(r.PartitionKey), orDash(r.EventType),
			fmt.Sprintf("%d/%d", r.Attempts, r.MaxAttempts), r.CreatedAt.UTC().Format(time.RFC3339), oneLine(r.LastError, 60))
		fmt.Fprintln(w, strings.Join(cols, "\t"))
	}
	_ = w.Flush()
	if len(rows) == limit {
		fmt.Fprintf(a.stdout, "more may follow: --after %d\n", rows[len(rows)-1].ID)
	}
}

// failedJSON is one row of `failed --json`.
type failedJSON struct {
	ID            int64     `json:"id"`
	ConsumerGroup *string   `json:"consumer_group,omitempty"` // inbox only
	EventID       string    `json:"event_id"`
	Topic         string    `json:"topic"`
	PartitionKey  string    `json:"partition_key"`
	EventType     string    `json:"event_type"`
	Attempts      int       `json:"attempts"`
	MaxAttempts   int       `json:"max_attempts"`
	LastError     string    `json:"last_error"`
	CreatedAt     time.Time `json:"created_at"`
}

// printFailedJSON prints rows as a JSON array ([] when none) and, when the
// page is full, the paging hint on stderr so that stdout stays JSON.
func (a *app) printFailedJSON(adm *postgres.Admin, rows []postgres.FailedRow, limit int) error {
	out := make([]failedJSON, len(rows))
	for i, r := range rows {
		out[i] = failedJSON{ID: r.ID, EventID: r.EventID, Topic: r.Topic, PartitionKey: r.PartitionKey,
			EventType: r.EventType, Attempts: r.Attempts, MaxAttempts: r.MaxAttempts, LastError: r.LastError,
			CreatedAt: r.CreatedAt.UTC()}
		if adm.Table().Kind == postgres.KindInbox {
			g := r.ConsumerGroup
			out[i].ConsumerGroup = &g
		}
	}
	enc := json.NewEncoder(a.stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(out); err != nil {
		return err
	}
	if len(rows) == limit {
		fmt.Fprintf(a.stderr, "more may follow: --after %d\n", rows[len(rows)-1].ID)
	}
	return nil
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// oneLine flattens s to one line of at most n runes.
func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return orDash(s)
}

// plural renders "1 row", "2 rows".
func plural(n int64, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// topicShards is the shards of one inbox topic on a broker that shards
// topics (redis with redis.shards above 1).
type topicShards struct {
	Topic  string            `json:"topic"`
	Group  string            `json:"consumer_group"`
	Shards []bus.ShardStatus `json:"shards"`
}

// inboxShards reports the shards of every inbox topic for the group
// (inbox.consumer_group unless --group names another), when the configured
// broker shards topics. A broker it cannot reach is reported on stderr, not
// as a failure of the stats.
func (a *app) inboxShards(ctx context.Context, cfg bus.Config, group string) []topicShards {
	if len(cfg.Inbox.Topics) == 0 || cfg.Broker == bus.BrokerMemory {
		return nil
	}
	if group == "" {
		group = cfg.Inbox.ConsumerGroup
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := bus.OpenBroker(ctx, cfg)
	if err != nil {
		fmt.Fprintf(a.stderr, "shards: %v\n", err)
		return nil
	}
	defer conn.Close()
	var out []topicShards
	for _, topic := range cfg.Inbox.Topics {
		st, err := conn.ShardStatus(ctx, topic, group)
		if err != nil {
			fmt.Fprintf(a.stderr, "shards of topic %q: %v\n", topic, err)
			return out
		}
		if st != nil {
			out = append(out, topicShards{Topic: topic, Group: group, Shards: st})
		}
	}
	return out
}

func (a *app) printShards(topics []topicShards) {
	for _, t := range topics {
		fmt.Fprintf(a.stdout, "\nshards of topic %s, group %s\n", t.Topic, t.Group)
		w := tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(w, "shard\towner\tlag\tpending")
		for _, s := range t.Shards {
			owner, lag := s.Owner, strconv.FormatInt(s.Lag, 10)
			if owner == "" {
				owner = "-"
			}
			if s.Lag < 0 {
				lag = "?"
			}
			pending := strconv.FormatInt(s.Pending, 10)
			if s.Pending < 0 {
				pending = "?"
			}
			fmt.Fprintf(w, "%d\t%s\t%s\t%s\n", s.Shard, owner, lag, pending)
		}
		_ = w.Flush()
	}
}
