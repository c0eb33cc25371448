package bus

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"

	"github.com/ThreeDotsLabs/watermill/message"
)

// Broker is a transport opened from a Config: one shared Publisher and
// consumer-group Subscribers. Transports implement it and register a
// BrokerFactory under their name; services use it through Open and Bus.
type Broker interface {
	// Publisher returns the broker's publisher. It is shared: the Broker
	// closes it in Close, and nobody else may.
	Publisher() message.Publisher
	// Subscriber returns a new subscriber that receives as consumer group
	// group: within a group each message is handled once (by one of the
	// group's subscribers, where the transport spreads work), and every group
	// receives every message. The caller owns it (a Watermill router closes
	// the subscribers of its handlers when it stops).
	Subscriber(group string) (message.Subscriber, error)
	// Close closes the publisher and whatever the broker opened (clients,
	// pools). Subscribers handed out must be closed before.
	Close() error
}

// BrokerFactory opens a Broker from cfg (defaults applied and validated).
// logger is never nil; ctx ends when the Bus is closed. A factory that
// connects and cannot reach the broker returns an error marked Transient:
// Open then returns a Bus that calls the factory again in the background
// (with ConnectBackoff between attempts) until it succeeds, so that writing
// to the outbox never waits for the broker. Any other error of the first
// attempt fails Open.
type BrokerFactory func(ctx context.Context, cfg Config, logger *slog.Logger) (Broker, error)

var (
	registryMu sync.RWMutex
	registry   = map[string]BrokerFactory{}
)

// builtinPackages tells a user which import links a built-in broker.
var builtinPackages = map[string]string{
	BrokerPostgres: "github.com/omnibus-go/omnibus/transports/postgres",
	BrokerKafka:    "github.com/omnibus-go/omnibus/transports/kafka",
	BrokerRedis:    "github.com/omnibus-go/omnibus/transports/redis",
}

// RegisterBroker makes a transport available to Open as Config.Broker = name.
// Transports call it from an init function (the database/sql driver idiom),
// so importing a transport package — or transports/all for every built-in
// one — is what links it into a program:
//
//	import _ "github.com/omnibus-go/omnibus/transports/all"
//
// It panics if name is empty, f is nil or name is already registered.
func RegisterBroker(name string, f BrokerFactory) {
	if name == "" || f == nil {
		panic("bus: RegisterBroker with an empty name or a nil factory")
	}
	registryMu.Lock()
	defer registryMu.Unlock()
	if _, dup := registry[name]; dup {
		panic("bus: RegisterBroker called twice for broker " + name)
	}
	registry[name] = f
}

// RegisteredBrokers returns the names of the brokers linked into this
// program, sorted.
func RegisteredBrokers() []string {
	registryMu.RLock()
	defer registryMu.RUnlock()
	names := make([]string, 0, len(registry))
	for n := range registry {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// extraBrokers returns the registered names beyond the built-in ones, which
// Validate accepts too.
func extraBrokers() []string {
	var out []string
	for _, n := range RegisteredBrokers() {
		switch n {
		case BrokerMemory, BrokerPostgres, BrokerKafka, BrokerRedis:
		default:
			out = append(out, n)
		}
	}
	return out
}

func lookupBroker(name string) (BrokerFactory, error) {
	registryMu.RLock()
	f, ok := registry[name]
	registryMu.RUnlock()
	if ok {
		return f, nil
	}
	if pkg, builtin := builtinPackages[name]; builtin {
		return nil, &ConfigError{Field: "broker", Reason: fmt.Sprintf(
			"%q is not linked into this program: import _ %q (or every built-in broker with import _ \"github.com/omnibus-go/omnibus/transports/all\")",
			name, pkg)}
	}
	return nil, &ConfigError{Field: "broker", Reason: fmt.Sprintf("no broker registered as %q", name)}
}
