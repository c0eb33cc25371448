package processors_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/internal/testenv"
	"github.com/omnibus-go/omnibus/middleware"
	"github.com/omnibus-go/omnibus/processors"
	"github.com/omnibus-go/omnibus/transports/postgres"
)

// histogramSum adds up the sample sums of every series of a histogram.
func histogramSum(t *testing.T, g prometheus.Gatherer, name string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	require.NoError(t, err)
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() == name && mf.GetType() == dto.MetricType_HISTOGRAM {
			for _, m := range mf.GetMetric() {
				sum += m.GetHistogram().GetSampleSum()
			}
		}
	}
	return sum
}

// The acceptance scenario: three rows delivered, one counted retry, one
// failed (a row with a budget of two attempts whose publish always fails).
func TestOutboxRelay_MetricsMatchAKnownScenario(t *testing.T) {
	t.Parallel()
	pool, ob := newTable(t)
	reg := prometheus.NewRegistry()
	metrics, err := middleware.NewMetrics(reg, middleware.MetricsConfig{})
	require.NoError(t, err)
	pgMetrics, err := postgres.NewMetrics(reg)
	require.NoError(t, err)
	admin, err := postgres.NewAdmin(pool, postgres.OutboxTable(ob.Table()))
	require.NoError(t, err)
	_, err = postgres.NewStatsCollector(admin, reg, time.Nanosecond) // fresh figures on every scrape
	require.NoError(t, err)

	doomed := keyed("d", "doomed")
	postgres.SetMaxAttempts(doomed, 2)
	require.NoError(t, ob.Enqueue(context.Background(), pool, "orders",
		keyed("a", "ok-1"), keyed("b", "ok-2"), keyed("c", "ok-3"), doomed))
	tgt := newTarget(func(payload string, _ int) error {
		if payload == "doomed" {
			return errors.New("rejected by the broker")
		}
		return nil
	})
	startRelay(t, pool, processors.OutboxRelayConfig{
		Publisher: metrics.Publisher("test", tgt),
		Subscriber: postgres.SubscriberConfig{
			Table: ob.Table(), PollInterval: 20 * time.Millisecond, Observer: pgMetrics,
		},
		Retry:   middleware.RetryConfig{Base: middleware.NoDelay},
		Metrics: metrics,
	})

	testenv.Eventually(t, 30*time.Second, func() bool {
		n, err := testutil.GatherAndCount(reg, "omnibus_handler_messages_total")
		require.NoError(t, err)
		return n == 3 && histogramSum(t, reg, "omnibus_postgres_settle_size_rows") == 5
	}, "five handler results and five settlements")

	handler := processors.DefaultRelayHandlerName
	expected := fmt.Sprintf(`
# HELP omnibus_handler_messages_total Messages handled, by handler, topic and result (ok, retry_counted, retry_transient, failed, dead_lettered).
# TYPE omnibus_handler_messages_total counter
omnibus_handler_messages_total{handler=%[1]q,result="failed",topic="orders"} 1
omnibus_handler_messages_total{handler=%[1]q,result="ok",topic="orders"} 3
omnibus_handler_messages_total{handler=%[1]q,result="retry_counted",topic="orders"} 1
# HELP omnibus_publisher_messages_total Messages published, by transport, topic and result (ok, error).
# TYPE omnibus_publisher_messages_total counter
omnibus_publisher_messages_total{result="error",topic="orders",transport="test"} 2
omnibus_publisher_messages_total{result="ok",topic="orders",transport="test"} 3
# HELP omnibus_circuit_breaker_state 1 for the current state of a circuit breaker (closed, open, half-open), 0 for the others.
# TYPE omnibus_circuit_breaker_state gauge
omnibus_circuit_breaker_state{breaker=%[1]q,state="closed"} 1
omnibus_circuit_breaker_state{breaker=%[1]q,state="half-open"} 0
omnibus_circuit_breaker_state{breaker=%[1]q,state="open"} 0
# HELP omnibus_outbox_pending_rows Rows waiting for delivery (due, leased, delayed and retrying).
# TYPE omnibus_outbox_pending_rows gauge
omnibus_outbox_pending_rows{table=%[2]q} 0
# HELP omnibus_outbox_failed_rows Rows that spent their attempts or failed permanently; they wait for an operator.
# TYPE omnibus_outbox_failed_rows gauge
omnibus_outbox_failed_rows{table=%[2]q} 1
# HELP omnibus_outbox_completed_rows Delivered rows not yet deleted by cleanup: counted up to 10000, estimated from the table's statistics beyond.
# TYPE omnibus_outbox_completed_rows gauge
omnibus_outbox_completed_rows{table=%[2]q} 3
# HELP omnibus_outbox_held_keys Keys held behind a tried head that waits for its retry time.
# TYPE omnibus_outbox_held_keys gauge
omnibus_outbox_held_keys{table=%[2]q} 0
`, handler, ob.Table())
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(expected),
		"omnibus_handler_messages_total", "omnibus_publisher_messages_total", "omnibus_circuit_breaker_state",
		"omnibus_outbox_pending_rows", "omnibus_outbox_failed_rows", "omnibus_outbox_completed_rows", "omnibus_outbox_held_keys"))

	// Five deliveries: five rows fetched, five settlements written (three
	// acks, two nacks), five handler durations and five publish calls.
	assert.EqualValues(t, 5, histogramSum(t, reg, "omnibus_postgres_fetch_size_rows"))
	assert.EqualValues(t, 5, histogramSum(t, reg, "omnibus_postgres_settle_size_rows"))
	count, err := testutil.GatherAndCount(reg, "omnibus_handler_duration_seconds")
	require.NoError(t, err)
	assert.Equal(t, 1, count, "one duration series for the relay's one topic")
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		switch mf.GetName() {
		case "omnibus_handler_duration_seconds", "omnibus_publisher_publish_duration_seconds":
			assert.EqualValues(t, 5, mf.GetMetric()[0].GetHistogram().GetSampleCount(), mf.GetName())
		}
	}
	problems, err := testutil.GatherAndLint(reg)
	require.NoError(t, err)
	assert.Empty(t, problems, "metric names and help pass promlint")
}

