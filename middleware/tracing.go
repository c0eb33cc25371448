package middleware

import (
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/omnibus-go/omnibus/bus"
)

// TracerName is the instrumentation scope of omnibus's spans.
const TracerName = "github.com/omnibus-go/omnibus"

// TracingConfig configures Tracing.
type TracingConfig struct {
	// TracerProvider creates the spans. Default otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
}

// Tracing creates OpenTelemetry spans for handled messages, continuing the
// W3C trace context each message carries in its metadata (bus.KeyTraceparent,
// bus.KeyTracestate). With omnibus's pieces in place one trace runs from the
// business transaction to the last handler:
//
//   - Outbox.Enqueue stores the caller's trace context in each event's row.
//   - The outbox relay's Producer span ("publish <topic>", kind producer) is a
//     child of it, and the relay writes the Producer span's context into the
//     published message, so Kafka headers and Redis fields carry it.
//   - A consumer's Middleware span ("process <topic>", kind consumer) is a
//     child of the producer span: InboxIngest's when the message is stored,
//     the Dispatcher's when its inbox row (which keeps the metadata) is
//     handled, a plain handler's when it consumes the broker directly.
//
// Handlers see their span in msg.Context(). A failure is recorded on the
// span with its class and, when Retry runs inside Tracing, the retry time
// or the decision to give up.
type Tracing struct {
	tracer trace.Tracer
}

// NewTracing returns the tracing middleware.
func NewTracing(cfg TracingConfig) *Tracing {
	tp := cfg.TracerProvider
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	return &Tracing{tracer: tp.Tracer(TracerName)}
}

// Middleware is the consumer-side message.HandlerMiddleware: each message is
// handled inside a "process <topic>" span of kind consumer, a child of the
// span that produced the message.
func (t *Tracing) Middleware(h message.HandlerFunc) message.HandlerFunc {
	return t.wrap(h, trace.SpanKindConsumer, "process")
}

// Producer is the relay-side message.HandlerMiddleware: each outbox row is
// published inside a "publish <topic>" span of kind producer, a child of the
// span that enqueued it. The handler must write the span's context into the
// messages it publishes (bus.InjectTraceContext), as the outbox relay does.
func (t *Tracing) Producer(h message.HandlerFunc) message.HandlerFunc {
	return t.wrap(h, trace.SpanKindProducer, "publish")
}

func (t *Tracing) wrap(h message.HandlerFunc, kind trace.SpanKind, op string) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		parent := msg.Context()
		topic := topicOf(msg)
		name := op
		if topic != "" {
			name += " " + topic
		}
		attrs := []attribute.KeyValue{
			attribute.String("messaging.operation.type", op),
			attribute.String("messaging.destination.name", topic),
			attribute.String("messaging.message.id", msg.UUID),
		}
		if hn := message.HandlerNameFromCtx(parent); hn != "" {
			attrs = append(attrs, attribute.String("omnibus.handler", hn))
		}
		if et := bus.EventType(msg); et != "" {
			attrs = append(attrs, attribute.String("omnibus.event_type", et))
		}
		d, durable := bus.DeliveryOf(msg)
		if durable {
			attrs = append(attrs,
				attribute.String("omnibus.source", d.Source),
				attribute.String("omnibus.delivery.id", d.ID),
				attribute.Int("omnibus.attempts", d.Attempts))
		}
		ctx, span := t.tracer.Start(bus.ExtractTraceContext(parent, msg.Metadata), name,
			trace.WithSpanKind(kind), trace.WithAttributes(attrs...))
		defer span.End()
		msg.SetContext(ctx)
		defer msg.SetContext(parent)

		out, err := h(msg)
		if err == nil {
			return out, nil
		}
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
		span.SetAttributes(attribute.String("omnibus.failure.class", bus.ClassOf(err).String()))
		if st, ok := bus.SettlementOf(msg); ok {
			span.SetAttributes(attribute.Bool("omnibus.give_up", st.GiveUp))
			if !st.RetryAt.IsZero() {
				span.SetAttributes(attribute.String("omnibus.retry_at", st.RetryAt.UTC().Format(time.RFC3339Nano)))
			}
			if st.GiveUp && d.DeadLetter != "" {
				span.SetAttributes(attribute.String("omnibus.dead_letter", d.DeadLetter))
			}
		}
		return out, err
	}
}
