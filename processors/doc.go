// Package processors holds omnibus's ready-made Watermill handlers with their
// middleware chains: OutboxRelay delivers outbox rows to a broker in order
// per key with durable retries.
//
//	relay, err := processors.NewOutboxRelay(pool, processors.OutboxRelayConfig{
//		Publisher: kafkaPublisher,
//	}, logger)
//	if err != nil { ... }
//	err = relay.Run(ctx) // or relay.AddTo(router) on your own router
package processors
