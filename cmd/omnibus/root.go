package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/omnibus-go/omnibus/bus"
	_ "github.com/omnibus-go/omnibus/transports/all" // every built-in broker
)

// Exit statuses.
const (
	exitOK      = 0
	exitFailure = 1 // the operation failed at run time
	exitUsage   = 2 // bad flags, arguments or configuration
)

// usageError marks an error as bad usage (exit 2).
type usageError struct{ err error }

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

func usagef(format string, args ...any) error {
	return &usageError{fmt.Errorf(format, args...)}
}

// app is one invocation of the command: its streams, flags and environment.
type app struct {
	stdout, stderr io.Writer
	lookupEnv      func(string) (string, bool)
	// environ lists the environment (os.Environ) for the check that every
	// OMNIBUS_* variable sets a key; nil skips the check (tests).
	environ func() []string

	configPath string
	logLevel   string
	logFormat  string

	started bool // a command's RunE began: errors from then on are run-time errors unless marked

	// hooks for tests
	onListen func(addr string) // called with the metrics endpoint's address
}

// run executes the command line args and returns the exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	a := &app{stdout: stdout, stderr: stderr, lookupEnv: os.LookupEnv, environ: os.Environ}
	return a.run(ctx, args)
}

func (a *app) run(ctx context.Context, args []string) int {
	root := a.rootCommand()
	if args == nil {
		args = []string{} // cobra would read os.Args
	}
	root.SetArgs(args)
	root.SetOut(a.stdout)
	root.SetErr(a.stderr)
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return exitOK
	}
	code := exitFailure
	var ue *usageError
	switch {
	case errors.As(err, &ue), errors.Is(err, bus.ErrInvalidConfig), !a.started:
		code = exitUsage
	}
	fmt.Fprintf(a.stderr, "omnibus: %v\n", err)
	if code == exitUsage && !errors.Is(err, bus.ErrInvalidConfig) {
		fmt.Fprintf(a.stderr, "Run '%s --help' for usage.\n", cmd.CommandPath())
	}
	return code
}

func (a *app) rootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:   "omnibus",
		Short: "Run omnibus's outbox relay, inbox ingest and admin operations",
		Long: `omnibus runs the processors of the omnibus message bus (outbox relay, inbox
ingest) and its admin operations from a configuration file and OMNIBUS_*
environment variables (which win). See docs/configuration.md.

Exit status: 0 success, 1 runtime failure, 2 bad usage or configuration.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          noArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return usagef("missing command")
		},
	}
	root.Version = buildVersion()
	root.SetVersionTemplate("{{.Version}}\n")
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return &usageError{err} })
	root.CompletionOptions.DisableDefaultCmd = true
	pf := root.PersistentFlags()
	defaultConfig, _ := a.lookupEnv("OMNIBUS_CONFIG")
	pf.StringVar(&a.configPath, "config", defaultConfig, "YAML configuration file (default $OMNIBUS_CONFIG; none: defaults and OMNIBUS_* variables only)")
	pf.StringVar(&a.logLevel, "log-level", "", "log level: debug, info, warn or error (overrides observability.log_level)")
	pf.StringVar(&a.logFormat, "log-format", "", "log format: text or json (overrides observability.log_format)")

	root.AddCommand(
		a.migrateCommand(),
		a.relayCommand(),
		a.ingestCommand(),
		a.adminCommand("outbox"),
		a.adminCommand("inbox"),
		a.configCommand(),
		a.demoCommand(),
		a.devCommand(),
		a.consoleCommand(),
	)
	return root
}

// runE wraps a command's body: from here on errors are run-time failures
// unless they are usage or config errors.
func (a *app) runE(f func(cmd *cobra.Command, args []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		a.started = true
		return f(cmd, args)
	}
}

// group is the RunE of a command that only holds subcommands.
func group(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usagef("unknown command %q for %q", args[0], cmd.CommandPath())
	}
	names := make([]string, 0, len(cmd.Commands()))
	for _, c := range cmd.Commands() {
		names = append(names, c.Name())
	}
	return usagef("%s needs a subcommand: %s", cmd.CommandPath(), strings.Join(names, ", "))
}

func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usagef("unknown command %q for %q", args[0], cmd.CommandPath())
	}
	return nil
}

func exactArgs(n int) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) != n {
			return usagef("%s takes %d argument(s), got %d", cmd.CommandPath(), n, len(args))
		}
		return nil
	}
}

// loadConfig reads --config and the environment, applies the --log-* flags,
// fills in defaults and validates.
func (a *app) loadConfig() (bus.Config, error) {
	_, cfg, err := a.loadConfigs()
	return cfg, err
}

// loadConfigs is loadConfig that also returns the raw config (before
// defaults), for the decisions that depend on what the operator set.
func (a *app) loadConfigs() (raw, cfg bus.Config, err error) {
	raw, err = a.loadRawConfig()
	if err != nil {
		return bus.Config{}, bus.Config{}, err
	}
	cfg = raw.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return bus.Config{}, bus.Config{}, err
	}
	return raw, cfg, nil
}

// loadRawConfig is the config file, the environment and the flags, before
// defaults: what the operator set.
func (a *app) loadRawConfig() (bus.Config, error) {
	var cfg bus.Config
	if a.configPath != "" {
		data, err := os.ReadFile(a.configPath)
		if err != nil {
			return bus.Config{}, &bus.ConfigError{Reason: fmt.Sprintf("read config file: %v", err)}
		}
		if cfg, err = bus.ParseConfig(data); err != nil {
			return bus.Config{}, fmt.Errorf("%s: %w", a.configPath, err)
		}
	}
	if a.environ != nil {
		if err := bus.CheckEnv(a.environ()); err != nil {
			return bus.Config{}, err
		}
	}
	if err := cfg.ApplyEnv(a.lookupEnv); err != nil {
		return bus.Config{}, err
	}
	if a.logLevel != "" {
		cfg.Observability.LogLevel = a.logLevel
	}
	if a.logFormat != "" {
		cfg.Observability.LogFormat = a.logFormat
	}
	return cfg, nil
}

// logger builds the logger cfg.Observability asks for, writing to stderr.
func (a *app) logger(cfg bus.Config) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(cfg.Observability.LogLevel))
	opts := &slog.HandlerOptions{Level: level}
	if cfg.Observability.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(a.stderr, opts))
	}
	return slog.New(slog.NewTextHandler(a.stderr, opts))
}