// One trace from the business transaction to the dispatcher's handler:
// Enqueue (inside the caller's span) → relay (producer span, child of it) →
// broker (Kafka headers, Redis fields) → ingest (consumer span, child of the
// producer span) → inbox row → dispatcher (consumer span, child of the
// producer span) → handler (runs inside the dispatcher's span).
func TestTracing_OneTraceFromEnqueueThroughTheBrokerToTheDispatcherHandler(t *testing.T) {
	t.Parallel()
	for _, broker := range []string{"kafka", "redis"} {
		t.Run(broker, func(t *testing.T) {
			t.Parallel()
			pool, ob := newTable(t)
			_, in := newInboxTable(t)
			exp := tracetest.NewInMemoryExporter()
			tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
			t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
			tracing := middleware.NewTracing(middleware.TracingConfig{TracerProvider: tp})

			var (
				pub   message.Publisher
				sub   message.Subscriber
				topic string
			)
			switch broker {
			case "kafka":
				b := newKafkaBroker(t)
				topic = b.topic()
				pub, sub = b.publisher(), b.subscriber("billing_"+testenv.Name(t))
			case "redis":
				b := newRedisBroker(t)
				topic = "orders"
				pub, sub = b.publisher(), b.subscriber("billing")
			}

			// The business transaction, inside the caller's span.
			ctx, business := tp.Tracer("shop").Start(context.Background(), "place order")
			msg := message.NewMessage(watermill.NewUUID(), []byte(`{"order_id":"o-1","step":"placed"}`))
			bus.SetEventType(msg, "order.placed")
			bus.SetPartitionKey(msg, "o-1")
			require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				return ob.Enqueue(ctx, tx, topic, msg)
			}))
			business.End()

			startRelay(t, pool, processors.OutboxRelayConfig{
				Publisher:  pub,
				Subscriber: postgres.SubscriberConfig{Table: ob.Table(), PollInterval: 20 * time.Millisecond},
				Tracing:    tracing,
			})

			// The receiving service: ingest and dispatcher on one router,
			// traced by a router-level middleware.
			ingest, err := processors.NewInboxIngest(pool, processors.InboxIngestConfig{
				Subscriber: sub, Topic: topic, ConsumerGroup: "billing",
				Inbox: postgres.InboxConfig{Table: in.Table()}, Retry: fastRetry,
			}, nil)
			require.NoError(t, err)
			dispatcher, err := processors.NewDispatcher(pool, processors.DispatcherConfig{
				Subscriber: postgres.SubscriberConfig{Table: in.Table(), ConsumerGroup: "billing", PollInterval: 20 * time.Millisecond},
				Retry:      fastRetry,
			}, nil)
			require.NoError(t, err)
			var (
				mu      sync.Mutex
				handled []trace.SpanContext
			)
			processors.Handle(dispatcher, "order.placed", func(ctx context.Context, ev orderEvent, _ *message.Message) error {
				mu.Lock()
				defer mu.Unlock()
				handled = append(handled, trace.SpanContextFromContext(ctx))
				return nil
			})
			router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
			require.NoError(t, err)
			router.AddMiddleware(tracing.Middleware)
			ingest.AddTo(router)
			dispatcher.AddTo(router)
			rctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- router.Run(rctx) }()
			t.Cleanup(func() {
				cancel()
				assert.NoError(t, <-done)
				assert.NoError(t, ingest.Close())
			})

			testenv.Eventually(t, 60*time.Second, func() bool {
				for _, s := range exp.GetSpans() {
					if s.Name == "process "+topic && handlerOf(s) == processors.DefaultDispatcherHandlerName {
						return true
					}
				}
				return false
			}, "the dispatcher's span to end after its handler")

			root := business.SpanContext()
			relay := onlySpan(t, exp, "publish "+topic, "")
			ingested := onlySpan(t, exp, "process "+topic, processors.DefaultIngestHandlerName)
			dispatched := onlySpan(t, exp, "process "+topic, processors.DefaultDispatcherHandlerName)
			for _, s := range []tracetest.SpanStub{relay, ingested, dispatched} {
				assert.Equal(t, root.TraceID(), s.SpanContext.TraceID(), "%s is in the business transaction's trace", s.Name)
			}
			assert.Equal(t, trace.SpanKindProducer, relay.SpanKind)
			assert.Equal(t, root.SpanID(), relay.Parent.SpanID(), "the relay's span is a child of the span that enqueued the event")
			assert.Equal(t, trace.SpanKindConsumer, ingested.SpanKind)
			assert.Equal(t, relay.SpanContext.SpanID(), ingested.Parent.SpanID(),
				"the ingest's span is a child of the relay's, whose context the %s message carried", broker)
			assert.Equal(t, trace.SpanKindConsumer, dispatched.SpanKind)
			assert.Equal(t, relay.SpanContext.SpanID(), dispatched.Parent.SpanID(),
				"the dispatcher's span is a child of the relay's, whose context the inbox row kept")

			mu.Lock()
			defer mu.Unlock()
			require.Len(t, handled, 1)
			assert.Equal(t, dispatched.SpanContext.SpanID(), handled[0].SpanID(), "the handler runs inside the dispatcher's span")
			assert.Equal(t, root.TraceID(), handled[0].TraceID())
		})
	}
}

