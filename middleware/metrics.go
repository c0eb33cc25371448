package middleware

import (
	"errors"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/internal/prom"
)

// The values of the result label of omnibus_handler_messages_total.
const (
	// ResultOK: the handler succeeded; the message is acked.
	ResultOK = "ok"
	// ResultRetryCounted: a counted failure; the message is retried after
	// backoff and one attempt is spent.
	ResultRetryCounted = "retry_counted"
	// ResultRetryTransient: a transient failure; the message is retried
	// without spending an attempt.
	ResultRetryTransient = "retry_transient"
	// ResultFailed: given up on (a permanent failure, or the attempt budget
	// spent) and kept as failed by its store (a postgres row), or dropped.
	ResultFailed = "failed"
	// ResultDeadLettered: given up on and moved to a dead-letter topic or
	// stream (bus.Delivery.DeadLetter, or a DeadLetter middleware inside
	// Metrics).
	ResultDeadLettered = "dead_lettered"
)

// DefaultDurationBuckets are the buckets, in seconds, of the duration
// histograms of Metrics: 1 ms to 30 s.
var DefaultDurationBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}

// MetricsConfig configures Metrics.
type MetricsConfig struct {
	// DurationBuckets are the buckets of the handler and publish duration
	// histograms, in seconds. Default DefaultDurationBuckets.
	DurationBuckets []float64
}

// Metrics records Prometheus metrics of message handling, publishing and
// circuit breakers. All of them are registered on the registry given to
// NewMetrics. Labels are bounded: handler names, topics, transports and
// results; never message ids or keys.
//
// Handler metrics (Middleware):
//
//	omnibus_handler_messages_total{handler,topic,result}  messages handled, by result
//	omnibus_handler_duration_seconds{handler,topic}       handler time, histogram
//	omnibus_handler_in_flight_messages{handler}           messages being handled
//
// Publisher metrics (Publisher):
//
//	omnibus_publisher_messages_total{transport,topic,result}   messages published, result ok or error
//	omnibus_publisher_publish_duration_seconds{transport,topic} time of one Publish call until acknowledged
//	omnibus_publisher_in_flight_messages{transport}             messages waiting for their acknowledgement
//
// Circuit breaker metrics (BreakerStateChange):
//
//	omnibus_circuit_breaker_state{breaker,state}         1 for the current state (closed, open, half-open), else 0
//	omnibus_circuit_breaker_transitions_total{breaker,to} state changes
type Metrics struct {
	handled  *prometheus.CounterVec
	duration *prometheus.HistogramVec
	inFlight *prometheus.GaugeVec

	published       *prometheus.CounterVec
	publishDuration *prometheus.HistogramVec
	publishInFlight *prometheus.GaugeVec

	breakerState       *prometheus.GaugeVec
	breakerTransitions *prometheus.CounterVec
}

// NewMetrics registers the metrics with reg and returns them. reg is
// required: omnibus never registers on the global registry by itself (pass
// prometheus.DefaultRegisterer explicitly for that). NewMetrics may be called
// again with the same registry and configuration; the Metrics then share the
// registered collectors.
func NewMetrics(reg prometheus.Registerer, cfg MetricsConfig) (*Metrics, error) {
	if reg == nil {
		return nil, errors.New("invalid config: registerer: required (pass prometheus.DefaultRegisterer for the global registry)")
	}
	if cfg.DurationBuckets == nil {
		cfg.DurationBuckets = DefaultDurationBuckets
	}
	var (
		m    Metrics
		errs [8]error
	)
	m.handled, errs[0] = prom.Register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "omnibus_handler_messages_total",
		Help: "Messages handled, by handler, topic and result (ok, retry_counted, retry_transient, failed, dead_lettered).",
	}, []string{"handler", "topic", "result"}))
	m.duration, errs[1] = prom.Register(reg, prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "omnibus_handler_duration_seconds",
		Help:    "Time a handler took for one message, failures included.",
		Buckets: cfg.DurationBuckets,
	}, []string{"handler", "topic"}))
	m.inFlight, errs[2] = prom.Register(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "omnibus_handler_in_flight_messages",
		Help: "Messages being handled right now.",
	}, []string{"handler"}))
	m.published, errs[3] = prom.Register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "omnibus_publisher_messages_total",
		Help: "Messages published, by transport, topic and result (ok, error).",
	}, []string{"transport", "topic", "result"}))
	m.publishDuration, errs[4] = prom.Register(reg, prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "omnibus_publisher_publish_duration_seconds",
		Help:    "Time one Publish call took until the broker acknowledged all of its messages (or failed).",
		Buckets: cfg.DurationBuckets,
	}, []string{"transport", "topic"}))
	m.publishInFlight, errs[5] = prom.Register(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "omnibus_publisher_in_flight_messages",
		Help: "Messages handed to a publisher and not yet acknowledged.",
	}, []string{"transport"}))
	m.breakerState, errs[6] = prom.Register(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "omnibus_circuit_breaker_state",
		Help: "1 for the current state of a circuit breaker (closed, open, half-open), 0 for the others.",
	}, []string{"breaker", "state"}))
	m.breakerTransitions, errs[7] = prom.Register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "omnibus_circuit_breaker_transitions_total",
		Help: "State changes of a circuit breaker, by the state entered.",
	}, []string{"breaker", "to"}))
	if err := errors.Join(errs[:]...); err != nil {
		return nil, err
	}
	return &m, nil
}

