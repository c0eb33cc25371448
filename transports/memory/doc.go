// Package memory is the in-process broker, registered with bus as "memory"
// (the default broker, bus.DefaultBroker): for tests, demos and
// single-process services. It has no configuration section.
//
// Importing it registers the broker; the omnibus package and transports/all
// import it, so that a zero bus.Config is an in-memory bus for their users:
//
//	import _ "github.com/omnibus-go/omnibus/transports/memory"
//
//	conn, err := bus.OpenBroker(ctx, bus.Config{}) // broker: memory
//
// Used on its own, NewBroker returns a Broker whose Publisher and
// Subscribers share one set of in-memory topics.
package memory
