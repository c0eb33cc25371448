package middleware_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/middleware"
)

func newTracer(t *testing.T) (*tracetest.InMemoryExporter, *sdktrace.TracerProvider) {
	t.Helper()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return exp, tp
}

func spanNamed(t *testing.T, exp *tracetest.InMemoryExporter, name string) tracetest.SpanStub {
	t.Helper()
	for _, s := range exp.GetSpans() {
		if s.Name == name {
			return s
		}
	}
	t.Fatalf("no span %q among %d", name, len(exp.GetSpans()))
	return tracetest.SpanStub{}
}

func TestTracing_ConsumerSpanIsAChildOfTheProducerInTheMetadata(t *testing.T) {
	t.Parallel()
	exp, tp := newTracer(t)
	ctx, producer := tp.Tracer("test").Start(context.Background(), "business")
	msg := delivered(bus.Delivery{Topic: "orders", Source: "orders", ID: "0/7"})
	require.True(t, bus.InjectTraceContext(ctx, msg.Metadata))
	producer.End()

	var seen trace.SpanContext
	h := middleware.NewTracing(middleware.TracingConfig{TracerProvider: tp}).Middleware(
		func(m *message.Message) ([]*message.Message, error) {
			seen = trace.SpanContextFromContext(m.Context())
			return nil, nil
		})
	_, err := h(msg)
	require.NoError(t, err)

	process := spanNamed(t, exp, "process orders")
	business := spanNamed(t, exp, "business")
	assert.Equal(t, trace.SpanKindConsumer, process.SpanKind)
	assert.Equal(t, business.SpanContext.TraceID(), process.SpanContext.TraceID(), "one trace")
	assert.Equal(t, business.SpanContext.SpanID(), process.Parent.SpanID(), "the consumer span is a child of the producer's")
	assert.True(t, process.Parent.IsRemote())
	assert.Equal(t, process.SpanContext.SpanID(), seen.SpanID(), "the handler runs inside the consumer span")
	assert.False(t, trace.SpanContextFromContext(msg.Context()).IsValid(), "the message's context is restored afterwards")
	_, ok := bus.DeliveryOf(msg)
	assert.True(t, ok)
}

func TestTracing_FailureIsRecordedWithItsSettlement(t *testing.T) {
	t.Parallel()
	exp, tp := newTracer(t)
	retry, err := middleware.NewRetry(middleware.RetryConfig{}, nil)
	require.NoError(t, err)
	tr := middleware.NewTracing(middleware.TracingConfig{TracerProvider: tp})
	h := tr.Producer(retry.Middleware(func(*message.Message) ([]*message.Message, error) {
		return nil, errors.New("broker said no")
	}))
	msg := delivered(bus.Delivery{Topic: "orders", MaxAttempts: 6})
	_, err = h(msg)
	require.Error(t, err)

	s := spanNamed(t, exp, "publish orders")
	assert.Equal(t, trace.SpanKindProducer, s.SpanKind)
	assert.False(t, s.Parent.IsValid(), "without a trace context in the metadata the span starts a trace")
	assert.Equal(t, codes.Error, s.Status.Code)
	attrs := map[string]string{}
	for _, a := range s.Attributes {
		attrs[string(a.Key)] = a.Value.Emit()
	}
	assert.Equal(t, "counted", attrs["omnibus.failure.class"])
	assert.Equal(t, "false", attrs["omnibus.give_up"])
	assert.NotEmpty(t, attrs["omnibus.retry_at"])
	assert.Equal(t, msg.UUID, attrs["messaging.message.id"])
	require.Len(t, s.Events, 1, "the error is recorded as an event")
}

func TestInjectTraceContext_ReplacesAndKeepsWhenThereIsNoSpan(t *testing.T) {
	t.Parallel()
	md := message.Metadata{bus.KeyTraceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", bus.KeyTracestate: "old=1"}
	assert.False(t, bus.InjectTraceContext(context.Background(), md), "no span, nothing written")
	assert.Equal(t, "old=1", md.Get(bus.KeyTracestate))

	_, tp := newTracer(t)
	ctx, span := tp.Tracer("test").Start(context.Background(), "op")
	defer span.End()
	require.True(t, bus.InjectTraceContext(ctx, md))
	assert.True(t, strings.Contains(md.Get(bus.KeyTraceparent), span.SpanContext().SpanID().String()))
	assert.Empty(t, md.Get(bus.KeyTracestate), "a stale tracestate does not outlive its traceparent")

	got := trace.SpanContextFromContext(bus.ExtractTraceContext(context.Background(), md))
	assert.Equal(t, span.SpanContext().SpanID(), got.SpanID())
}

func TestRetry_LogsOneLinePerFailureWithClassAndRetryTime(t *testing.T) {
	t.Parallel()
	for _, level := range []slog.Level{slog.LevelInfo, slog.LevelDebug} {
		t.Run(level.String(), func(t *testing.T) {
			t.Parallel()
			var buf bytes.Buffer
			log := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: level}))
			retry, err := middleware.NewRetry(middleware.RetryConfig{}, log)
			require.NoError(t, err)
			h := retry.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, errors.New("boom") })

			again := delivered(bus.Delivery{Topic: "orders", Source: "omnibus_outbox", MaxAttempts: 6})
			bus.SetPartitionKey(again, "customer-42")
			_, _ = h(again)
			last := delivered(bus.Delivery{Topic: "orders", Source: "orders", Attempts: 5, MaxAttempts: 6, DeadLetter: "orders.dlq"})
			bus.SetPartitionKey(last, "customer-42")
			_, _ = h(last)

			lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
			require.Len(t, lines, 2, "one line per failure:\n%s", buf.String())
			var retried, gaveUp map[string]any
			require.NoError(t, json.Unmarshal([]byte(lines[0]), &retried))
			require.NoError(t, json.Unmarshal([]byte(lines[1]), &gaveUp))

			assert.Equal(t, "INFO", retried["level"])
			assert.Equal(t, again.UUID, retried["event_id"])
			assert.Equal(t, "orders", retried["topic"])
			assert.Equal(t, "omnibus_outbox", retried["source"])
			assert.Equal(t, "counted", retried["class"])
			assert.EqualValues(t, 1, retried["attempts"])
			assert.EqualValues(t, 6, retried["max_attempts"])
			assert.NotEmpty(t, retried["retry_at"])
			assert.Equal(t, "boom", retried["error"])

			assert.Equal(t, "WARN", gaveUp["level"])
			assert.Equal(t, "orders.dlq", gaveUp["dead_letter"])
			assert.NotContains(t, gaveUp, "retry_at")

			for _, line := range []map[string]any{retried, gaveUp} {
				if level == slog.LevelDebug {
					assert.Equal(t, "customer-42", line["partition_key"], "partition keys are logged at Debug")
				} else {
					assert.NotContains(t, line, "partition_key", "partition keys are logged only at Debug")
				}
			}
		})
	}
}