// Middleware is the message.HandlerMiddleware counting messages by result
// and timing the handler. The handler label is the router handler's name,
// the topic label the message's bus.Delivery topic (for an outbox row, its
// destination) or, without one, the subscribed topic.
//
// The result of a failure is read from the bus.Settlement the Retry
// middleware records, so Metrics must run outside Retry (before it in the
// chain). Without a settlement, a failure counts as retry_transient or
// retry_counted after its class; a failure of a message without a Delivery
// (retried in process until the budget ran out) counts as failed.
func (m *Metrics) Middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		handler := message.HandlerNameFromCtx(msg.Context())
		topic := topicOf(msg)
		inFlight := m.inFlight.WithLabelValues(handler)
		inFlight.Inc()
		defer inFlight.Dec()
		start := time.Now()
		out, err := h(msg)
		m.duration.WithLabelValues(handler, topic).Observe(time.Since(start).Seconds())
		m.handled.WithLabelValues(handler, topic, resultOf(msg, err)).Inc()
		return out, err
	}
}

// topicOf is the topic a message is counted and traced under: the topic of
// its delivery, else its source, else the topic the router subscribed to.
func topicOf(msg *message.Message) string {
	if d, ok := bus.DeliveryOf(msg); ok {
		if d.Topic != "" {
			return d.Topic
		}
		if d.Source != "" {
			return d.Source
		}
	}
	return message.SubscribeTopicFromCtx(msg.Context())
}

// resultOf classifies the outcome of one handler call.
func resultOf(msg *message.Message, err error) string {
	if err == nil {
		if wasDeadLettered(msg) {
			return ResultDeadLettered
		}
		return ResultOK
	}
	d, durable := bus.DeliveryOf(msg)
	if !durable {
		return ResultFailed
	}
	st, settled := bus.SettlementOf(msg)
	switch {
	case !settled && bus.ClassOf(err) == bus.ClassTransient:
		return ResultRetryTransient
	case !settled:
		return ResultRetryCounted
	case st.GiveUp && d.DeadLetter != "":
		return ResultDeadLettered
	case st.GiveUp:
		return ResultFailed
	case st.Class == bus.ClassTransient:
		return ResultRetryTransient
	}
	return ResultRetryCounted
}

// BreakerStateChange returns a CircuitBreakerConfig.OnStateChange hook that
// tracks the breaker named name (a bounded name, such as its handler's) in
// omnibus_circuit_breaker_state, starting closed. To keep a hook of your
// own as well, call both from one function.
func (m *Metrics) BreakerStateChange(name string) func(from, to BreakerState) {
	m.setBreakerState(name, BreakerClosed)
	return func(_, to BreakerState) {
		m.breakerTransitions.WithLabelValues(name, to.String()).Inc()
		m.setBreakerState(name, to)
	}
}

func (m *Metrics) setBreakerState(name string, current BreakerState) {
	for _, s := range []BreakerState{BreakerClosed, BreakerOpen, BreakerHalfOpen} {
		v := 0.0
		if s == current {
			v = 1
		}
		m.breakerState.WithLabelValues(name, s.String()).Set(v)
	}
}

// Publisher returns pub instrumented under the transport label (a bounded
// name: "kafka", "redis", …): every Publish call is timed until it returns,
// which for omnibus's publishers is when the broker has acknowledged every
// message of the call, and its messages are counted in flight meanwhile and
// by result afterwards. Close closes pub.
func (m *Metrics) Publisher(transport string, pub message.Publisher) message.Publisher {
	return &meteredPublisher{m: m, transport: transport, pub: pub}
}

type meteredPublisher struct {
	m         *Metrics
	transport string
	pub       message.Publisher
}

func (p *meteredPublisher) Publish(topic string, msgs ...*message.Message) error {
	n := float64(len(msgs))
	inFlight := p.m.publishInFlight.WithLabelValues(p.transport)
	inFlight.Add(n)
	start := time.Now()
	err := p.pub.Publish(topic, msgs...)
	p.m.publishDuration.WithLabelValues(p.transport, topic).Observe(time.Since(start).Seconds())
	inFlight.Sub(n)
	result := "ok"
	if err != nil {
		result = "error"
	}
	p.m.published.WithLabelValues(p.transport, topic, result).Add(n)
	return err
}

func (p *meteredPublisher) Close() error { return p.pub.Close() }
