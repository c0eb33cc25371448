package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/console"
	"github.com/omnibus-go/omnibus/transports/postgres"
)

// Environment variables holding the console's credentials: never flags, so
// they stay out of process listings and shell history.
const (
	envConsoleToken     = "OMNIBUS_CONSOLE_TOKEN"
	envConsoleBasicAuth = "OMNIBUS_CONSOLE_BASIC_AUTH" // user:password
)

// The CLI's own variables set no configuration key.
func init() { bus.ReserveEnv("OMNIBUS_CONFIG", envConsoleToken, envConsoleBasicAuth) }

// consoleCommand builds `omnibus console`.
func (a *app) consoleCommand() *cobra.Command {
	var (
		listen   string
		readOnly bool
		refresh  time.Duration
	)
	cmd := &cobra.Command{
		Use:   "console",
		Short: "Serve the admin web console: backlog, held keys, failed rows, relays (127.0.0.1:8090)",
		Long: `console serves the admin web console over the configured outbox and inbox
tables: an overview that refreshes itself, held keys, failed rows with
filters and a row's detail, and the relays holding leases; requeue, discard,
release-leases and sweep-lanes as confirmed actions. See docs/console.md.

It listens on 127.0.0.1:8090 by default. A --listen address that is not
loopback needs credentials: ` + envConsoleToken + ` (a bearer token, or
the password of HTTP basic auth with any user name) or
` + envConsoleBasicAuth + `=user:password. --read-only hides every action.`,
		Args: noArgs,
		RunE: a.runE(func(cmd *cobra.Command, _ []string) error {
			ccfg := console.Config{ReadOnly: readOnly, RefreshInterval: refresh}
			ccfg.Token, _ = a.lookupEnv(envConsoleToken)
			if basic, ok := a.lookupEnv(envConsoleBasicAuth); ok && basic != "" {
				user, pw, ok := strings.Cut(basic, ":")
				if !ok || user == "" || pw == "" {
					return usagef("%s: want user:password", envConsoleBasicAuth)
				}
				ccfg.BasicAuthUser, ccfg.BasicAuthPassword = user, pw
			}
			if refresh <= 0 {
				return usagef("--refresh must be positive, got %s", refresh)
			}
			if err := ccfg.ValidateListen(listen); err != nil {
				return usagef("--listen: %v; set %s or %s=user:password", err, envConsoleToken, envConsoleBasicAuth)
			}
			cfg, err := a.loadConfig()
			if err != nil {
				return err
			}
			logger := a.logger(cfg)
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			pool, err := omnibus.Connect(ctx, cfg)
			if err != nil {
				return err
			}
			defer pool.Close()
			out, err := postgres.NewAdmin(pool, postgres.OutboxTable(cfg.Outbox.Table))
			if err != nil {
				return err
			}
			in, err := postgres.NewAdmin(pool, postgres.InboxTable(cfg.Inbox.Table))
			if err != nil {
				return err
			}
			ccfg.Tables = []*postgres.Admin{out, in}
			c, err := console.New(ccfg, logger)
			if err != nil {
				return err
			}
			defer c.Close()
			ln, err := net.Listen("tcp", listen)
			if err != nil {
				return fmt.Errorf("console: listen on %s: %w", listen, err)
			}
			srv := &http.Server{Handler: c, ReadHeaderTimeout: 5 * time.Second}
			served := make(chan error, 1)
			go func() { served <- srv.Serve(ln) }()
			logger.Info("serving the admin console", "url", "http://"+ln.Addr().String()+"/", "read_only", readOnly,
				"auth", ccfg.HasAuth())
			if a.onListen != nil {
				a.onListen(ln.Addr().String())
			}
			select {
			case err := <-served:
				return fmt.Errorf("console: serve: %w", err)
			case <-ctx.Done():
			}
			shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := srv.Shutdown(shutdown); err != nil && !errors.Is(err, http.ErrServerClosed) {
				return fmt.Errorf("console: shut down: %w", err)
			}
			logger.Info("stopped")
			return nil
		}),
	}
	cmd.Flags().StringVar(&listen, "listen", console.DefaultListen, "address to serve on (not loopback: needs "+envConsoleToken+" or "+envConsoleBasicAuth+")")
	cmd.Flags().BoolVar(&readOnly, "read-only", false, "hide every action; serve the pages only")
	cmd.Flags().DurationVar(&refresh, "refresh", console.DefaultRefreshInterval, "how often the overview refreshes itself")
	return cmd
}
