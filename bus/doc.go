// Package bus is the face of omnibus: the reserved metadata keys and their
// helpers, the three failure classes a handler error can belong to, the
// Delivery and Settlement records that travel in a message's context, and an
// adapter between log/slog and Watermill's LoggerAdapter; and the
// configuration: Config's top-level keys, the YAML/env loader (LoadConfig),
// and the transport registry (Register) through which each transport brings
// its factory and its own config section, and OpenBroker opens the
// configured one.
//
// bus never imports a transport. Transports and processors import bus.
//
//	msg := message.NewMessage(watermill.NewUUID(), payload)
//	bus.SetPartitionKey(msg, "order-42")
//	bus.SetEventType(msg, "order.paid")
//
//	// in a handler:
//	if errors.Is(err, sql.ErrNoRows) {
//		return bus.Permanent(err) // no retry, fail at once
//	}
//	return bus.RetryAt(time.Now().Add(time.Minute), err) // try again in a minute
package bus
