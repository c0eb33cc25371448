package bus

import (
	"context"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// traceContext is the W3C Trace Context propagator: it reads and writes
// exactly KeyTraceparent and KeyTracestate.
var traceContext propagation.TraceContext

// InjectTraceContext writes the W3C trace context of the span in ctx into
// md (KeyTraceparent, and KeyTracestate when the span has one), replacing
// any trace context md carried. It reports false, leaving md untouched, when
// ctx carries no valid span context.
//
// The outbox calls it for every enqueued event, and the relay for every
// published message, so that the consumer's span joins the trace of the
// business transaction that wrote the event.
func InjectTraceContext(ctx context.Context, md message.Metadata) bool {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return false
	}
	delete(md, KeyTraceparent)
	delete(md, KeyTracestate)
	traceContext.Inject(ctx, propagation.MapCarrier(md))
	return true
}

// ExtractTraceContext returns ctx with the remote span context carried by md
// (KeyTraceparent and KeyTracestate), so that a span started from it is a
// child of the span that produced the message. Without a valid traceparent
// it returns ctx unchanged.
func ExtractTraceContext(ctx context.Context, md message.Metadata) context.Context {
	if md.Get(KeyTraceparent) == "" {
		return ctx
	}
	return traceContext.Extract(ctx, propagation.MapCarrier(md))
}
