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

// Default metrics endpoints of the serving commands when
// observability.metrics_addr is not set: loopback only, and one port per
// command, so a relay and an ingest started from one config on one host do
// not collide.
const (
	relayMetricsAddr  = bus.DefaultMetricsAddr // 127.0.0.1:9464
	ingestMetricsAddr = "127.0.0.1:9465"
)

// defaultMetricsAddr is where command serves its endpoints when raw (the
// config the operator wrote) does not set observability.metrics_addr.
func defaultMetricsAddr(command string) string {
	if command == "ingest" {
		return ingestMetricsAddr
	}
	return relayMetricsAddr
}

// allowMemoryFlag is the acknowledgement relay and ingest need to run on the
// memory broker.
const allowMemoryFlag = "allow-memory-broker"

// checkMemoryBroker refuses the memory broker for relay and ingest unless the
// operator chose it (broker: memory in raw, the config before defaults) and
// acknowledged it (allowed): a relay would mark every outbox row delivered
// into a broker nothing outside the process reads, an ingest would wait for
// messages nothing can publish.
func checkMemoryBroker(raw, cfg bus.Config, command string, allowed bool) error {
	if cfg.Broker != bus.BrokerMemory || (raw.Broker == bus.BrokerMemory && allowed) {
		return nil
	}
	what, consequence, verb := "deliver the outbox into", "which nothing outside this process reads: the rows would be marked delivered and the events lost", "relay into"
	if command == "ingest" {
		what, consequence, verb = "receive from", "which nothing outside this process publishes to: it would store nothing", "ingest from"
	}
	reason := fmt.Sprintf("not set, so %s would %s the in-process memory broker (the default)", command, what)
	if raw.Broker == bus.BrokerMemory {
		reason = fmt.Sprintf("memory: %s would %s the in-process memory broker", command, what)
	}
	return &bus.ConfigError{Field: "broker", Reason: fmt.Sprintf(
		"%s, %s; set broker: kafka|redis|postgres in the config or OMNIBUS_BROKER; "+
			"to %s the in-process memory broker on purpose (tests, demos) set broker: memory and pass --%s", reason, consequence, verb, allowMemoryFlag)}
}

// served is what serve hands to a command's setup.
type served struct {
	bus     *omnibus.Bus
	router  *message.Router
	metrics *metrics
	logger  *slog.Logger
	ready   *readiness
}

func (a *app) relayCommand() *cobra.Command {
	var allowMemory bool
	cmd := &cobra.Command{
		Use:   "relay",
		Short: "Relay the outbox to the broker until SIGINT or SIGTERM",
		Long: `relay delivers the rows of the outbox table to the configured broker, in order
per (topic, partition key), with durable retries, and serves Prometheus
metrics on /metrics, liveness on /healthz and readiness on /readyz
(observability.metrics_addr, default ` + relayMetricsAddr + `). /readyz answers 503
while the outbox table is missing or older than this omnibus, the last fetch
failed, or the database or the broker is unreachable.
Run as many as you like. On SIGINT or SIGTERM it stops fetching, lets in-flight
publishes finish (relay.close_timeout) and releases the rows it had fetched.
It refuses the memory broker unless broker: memory is set and
--allow-memory-broker given.`,
		Args: noArgs,
		RunE: a.runE(func(cmd *cobra.Command, _ []string) error {
			return a.serve(cmd.Context(), "relay", allowMemory, func(s served) (func(), error) {
				b, m := s.bus, s.metrics
				rc := b.RelayConfig()
				rc.Publisher = m.mw.Publisher(b.BrokerName(), rc.Publisher)
				rc.Metrics = m.mw
				rc.Tracing = m.tracing // nil: off
				fetches := &fetchHealth{next: m.pg}
				rc.Subscriber.Observer = fetches
				relay, err := processors.NewOutboxRelay(b.Pool(), rc, s.logger)
				if err != nil {
					return nil, err
				}
				relay.AddTo(s.router)
				adm, err := b.OutboxAdmin()
				if err != nil {
					return nil, err
				}
				if err := m.table(adm); err != nil {
					return nil, err
				}
				s.ready.add("schema", schemaCheck(adm))
				s.ready.add("fetch", fetches.check)
				warnSchema(cmd.Context(), adm, s.logger)
				return func() {}, nil
			})
		}),
	}
	cmd.Flags().BoolVar(&allowMemory, allowMemoryFlag, false, "run on the in-process memory broker (broker: memory) although nothing outside this process reads it: tests and demos only")
	return cmd
}

