package postgres

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/omnibus-go/omnibus/bus"
)

func TestEnqueue_StoresTheCallersTraceContext(t *testing.T) {
	t.Parallel()
	pool, ob := newOutbox(t)
	tp := sdktrace.NewTracerProvider()
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	ctx, span := tp.Tracer("test").Start(context.Background(), "place order")
	defer span.End()

	traced := event("k", "traced")
	traced.Metadata.Set(bus.KeyTracestate, "stale=1") // replaced with the caller's context
	require.NoError(t, ob.Enqueue(ctx, pool, "t", traced))
	explicit := event("k", "explicit")
	explicit.Metadata.Set(bus.KeyTraceparent, "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
	plain := event("k", "plain")
	require.NoError(t, ob.Enqueue(context.Background(), pool, "t", explicit, plain))

	meta := func(payload string) map[string]string {
		var raw []byte
		require.NoError(t, pool.QueryRow(context.Background(),
			`SELECT metadata FROM `+ob.q.table.quoted()+` WHERE payload = $1`, []byte(payload)).Scan(&raw))
		var m map[string]string
		require.NoError(t, json.Unmarshal(raw, &m))
		return m
	}
	sc := span.SpanContext()
	assert.Equal(t, "00-"+sc.TraceID().String()+"-"+sc.SpanID().String()+"-01", meta("traced")[bus.KeyTraceparent])
	assert.NotContains(t, meta("traced"), bus.KeyTracestate, "a stale tracestate does not outlive its traceparent")
	assert.Equal(t, "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", meta("explicit")[bus.KeyTraceparent],
		"without a span in ctx, a trace context the message carries is kept")
	assert.NotContains(t, meta("plain"), bus.KeyTraceparent)
}