func handlerOf(s tracetest.SpanStub) string {
	for _, a := range s.Attributes {
		if a.Key == "omnibus.handler" {
			return a.Value.AsString()
		}
	}
	return ""
}

// onlySpan returns the one span called name (and, unless handler is "",
// made by that router handler).
func onlySpan(t *testing.T, exp *tracetest.InMemoryExporter, name, handler string) tracetest.SpanStub {
	t.Helper()
	var found []tracetest.SpanStub
	for _, s := range exp.GetSpans() {
		if s.Name == name && (handler == "" || handlerOf(s) == handler) {
			found = append(found, s)
		}
	}
	require.Len(t, found, 1, "spans called %q of handler %q", name, handler)
	return found[0]
}

// descRecorder is a Registerer that records the names of the metrics
// registered on it.
type descRecorder struct{ names map[string]bool }

var fqNameRE = regexp.MustCompile(`fqName: "([^"]+)"`)

func (r *descRecorder) Register(c prometheus.Collector) error {
	ch := make(chan *prometheus.Desc)
	go func() {
		c.Describe(ch)
		close(ch)
	}()
	for d := range ch {
		if m := fqNameRE.FindStringSubmatch(d.String()); m != nil {
			r.names[m[1]] = true
		}
	}
	return nil
}

func (r *descRecorder) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		_ = r.Register(c)
	}
}

func (r *descRecorder) Unregister(prometheus.Collector) bool { return true }

