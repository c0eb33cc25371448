package middleware_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/middleware"
)

// delivered returns a message carrying d, as a durable subscriber emits it.
func delivered(d bus.Delivery) *message.Message {
	msg := message.NewMessage(watermill.NewUUID(), []byte("x"))
	msg.SetContext(bus.WithDelivery(context.Background(), d))
	return msg
}

func newMetrics(t *testing.T) (*prometheus.Registry, *middleware.Metrics) {
	t.Helper()
	reg := prometheus.NewRegistry()
	m, err := middleware.NewMetrics(reg, middleware.MetricsConfig{})
	require.NoError(t, err)
	return reg, m
}

func TestMetrics_CountsEachResultFromTheSettlementOfRetry(t *testing.T) {
	t.Parallel()
	retry, err := middleware.NewRetry(middleware.RetryConfig{}, nil)
	require.NoError(t, err)
	for _, tc := range []struct {
		name   string
		d      bus.Delivery
		err    error
		result string
	}{
		{"success", bus.Delivery{Topic: "orders", MaxAttempts: 6}, nil, middleware.ResultOK},
		{"counted failure with budget left", bus.Delivery{Topic: "orders", MaxAttempts: 6}, errors.New("boom"), middleware.ResultRetryCounted},
		{"transient failure", bus.Delivery{Topic: "orders", MaxAttempts: 6}, bus.Transient(errors.New("down")), middleware.ResultRetryTransient},
		{"counted failure spending the budget", bus.Delivery{Topic: "orders", Attempts: 5, MaxAttempts: 6}, errors.New("boom"), middleware.ResultFailed},
		{"permanent failure", bus.Delivery{Topic: "orders", MaxAttempts: 6}, bus.Permanent(errors.New("bad")), middleware.ResultFailed},
		{"given up with a dead-letter destination", bus.Delivery{Topic: "orders", Attempts: 5, MaxAttempts: 6, DeadLetter: "orders.dlq"},
			errors.New("boom"), middleware.ResultDeadLettered},
		{"topic falls back to the source", bus.Delivery{Source: "orders", MaxAttempts: 6}, nil, middleware.ResultOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			reg, m := newMetrics(t)
			h := m.Middleware(retry.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, tc.err }))
			_, err := h(delivered(tc.d))
			require.Equal(t, tc.err != nil, err != nil)

			expected := `
# HELP omnibus_handler_messages_total Messages handled, by handler, topic and result (ok, retry_counted, retry_transient, failed, dead_lettered).
# TYPE omnibus_handler_messages_total counter
omnibus_handler_messages_total{handler="",result="` + tc.result + `",topic="orders"} 1
`
			require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(expected), "omnibus_handler_messages_total"))
			n, err := testutil.GatherAndCount(reg, "omnibus_handler_duration_seconds")
			require.NoError(t, err)
			assert.Equal(t, 1, n, "one duration series (handler, topic)")
			assert.Zero(t, gaugeValue(t, reg, "omnibus_handler_in_flight_messages"), "nothing is in flight afterwards")
		})
	}
}

func TestMetrics_WithoutASettlementTheClassDecides(t *testing.T) {
	t.Parallel()
	reg, m := newMetrics(t)
	fail := func(err error) message.HandlerFunc {
		return func(*message.Message) ([]*message.Message, error) { return nil, err }
	}
	_, _ = m.Middleware(fail(errors.New("boom")))(delivered(bus.Delivery{Topic: "t"}))
	_, _ = m.Middleware(fail(bus.Transient(errors.New("down"))))(delivered(bus.Delivery{Topic: "t"}))
	// No Delivery: whatever retried it in process has given up.
	_, _ = m.Middleware(fail(errors.New("boom")))(message.NewMessage(watermill.NewUUID(), nil))

	expected := `
# HELP omnibus_handler_messages_total Messages handled, by handler, topic and result (ok, retry_counted, retry_transient, failed, dead_lettered).
# TYPE omnibus_handler_messages_total counter
omnibus_handler_messages_total{handler="",result="failed",topic=""} 1
omnibus_handler_messages_total{handler="",result="retry_counted",topic="t"} 1
omnibus_handler_messages_total{handler="",result="retry_transient",topic="t"} 1
`
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(expected), "omnibus_handler_messages_total"))
}

