package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os/signal"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/middleware"
	"github.com/omnibus-go/omnibus/processors"
	"github.com/omnibus-go/omnibus/transports/postgres"
)

func (a *app) relayCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "relay",
		Short: "Relay the outbox to the broker until SIGINT or SIGTERM",
		Long: `relay delivers the rows of the outbox table to the configured broker, in order
per (topic, partition key), with durable retries, and serves Prometheus
metrics on /metrics and a health check on /healthz (observability.metrics_addr).
Run as many as you like. On SIGINT or SIGTERM it stops fetching, lets in-flight
publishes finish (relay.close_timeout) and releases the rows it had fetched.`,
		Args: noArgs,
		RunE: a.runE(func(cmd *cobra.Command, _ []string) error {
			return a.serve(cmd.Context(), "relay", func(b *omnibus.Bus, router *message.Router, m *metrics, logger *slog.Logger) (func(), error) {
				rc := b.RelayConfig()
				rc.Publisher = m.mw.Publisher(b.BrokerName(), rc.Publisher)
				rc.Metrics = m.mw
				rc.Tracing = m.tracing // nil: off
				rc.Subscriber.Observer = m.pg
				relay, err := processors.NewOutboxRelay(b.Pool(), rc, logger)
				if err != nil {
					return nil, err
				}
				relay.AddTo(router)
				adm, err := b.OutboxAdmin()
				if err != nil {
					return nil, err
				}
				if err := m.table(adm); err != nil {
					return nil, err
				}
				return func() {}, nil
			})
		}),
	}
}

func (a *app) ingestCommand() *cobra.Command {
	var topics []string
	cmd := &cobra.Command{
		Use:   "ingest",
		Short: "Store the broker's messages into the inbox until SIGINT or SIGTERM",
		Long: `ingest receives the messages of inbox.topics (or --topic) from the configured
broker as consumer group inbox.consumer_group and stores them in the inbox
table, deduplicated per group; a message is acked only after its row is
committed. Handle the stored rows with a processors.Dispatcher in your
service. Serves /metrics and /healthz like relay, and stops the same way.`,
		Args: noArgs,
		RunE: a.runE(func(cmd *cobra.Command, _ []string) error {
			return a.serve(cmd.Context(), "ingest", func(b *omnibus.Bus, router *message.Router, m *metrics, logger *slog.Logger) (func(), error) {
				list := topics
				if len(list) == 0 {
					list = b.Config().Inbox.Topics
				}
				if len(list) == 0 {
					return nil, &bus.ConfigError{Field: "inbox.topics", Reason: "required by ingest: the broker topics to store into the inbox (or --topic)"}
				}
				// Router-level, so that they run outside each handler's Retry.
				if m.tracing != nil {
					router.AddMiddleware(m.tracing.Middleware)
				}
				router.AddMiddleware(m.mw.Middleware)
				var closers []func() error
				for _, topic := range list {
					ic, err := b.IngestConfig(topic)
					if err != nil {
						return nil, err
					}
					ic.Breaker.OnStateChange = m.mw.BreakerStateChange(ic.HandlerName)
					ic.Inbox.Observer = m.pg // new and duplicate messages
					ingest, err := processors.NewInboxIngest(b.Pool(), ic, logger)
					if err != nil {
						return nil, err
					}
					closers = append(closers, ingest.Close)
					ingest.AddTo(router)
				}
				adm, err := b.InboxAdmin(b.Config().Inbox.ConsumerGroup)
				if err != nil {
					return nil, err
				}
				if err := m.table(adm); err != nil {
					return nil, err
				}
				return func() {
					for _, c := range closers {
						_ = c()
					}
				}, nil
			})
		}),
	}
	cmd.Flags().StringSliceVar(&topics, "topic", nil, "broker topic to ingest (repeatable; default inbox.topics)")
	return cmd
}