// The dashboard and docs/observability.md name only metrics that exist, and
// the docs name every metric.
func TestObservabilityDocs_NameExactlyTheExportedMetrics(t *testing.T) {
	t.Parallel()
	rec := &descRecorder{names: map[string]bool{}}
	_, err := middleware.NewMetrics(rec, middleware.MetricsConfig{})
	require.NoError(t, err)
	_, err = postgres.NewMetrics(rec)
	require.NoError(t, err)
	pool := testenv.Postgres(t)
	for _, table := range []postgres.Table{postgres.OutboxTable(""), postgres.InboxTable("")} {
		a, err := postgres.NewAdmin(pool, table)
		require.NoError(t, err)
		_, err = postgres.NewStatsCollector(a, rec, 0) // Describe does not query
		require.NoError(t, err)
	}
	_, err = processors.NewShardCollector(rec, nil, "g", nil, 0)
	require.NoError(t, err)
	require.NotEmpty(t, rec.names)
	known := func(name string) bool {
		for _, suffix := range []string{"", "_bucket", "_sum", "_count"} {
			if base, ok := strings.CutSuffix(name, suffix); ok && rec.names[base] {
				return true
			}
		}
		return false
	}
	// Identifiers that look like metrics but are tables and handler names.
	notMetrics := map[string]bool{
		postgres.DefaultOutboxTable: true, postgres.DefaultInboxTable: true,
		processors.DefaultRelayHandlerName: true, processors.DefaultIngestHandlerName: true,
		processors.DefaultDispatcherHandlerName: true,
	}
	tokenRE := regexp.MustCompile(`omnibus_[a-z0-9_]*[a-z0-9]`)
	check := func(what, text string) {
		// The regex form in PromQL names both kinds: check both names.
		for _, kind := range []string{"outbox", "inbox"} {
			expanded := strings.ReplaceAll(text, "omnibus_(outbox|inbox)_", "omnibus_"+kind+"_")
			for _, tok := range tokenRE.FindAllString(expanded, -1) {
				if !notMetrics[tok] {
					assert.True(t, known(tok), "%s names %s, which no omnibus collector exports", what, tok)
				}
			}
		}
	}

	raw, err := os.ReadFile("../docs/grafana-dashboard.json")
	require.NoError(t, err)
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Type    string `json:"type"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	require.NoError(t, json.Unmarshal(raw, &dash), "the dashboard is valid JSON")
	panels := 0
	for _, p := range dash.Panels {
		if p.Type == "row" {
			continue
		}
		panels++
		require.NotEmpty(t, p.Targets, "panel %q has queries", p.Title)
		for _, q := range p.Targets {
			require.NotEmpty(t, q.Expr, "panel %q", p.Title)
			check("dashboard panel "+strconv.Quote(p.Title), q.Expr)
		}
	}
	assert.Greater(t, panels, 10)

	doc, err := os.ReadFile("../docs/observability.md")
	require.NoError(t, err)
	check("docs/observability.md", string(doc))
	for name := range rec.names {
		short := name
		for _, prefix := range []string{"omnibus_outbox_", "omnibus_inbox_"} {
			if s, ok := strings.CutPrefix(name, prefix); ok && name != "omnibus_inbox_stored_messages_total" {
				short = s
			}
		}
		assert.Contains(t, string(doc), "`"+short+"`", "docs/observability.md documents %s", name)
	}
}

// Without Tracing the relay passes each row's trace context on unchanged,
// even when the context it runs with carries a span of its own.
func TestOutboxRelay_WithoutTracingPassesTheRowsTraceContextOn(t *testing.T) {
	t.Parallel()
	pool, ob := newTable(t)
	tp := sdktrace.NewTracerProvider()
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	ctx, business := tp.Tracer("shop").Start(context.Background(), "place order")
	traced := keyed("k", "traced")
	require.NoError(t, ob.Enqueue(ctx, pool, "orders", traced))
	business.End()
	require.NoError(t, ob.Enqueue(context.Background(), pool, "orders", keyed("k", "untraced")))

	tgt := newTarget(nil)
	relay, err := processors.NewOutboxRelay(pool, processors.OutboxRelayConfig{
		Publisher:  tgt,
		Subscriber: postgres.SubscriberConfig{Table: ob.Table(), PollInterval: 20 * time.Millisecond},
	}, nil)
	require.NoError(t, err)
	runCtx, startup := tp.Tracer("app").Start(context.Background(), "application start")
	defer startup.End()
	runCtx, cancel := context.WithCancel(runCtx)
	done := make(chan error, 1)
	go func() { done <- relay.Run(runCtx) }()
	t.Cleanup(func() {
		cancel()
		assert.NoError(t, <-done)
	})

	testenv.Eventually(t, 30*time.Second, func() bool {
		_, d := tgt.snapshot()
		return len(d) == 2
	}, "both rows published")
	_, delivered := tgt.snapshot()
	got := trace.SpanContextFromContext(bus.ExtractTraceContext(context.Background(), delivered[0].Metadata))
	assert.Equal(t, business.SpanContext().SpanID(), got.SpanID(), "the row's trace context, not the relay's")
	assert.Empty(t, delivered[1].Metadata.Get(bus.KeyTraceparent), "a row without a trace context gets none")
}
