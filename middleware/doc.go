// Package middleware holds omnibus's Watermill handler middleware: Retry
// (durable, equal-jitter backoff decided from each message's bus.Delivery),
// Timeout, CircuitBreaker, DeadLetter (messages given up on go to a topic
// instead of staying failed), Dedup (a handler runs once per message id,
// atomically with its effects, over a Deduplicator such as
// postgres.Deduper), Metrics (Prometheus, on a registry you pass)
// and Tracing (OpenTelemetry spans continuing the W3C trace context in the
// message metadata). Each is a message.HandlerMiddleware and composes with
// Watermill's own. Metrics and Tracing go outside Retry, so they see its
// decision.
//
//	retry, _ := middleware.NewRetry(middleware.RetryConfig{}, logger)
//	metrics, _ := middleware.NewMetrics(registry, middleware.MetricsConfig{})
//	breaker, _ := middleware.NewCircuitBreaker(middleware.CircuitBreakerConfig{
//		OnStateChange: metrics.BreakerStateChange("orders"),
//	}, logger)
//	tracing := middleware.NewTracing(middleware.TracingConfig{})
//	h := router.AddConsumerHandler("orders", topic, sub, handle)
//	h.AddMiddleware(tracing.Middleware, metrics.Middleware, retry.Middleware,
//		middleware.Timeout(30*time.Second), breaker.Middleware)
package middleware
