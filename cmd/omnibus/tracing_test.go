package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/internal/testenv"
	"github.com/omnibus-go/omnibus/transports/kafka"
	"github.com/omnibus-go/omnibus/transports/postgres"
)

// collector is an OTLP/HTTP traces endpoint that keeps what it receives.
type collector struct {
	mu    sync.Mutex
	spans map[string]*tracepb.Span // by name
	svc   []string                 // service.name of each resource
}

func newCollector(t *testing.T) (*collector, string) {
	t.Helper()
	c := &collector{spans: map[string]*tracepb.Span{}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		var req coltrace.ExportTraceServiceRequest
		if err == nil {
			err = proto.Unmarshal(body, &req)
		}
		if r.URL.Path != "/v1/traces" || err != nil {
			http.Error(w, fmt.Sprintf("path %s: %v", r.URL.Path, err), http.StatusBadRequest)
			return
		}
		c.mu.Lock()
		for _, rs := range req.GetResourceSpans() {
			for _, kv := range rs.GetResource().GetAttributes() {
				if kv.GetKey() == "service.name" {
					c.svc = append(c.svc, kv.GetValue().GetStringValue())
				}
			}
			for _, ss := range rs.GetScopeSpans() {
				for _, s := range ss.GetSpans() {
					c.spans[s.GetName()] = s
				}
			}
		}
		c.mu.Unlock()
		resp, _ := proto.Marshal(&coltrace.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(resp)
	}))
	t.Cleanup(srv.Close)
	return c, srv.URL + "/v1/traces"
}

func (c *collector) span(name string) (*tracepb.Span, []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.spans[name], append([]string(nil), c.svc...)
}

func TestRelay_ExportsItsSpansOverOTLP(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	col, endpoint := newCollector(t)
	prefix := testenv.RedisPrefix(t)
	outbox := "cli_" + randomHex(6) + "_out"
	testenv.DropPostgresPrefix(t, outbox)
	path := writeConfig(t, fmt.Sprintf(`postgres:
  url: %q
  max_conns: 4
outbox:
  table: %s
broker: redis
redis:
  addr: %s
  stream_prefix: %q
observability:
  metrics_addr: 127.0.0.1:0
  log_level: warn
  traces: otlp
  otlp_endpoint: %s
`, testenv.PostgresURL(), outbox, testenv.RedisAddr(), prefix, endpoint))
	ok(t, cli(t, ctx, "--config", path, "migrate"))

	// The event is written inside a business span, whose context the row keeps.
	ob, err := postgres.NewOutbox(postgres.OutboxConfig{Table: outbox})
	require.NoError(t, err)
	msg := message.NewMessage("00000000-0000-4000-8000-000000000001", []byte("{}"))
	bus.SetPartitionKey(msg, "order-1")
	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	msg.Metadata.Set(bus.KeyTraceparent, "00-"+traceID+"-00f067aa0ba902b7-01")
	require.NoError(t, ob.Enqueue(ctx, testenv.Postgres(t), "orders", msg))

	_, stop := runServing(t, "--config", path, "relay")
	testenv.Eventually(t, 30*time.Second, func() bool {
		return count(t, `SELECT count(*) FROM `+outbox+` WHERE status = 'completed'`) == 1
	}, "outbox relayed")
	ok(t, stop()) // shutting down flushes the spans

	span, services := col.span("publish orders")
	require.NotNil(t, span, "the relay's producer span reached the collector")
	assert.Equal(t, tracepb.Span_SPAN_KIND_PRODUCER, span.GetKind())
	assert.Equal(t, traceID, fmt.Sprintf("%x", span.GetTraceId()), "it continues the trace the event was written in")
	assert.Equal(t, "00f067aa0ba902b7", fmt.Sprintf("%x", span.GetParentSpanId()))
	assert.Contains(t, services, "omnibus-relay")
}

func TestConfig_TracesAndEndpointAreValidated(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ yaml, want string }{
		{"observability:\n  traces: zipkin\n", "observability.traces"},
		{"observability:\n  traces: otlp\n  otlp_endpoint: collector:4318\n", "observability.otlp_endpoint"},
	} {
		r := cli(t, context.Background(), "--config", writeConfig(t, tc.yaml), "config", "check")
		assert.Equal(t, exitUsage, r.code, r.stderr)
		assert.Contains(t, r.stderr, tc.want)
	}
}

func TestIngest_ExportsItsSpansOverOTLP(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	col, endpoint := newCollector(t)
	brokers := testenv.Kafka(t)
	topic := testenv.KafkaTopic(t, brokers, 2)
	path, _, inbox := tablesConfig(t, fmt.Sprintf("broker: kafka\nkafka:\n  brokers: [%s]\n", strings.Join(brokers, ", ")))
	cfg := strings.Replace(readFile(t, path), "  table: "+inbox+"\n",
		fmt.Sprintf("  table: %s\n  consumer_group: %s\n  topics: [%s]\n", inbox, testenv.Name(t), topic), 1)
	cfg = strings.Replace(cfg, "  log_level: warn\n", "  log_level: warn\n  traces: otlp\n  otlp_endpoint: "+endpoint+"\n", 1)
	require.NoError(t, os.WriteFile(path, []byte(cfg), 0o600))
	ok(t, cli(t, ctx, "--config", path, "migrate"))

	pub, err := kafka.NewPublisher(kafka.PublisherConfig{ConnectionConfig: kafka.ConnectionConfig{Brokers: brokers}}, nil)
	require.NoError(t, err)
	defer pub.Close()
	msg := message.NewMessage("00000000-0000-4000-8000-000000000001", []byte("{}"))
	const traceID = "0af7651916cd43dd8448eb211c80319c"
	msg.Metadata.Set(bus.KeyTraceparent, "00-"+traceID+"-b7ad6b7169203331-01")
	require.NoError(t, pub.Publish(topic, msg))

	_, stop := runServing(t, "--config", path, "ingest")
	testenv.Eventually(t, 30*time.Second, func() bool { return count(t, `SELECT count(*) FROM `+inbox) == 1 }, "message stored")
	ok(t, stop())

	span, services := col.span("process " + topic)
	require.NotNil(t, span, "the ingest's consumer span reached the collector")
	assert.Equal(t, tracepb.Span_SPAN_KIND_CONSUMER, span.GetKind())
	assert.Equal(t, traceID, fmt.Sprintf("%x", span.GetTraceId()), "it continues the producer's trace")
	assert.Contains(t, services, "omnibus-ingest")
}