// gaugeValue returns the value of the single series of a gauge.
func gaugeValue(t *testing.T, g prometheus.Gatherer, name string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == name {
			require.Len(t, mf.GetMetric(), 1)
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

func TestMetrics_TracksTheCircuitBreakerState(t *testing.T) {
	t.Parallel()
	reg, m := newMetrics(t)
	b, err := middleware.NewCircuitBreaker(middleware.CircuitBreakerConfig{
		FailureThreshold: 2, OpenTimeout: time.Hour, OnStateChange: m.BreakerStateChange("relay"),
	}, nil)
	require.NoError(t, err)

	state := func() string {
		var b strings.Builder
		mfs, err := reg.Gather()
		require.NoError(t, err)
		for _, mf := range mfs {
			if mf.GetName() != "omnibus_circuit_breaker_state" {
				continue
			}
			for _, mm := range mf.GetMetric() {
				if mm.GetGauge().GetValue() == 1 {
					for _, l := range mm.GetLabel() {
						if l.GetName() == "state" {
							b.WriteString(l.GetValue())
						}
					}
				}
			}
		}
		return b.String()
	}
	assert.Equal(t, "closed", state(), "a new breaker is closed")

	h := b.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, errors.New("broker down") })
	for range 2 {
		_, _ = h(message.NewMessage(watermill.NewUUID(), nil))
	}
	require.Equal(t, middleware.BreakerOpen, b.State())
	assert.Equal(t, "open", state(), "exactly one state is 1")
	expected := `
# HELP omnibus_circuit_breaker_transitions_total State changes of a circuit breaker, by the state entered.
# TYPE omnibus_circuit_breaker_transitions_total counter
omnibus_circuit_breaker_transitions_total{breaker="relay",to="open"} 1
`
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(expected), "omnibus_circuit_breaker_transitions_total"))
}

// fakePublisher fails the topic "down".
type fakePublisher struct{ closed bool }

func (p *fakePublisher) Publish(topic string, _ ...*message.Message) error {
	if topic == "down" {
		return bus.Transient(errors.New("down"))
	}
	return nil
}

func (p *fakePublisher) Close() error { p.closed = true; return nil }

func TestMetrics_PublisherCountsAndTimesPublishes(t *testing.T) {
	t.Parallel()
	reg, m := newMetrics(t)
	inner := &fakePublisher{}
	pub := m.Publisher("kafka", inner)
	msg := func() *message.Message { return message.NewMessage(watermill.NewUUID(), nil) }
	require.NoError(t, pub.Publish("orders", msg(), msg(), msg()))
	require.NoError(t, pub.Publish("orders", msg()))
	err := pub.Publish("down", msg())
	require.Error(t, err)
	assert.Equal(t, bus.ClassTransient, bus.ClassOf(err), "errors pass through unchanged")

	expected := `
# HELP omnibus_publisher_messages_total Messages published, by transport, topic and result (ok, error).
# TYPE omnibus_publisher_messages_total counter
omnibus_publisher_messages_total{result="error",topic="down",transport="kafka"} 1
omnibus_publisher_messages_total{result="ok",topic="orders",transport="kafka"} 4
# HELP omnibus_publisher_in_flight_messages Messages handed to a publisher and not yet acknowledged.
# TYPE omnibus_publisher_in_flight_messages gauge
omnibus_publisher_in_flight_messages{transport="kafka"} 0
`
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(expected),
		"omnibus_publisher_messages_total", "omnibus_publisher_in_flight_messages"))
	mfs, err := reg.Gather()
	require.NoError(t, err)
	calls := map[string]uint64{}
	for _, mf := range mfs {
		if mf.GetName() == "omnibus_publisher_publish_duration_seconds" {
			for _, mm := range mf.GetMetric() {
				for _, l := range mm.GetLabel() {
					if l.GetName() == "topic" {
						calls[l.GetValue()] = mm.GetHistogram().GetSampleCount()
					}
				}
			}
		}
	}
	assert.Equal(t, map[string]uint64{"orders": 2, "down": 1}, calls, "one observation per Publish call")

	require.NoError(t, pub.Close())
	assert.True(t, inner.closed)
}

func TestNewMetrics_RequiresARegistryAndSharesOne(t *testing.T) {
	t.Parallel()
	_, err := middleware.NewMetrics(nil, middleware.MetricsConfig{})
	require.Error(t, err, "the global registry is never used by default")

	reg := prometheus.NewRegistry()
	a, err := middleware.NewMetrics(reg, middleware.MetricsConfig{})
	require.NoError(t, err)
	b, err := middleware.NewMetrics(reg, middleware.MetricsConfig{})
	require.NoError(t, err, "two processors of one process can each build Metrics on the same registry")
	ok := func(*message.Message) ([]*message.Message, error) { return nil, nil }
	_, _ = a.Middleware(ok)(delivered(bus.Delivery{Topic: "t"}))
	_, _ = b.Middleware(ok)(delivered(bus.Delivery{Topic: "t"}))
	expected := `
# HELP omnibus_handler_messages_total Messages handled, by handler, topic and result (ok, retry_counted, retry_transient, failed, dead_lettered).
# TYPE omnibus_handler_messages_total counter
omnibus_handler_messages_total{handler="",result="ok",topic="t"} 2
`
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(expected), "omnibus_handler_messages_total"))

	problems, err := testutil.GatherAndLint(reg)
	require.NoError(t, err)
	assert.Empty(t, problems, "metric names and help pass promlint")
}
