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

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/middleware"
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
			return a.serve(cmd.Context(), "relay", func(b *omnibus.Bus, router *message.Router, m *metrics) (func(), error) {
				relay, err := b.NewRelay()
				if err != nil {
					return nil, err
				}
				h := relay.AddTo(router)
				h.AddMiddleware(m.handlerMiddleware("relay", relay.Subscriber().Config().Table))
				m.breaker("relay", relay.Breaker())
				adm, err := b.OutboxAdmin()
				if err != nil {
					return nil, err
				}
				m.table("outbox", adm)
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
			return a.serve(cmd.Context(), "ingest", func(b *omnibus.Bus, router *message.Router, m *metrics) (func(), error) {
				list := topics
				if len(list) == 0 {
					list = b.Config().Inbox.Topics
				}
				if len(list) == 0 {
					return nil, &bus.ConfigError{Field: "inbox.topics", Reason: "required by ingest: the broker topics to store into the inbox (or --topic)"}
				}
				var closers []func() error
				for _, topic := range list {
					ingest, err := b.NewIngest(topic)
					if err != nil {
						return nil, err
					}
					closers = append(closers, ingest.Close)
					h := ingest.AddTo(router)
					h.AddMiddleware(m.handlerMiddleware("ingest", topic))
					m.breaker("ingest_"+topic, ingest.Breaker())
				}
				adm, err := b.InboxAdmin(b.Config().Inbox.ConsumerGroup)
				if err != nil {
					return nil, err
				}
				m.table("inbox", adm)
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
func (a *app) serve(ctx context.Context, name string, setup func(*omnibus.Bus, *message.Router, *metrics) (func(), error)) error {
	cfg, err := a.loadConfig()
	if err != nil {
		return err
	}
	logger := a.logger(cfg).With("command", name)
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	b, err := omnibus.Open(ctx, cfg, omnibus.WithLogger(logger))
	if err != nil {
		return err
	}
	defer func() { _ = b.Close() }()

	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: cfg.Relay.CloseTimeout}, bus.WatermillLogger(logger))
	if err != nil {
		return err
	}
	m := newMetrics()
	after, err := setup(b, router, m)
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

// metrics is the command's own Prometheus registry.
type metrics struct {
	reg      *prometheus.Registry
	handled  *prometheus.CounterVec
	duration *prometheus.HistogramVec
}

func newMetrics() *metrics {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m := &metrics{
		reg: reg,
		handled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "omnibus_processor_messages_total",
			Help: "Messages handled by a processor (relay: published; ingest: stored), by outcome (ok or error; an error is retried or failed per its class).",
		}, []string{"processor", "source", "outcome"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "omnibus_processor_handle_duration_seconds",
			Help:    "Time to handle one message (relay: publish to the broker; ingest: store in the inbox).",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}, []string{"processor", "source"}),
	}
	reg.MustRegister(m.handled, m.duration)
	return m
}

// handlerMiddleware counts and times each handler call.
func (m *metrics) handlerMiddleware(processor, source string) message.HandlerMiddleware {
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			start := time.Now()
			out, err := h(msg)
			m.duration.WithLabelValues(processor, source).Observe(time.Since(start).Seconds())
			outcome := "ok"
			if err != nil {
				outcome = "error"
			}
			m.handled.WithLabelValues(processor, source, outcome).Inc()
			return out, err
		}
	}
}

// breaker exports a circuit breaker's state (0 closed, 1 open, 2 half-open).
func (m *metrics) breaker(processor string, b *middleware.CircuitBreaker) {
	m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name:        "omnibus_processor_breaker_state",
		Help:        "Circuit breaker state: 0 closed, 1 open (failing fast, no attempts spent), 2 half-open.",
		ConstLabels: prometheus.Labels{"processor": processor},
	}, func() float64 { return float64(b.State()) }))
}

// table exports the table's Stats, taken at scrape time.
func (m *metrics) table(kind string, adm *postgres.Admin) {
	m.reg.MustRegister(&tableCollector{kind: kind, adm: adm, labels: prometheus.Labels{"table": adm.Table().Name}})
}

type tableCollector struct {
	kind   string
	adm    *postgres.Admin
	labels prometheus.Labels
}

func (c *tableCollector) desc(name, help string, variable ...string) *prometheus.Desc {
	return prometheus.NewDesc("omnibus_"+c.kind+"_"+name, help, variable, c.labels)
}

// Describe sends the descriptions without touching the database.
func (c *tableCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs() {
		ch <- d
	}
}

func (c *tableCollector) descs() []*prometheus.Desc {
	return []*prometheus.Desc{
		c.desc("stats_up", "1 when the table's stats could be read at this scrape."),
		c.desc("rows", "Rows by state: pending (all), due, leased, expired_lease (subsets of pending), failed, completed.", "state"),
		c.desc("oldest_pending_age_seconds", "Age of the oldest pending row; 0 when none."),
		c.desc("keys", "Keys (topic, partition key) with pending rows."),
		c.desc("held_keys", "Keys held back behind a head waiting for its retry."),
		c.desc("blocked_keys", "Keys frozen behind a failed row (failed_policy block)."),
	}
}

func (c *tableCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	d := c.descs()
	up := d[0]
	st, err := c.adm.Stats(ctx)
	if err != nil {
		ch <- prometheus.MustNewConstMetric(up, prometheus.GaugeValue, 0)
		return
	}
	ch <- prometheus.MustNewConstMetric(up, prometheus.GaugeValue, 1)
	rows := d[1]
	for state, v := range map[string]int64{
		"pending": st.Pending, "due": st.Due, "leased": st.Leased, "expired_lease": st.ExpiredLeases,
		"failed": st.Failed, "completed": st.Completed,
	} {
		ch <- prometheus.MustNewConstMetric(rows, prometheus.GaugeValue, float64(v), state)
	}
	ch <- prometheus.MustNewConstMetric(d[2], prometheus.GaugeValue, st.OldestPendingAge.Seconds())
	ch <- prometheus.MustNewConstMetric(d[3], prometheus.GaugeValue, float64(st.Lanes))
	ch <- prometheus.MustNewConstMetric(d[4], prometheus.GaugeValue, float64(st.HeldKeys))
	ch <- prometheus.MustNewConstMetric(d[5], prometheus.GaugeValue, float64(st.BlockedKeys))
}