// serve runs a router built by setup until SIGINT/SIGTERM (or ctx ends),
// with the metrics endpoint, then shuts down gracefully. setup returns what
// to run after the router has stopped.
func (a *app) serve(ctx context.Context, name string, setup func(*omnibus.Bus, *message.Router, *metrics, *slog.Logger) (func(), error)) error {
	cfg, err := a.loadConfig()
	if err != nil {
		return err
	}
	logger := a.logger(cfg).With("command", name)
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	b, err := openWhenReachable(ctx, cfg, logger) // waits for PostgreSQL and the broker (startup.go)
	if err != nil || b == nil {
		return err // b == nil: stopped while waiting
	}
	defer func() { _ = b.Close() }()

	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: cfg.Relay.CloseTimeout}, bus.WatermillLogger(logger))
	if err != nil {
		return err
	}
	m, err := newMetrics()
	if err != nil {
		return err
	}
	tracing, shutdownTracing, err := startTracing(ctx, cfg, "omnibus-"+name)
	if err != nil {
		return err
	}
	defer func() {
		// Export what the last spans recorded before the process ends.
		shutCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := shutdownTracing(shutCtx); err != nil {
			logger.Warn("flushing traces", "error", err)
		}
	}()
	m.tracing = tracing
	after, err := setup(b, router, m, logger)
	if err != nil {
		return err
	}

	srv, err := a.startMetrics(cfg, m, router, b.Pool(), logger)
	if err != nil {
		return err
	}
	logger.Info("started", "broker", cfg.Broker, "outbox", cfg.Outbox.Table, "inbox", cfg.Inbox.Table)
	runErr := router.Run(ctx) // returns once ctx ends and the router has closed
	after()
	if srv != nil {
		shutCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = srv.Shutdown(shutCtx)
		cancel()
	}
	if runErr != nil && ctx.Err() == nil {
		return runErr
	}
	logger.Info("stopped")
	return nil
}

// startMetrics serves /metrics and /healthz unless metrics are off.
func (a *app) startMetrics(cfg bus.Config, m *metrics, router *message.Router, pool *pgxpool.Pool, logger *slog.Logger) (*http.Server, error) {
	if cfg.Observability.MetricsAddr == bus.MetricsOff {
		return nil, nil
	}
	ln, err := net.Listen("tcp", cfg.Observability.MetricsAddr)
	if err != nil {
		return nil, fmt.Errorf("metrics endpoint (observability.metrics_addr): %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		switch {
		case !router.IsRunning():
			http.Error(w, "router not running", http.StatusServiceUnavailable)
		case pool.Ping(ctx) != nil:
			http.Error(w, "database unreachable", http.StatusServiceUnavailable)
		default:
			_, _ = w.Write([]byte("ok\n"))
		}
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			logger.Error("metrics endpoint", "error", err)
		}
	}()
	logger.Info("serving /metrics and /healthz", "addr", ln.Addr().String())
	if a.onListen != nil {
		a.onListen(ln.Addr().String())
	}
	return srv, nil
}

// metrics is the command's own Prometheus registry with omnibus's
// instruments on it (docs/observability.md): handler, publisher and breaker
// metrics, the subscribers' statements, and the table's backlog.
//
// tracing is nil unless observability.traces is otlp.
type metrics struct {
	reg     *prometheus.Registry
	mw      *middleware.Metrics
	pg      *postgres.Metrics
	tracing *middleware.Tracing
}

func newMetrics() (*metrics, error) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	mw, err := middleware.NewMetrics(reg, middleware.MetricsConfig{})
	if err != nil {
		return nil, err
	}
	pg, err := postgres.NewMetrics(reg)
	if err != nil {
		return nil, err
	}
	return &metrics{reg: reg, mw: mw, pg: pg}, nil
}

// table exports the backlog of adm's table (read at most every
// postgres.DefaultStatsInterval).
func (m *metrics) table(adm *postgres.Admin) error {
	_, err := postgres.NewStatsCollector(adm, m.reg, 0)
	return err
}

// startTracing sets up span export when observability.traces is otlp and
// returns the Tracing middleware (nil when traces are off) and a shutdown
// that flushes what is buffered. Spans go over OTLP/HTTP to
// observability.otlp_endpoint, else to the endpoint of the standard OTEL_*
// variables; the service name is service unless OTEL_SERVICE_NAME (or
// OTEL_RESOURCE_ATTRIBUTES) says otherwise.
func startTracing(ctx context.Context, cfg bus.Config, service string) (*middleware.Tracing, func(context.Context) error, error) {
	if cfg.Observability.Traces != bus.TracesOTLP {
		return nil, func(context.Context) error { return nil }, nil
	}
	var opts []otlptracehttp.Option
	if e := cfg.Observability.OTLPEndpoint; e != "" {
		opts = append(opts, otlptracehttp.WithEndpointURL(e))
	}
	exporter, err := otlptracehttp.New(ctx, opts...)
	if err != nil {
		return nil, nil, fmt.Errorf("trace exporter (observability.otlp_endpoint): %w", err)
	}
	res, err := resource.New(ctx,
		resource.WithAttributes(attribute.String("service.name", service)),
		resource.WithFromEnv(), // OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES win
	)
	if err != nil {
		return nil, nil, fmt.Errorf("trace resource: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exporter), sdktrace.WithResource(res))
	return middleware.NewTracing(middleware.TracingConfig{TracerProvider: tp}), tp.Shutdown, nil
}
