// Package middleware holds omnibus's Watermill handler middleware: Retry
// (durable, equal-jitter backoff decided from each message's bus.Delivery),
// Timeout and CircuitBreaker. Each is a message.HandlerMiddleware and composes
// with Watermill's own.
//
//	retry, _ := middleware.NewRetry(middleware.RetryConfig{}, logger)
//	breaker, _ := middleware.NewCircuitBreaker(middleware.CircuitBreakerConfig{}, logger)
//	h := router.AddConsumerHandler("relay", topic, sub, handle)
//	h.AddMiddleware(retry.Middleware, middleware.Timeout(30*time.Second), breaker.Middleware)
package middleware