func (a *app) ingestCommand() *cobra.Command {
	var topics []string
	var allowMemory bool
	cmd := &cobra.Command{
		Use:   "ingest",
		Short: "Store the broker's messages into the inbox until SIGINT or SIGTERM",
		Long: `ingest receives the messages of inbox.topics (or --topic) from the configured
broker as consumer group inbox.consumer_group and stores them in the inbox
table, deduplicated per group; a message is acked only after its row is
committed. Handle the stored rows with a processors.Dispatcher in your
service. Serves /metrics, /healthz and /readyz like relay (default
` + ingestMetricsAddr + `, so that a relay and an ingest of one config can share a
host), and stops the same way.`,
		Args: noArgs,
		RunE: a.runE(func(cmd *cobra.Command, _ []string) error {
			return a.serve(cmd.Context(), "ingest", allowMemory, func(s served) (func(), error) {
				b, m, router := s.bus, s.metrics, s.router
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
					ingest, err := processors.NewInboxIngest(b.Pool(), ic, s.logger)
					if err != nil {
						return nil, err
					}
					closers = append(closers, ingest.Close)
					ingest.AddTo(router)
				}
				// Shard owners, lag and pending, on a broker that shards topics.
				if _, err := processors.NewShardCollector(m.reg, b, b.Config().Inbox.ConsumerGroup, list, 0); err != nil {
					return nil, err
				}
				adm, err := b.InboxAdmin(b.Config().Inbox.ConsumerGroup)
				if err != nil {
					return nil, err
				}
				if err := m.table(adm); err != nil {
					return nil, err
				}
				s.ready.add("schema", schemaCheck(adm))
				warnSchema(cmd.Context(), adm, s.logger)
				return func() {
					for _, c := range closers {
						_ = c()
					}
				}, nil
			})
		}),
	}
	cmd.Flags().StringSliceVar(&topics, "topic", nil, "broker topic to ingest (repeatable; default inbox.topics)")
	cmd.Flags().BoolVar(&allowMemory, allowMemoryFlag, false, "run on the in-process memory broker (broker: memory) although nothing outside this process publishes to it: tests and demos only")
	return cmd
}

// warnSchema logs, once at start, that adm's table is missing or outdated:
// the command keeps running (and /readyz says why it is not ready) and picks
// the table up once `omnibus migrate` has run.
func warnSchema(ctx context.Context, adm *postgres.Admin, logger *slog.Logger) {
	st, err := adm.SchemaState(ctx)
	if err != nil {
		return // the fetches and /readyz report it
	}
	if p := schemaProblem(adm, st, nil); p != nil {
		logger.Warn("not ready: "+p.Error(), "table", adm.Table().Name)
	}
}

// serve runs a router built by setup until SIGINT/SIGTERM (or ctx ends),
// with the metrics endpoint, then shuts down gracefully. setup returns what
// to run after the router has stopped.
func (a *app) serve(ctx context.Context, name string, allowMemory bool, setup func(served) (func(), error)) error {
	raw, cfg, err := a.loadConfigs()
	if err != nil {
		return err
	}
	if err := checkMemoryBroker(raw, cfg, name, allowMemory); err != nil {
		return err
	}
	if raw.Observability.MetricsAddr == "" {
		cfg.Observability.MetricsAddr = defaultMetricsAddr(name)
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
	ready := &readiness{}
	ready.add("router", func(context.Context) error {
		if !router.IsRunning() {
			return errors.New("not running")
		}
		return nil
	})
	ready.add("database", func(ctx context.Context) error {
		if err := b.Pool().Ping(ctx); err != nil {
			return fmt.Errorf("unreachable: %s", bus.RedactDSN(err.Error()))
		}
		return nil
	})
	after, err := setup(served{bus: b, router: router, metrics: m, logger: logger, ready: ready})
	if err != nil {
		return err
	}
	ready.add("broker", brokerCheck(cfg))

	srv, err := a.startMetrics(cfg, m, router, ready, logger)
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

// startMetrics serves /metrics, /healthz (alive: the router runs) and
// /readyz (every readiness check passes) unless metrics are off.
func (a *app) startMetrics(cfg bus.Config, m *metrics, router *message.Router, ready *readiness, logger *slog.Logger) (*http.Server, error) {
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
		if !router.IsRunning() {
			http.Error(w, "router not running", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.Handle("GET /readyz", ready)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			logger.Error("metrics endpoint", "error", err)
		}
	}()
	logger.Info("serving /metrics, /healthz and /readyz", "addr", ln.Addr().String())
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
