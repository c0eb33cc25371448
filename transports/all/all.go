// Package all links every built-in omnibus transport into a program, so that
// omnibus.Open (and bus.OpenBroker) can open any of them by name from
// configuration, and LoadConfig reads their sections (kafka:, redis:,
// rabbitmq:, nats:):
//
//	import _ "github.com/omnibus-go/omnibus/transports/all"
//
// A service that needs one broker imports that transport instead and does not
// link the others (a Redis-only service does not link sarama). The omnibus
// package links the memory broker (the default) by itself.
package all

import (
	// Each registers its broker with bus.Register from init.
	_ "github.com/omnibus-go/omnibus/transports/kafka"
	_ "github.com/omnibus-go/omnibus/transports/memory"
	_ "github.com/omnibus-go/omnibus/transports/nats"
	_ "github.com/omnibus-go/omnibus/transports/postgres"
	_ "github.com/omnibus-go/omnibus/transports/rabbitmq"
	_ "github.com/omnibus-go/omnibus/transports/redis"
)
