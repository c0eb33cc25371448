// Package processors holds omnibus's ready-made Watermill handlers with their
// middleware chains: OutboxRelay delivers outbox rows to a broker in order
// per key with durable retries; InboxIngest stores broker messages into the
// inbox (deduplicated, acked only after the insert committed); Dispatcher
// hands inbox rows, in order per key, to typed handlers registered with
// Handle[T], optionally inside the transaction that completes the row.
//
//	relay, err := processors.NewOutboxRelay(pool, processors.OutboxRelayConfig{
//		Publisher: kafkaPublisher,
//	}, logger)
//	if err != nil { ... }
//	err = relay.Run(ctx) // or relay.AddTo(router) on your own router
package processors
