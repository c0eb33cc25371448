// Package all links every built-in omnibus transport into a program, so that
// bus.Open (and omnibus.Open) can open any of them by name from configuration:
//
//	import _ "github.com/omnibus-go/omnibus/transports/all"
//
// A service that needs one broker imports that transport instead and does not
// link the others (a Redis-only service does not link sarama). The memory
// broker is built into package bus.
package all

import (
	// Each registers its broker with bus.RegisterBroker from init.
	_ "github.com/omnibus-go/omnibus/transports/kafka"
	_ "github.com/omnibus-go/omnibus/transports/postgres"
	_ "github.com/omnibus-go/omnibus/transports/redis"
)
