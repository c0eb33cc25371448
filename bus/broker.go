package bus

import (
	"context"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"strings"
	"sync"

	"github.com/ThreeDotsLabs/watermill/message"
)

// Broker is a transport opened from a Config: one shared Publisher and
// consumer-group Subscribers. Transports implement it and register its
// factory (see Register); services use it through OpenBroker and Conn (or
// the omnibus package's Open).
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

// BrokerFactory opens a Broker from cfg (defaults applied and validated);
// the transport reads its own section with cfg.Section. logger is never nil;
// ctx ends when the Conn is closed. A factory that connects and cannot reach
// the broker returns an error marked Transient: OpenBroker then returns a
// Conn that calls the factory again in the background (with ConnectBackoff
// between attempts) until it succeeds, so that writing to the outbox never
// waits for the broker. Any other error of the first attempt fails
// OpenBroker.
type BrokerFactory func(ctx context.Context, cfg Config, logger *slog.Logger) (Broker, error)

// Transport is what a transport registers with Register: its broker name,
// its configuration section and its factory. It is the database/sql driver
// idiom: a transport package registers from init, and importing it (or
// transports/all) is what links it into a program.
//
// A transport with a section owns it entirely: bus loads it from the YAML
// key Key and the environment variables EnvPrefix+KEY, lists its keys in
// ConfigKeys, redacts its secret fields (the `secret:"true"` and
// `secret:"dsn"` struct tags) when printing, fills in its defaults and runs
// its Validate, whose *ConfigError fields are relative to the section
// ("sasl.password") and are reported prefixed with Key
// ("kafka.sasl.password").
type Transport struct {
	// Name is the broker's name, the value of Config.Broker ("kafka").
	// Required.
	Name string
	// Open opens the broker. Required.
	Open BrokerFactory

	// Key is the top-level YAML key of the transport's section ("kafka");
	// "" for a transport without a section of its own (memory, or postgres,
	// which uses the top-level postgres keys).
	Key string
	// EnvPrefix starts the environment variables of the section's keys:
	// OMNIBUS_KAFKA_ makes kafka.sasl.password OMNIBUS_KAFKA_SASL_PASSWORD.
	// Default "OMNIBUS_" + Key in upper case + "_"; it must start with
	// OMNIBUS_.
	EnvPrefix string
	// NewSection returns a pointer to a new zero section: a struct whose
	// fields carry yaml tags (nested structs become nested keys; supported
	// leaves are strings and string types, bools, ints, int64s,
	// time.Durations and string lists). Required with Key.
	NewSection func() any
	// Defaults sets the zero fields of section (a pointer NewSection
	// returned) to their defaults. Optional.
	Defaults func(section any)
	// Validate checks section (defaults applied). selected is whether the
	// transport is the configured broker (Config.Broker == Name), for keys
	// that are required only then. It returns *ConfigError values (joined
	// with errors.Join when several), Field relative to the section.
	// Optional.
	Validate func(section any, selected bool) error
	// Words are words of the transport's configuration (enumerated values
	// such as SASL mechanisms) that a secret may equal by accident: errors
	// and printed configs never mask them (see Config.Redacted). The
	// transport's Name is one without being listed. Optional.
	Words []string
	// Endpoints returns the host:port addresses of the broker section
	// (defaults applied) names, for readiness checks that dial them
	// (omnibus relay and ingest's /readyz). Optional.
	Endpoints func(section any) []string
}

var (
	registryMu sync.RWMutex
	registry   = map[string]Transport{}
	sections   = map[string]Transport{} // by Key
)

// Register makes a transport available to OpenBroker as Config.Broker =
// t.Name, and its section (if any) to LoadConfig. Transports call it from an
// init function, so importing a transport package — or transports/all for
// every built-in one — is what links it into a program:
//
//	import _ "github.com/omnibus-go/omnibus/transports/all"
//
// It panics if a required field is missing, if the name or the key is
// already registered, if the key is a top-level key of Config, or if the
// section has a field bus cannot load.
func Register(t Transport) {
	if t.Name == "" || t.Open == nil {
		panic("bus: Register with an empty Name or a nil Open")
	}
	if t.Key != "" {
		if t.NewSection == nil {
			panic("bus: Register " + t.Name + ": a Key needs NewSection")
		}
		if t.EnvPrefix == "" {
			t.EnvPrefix = EnvName(t.Key) + "_"
		}
		if !strings.HasPrefix(t.EnvPrefix, envPrefix) {
			panic("bus: Register " + t.Name + ": EnvPrefix " + t.EnvPrefix + " does not start with " + envPrefix)
		}
		st := reflect.TypeOf(t.NewSection())
		if st == nil || st.Kind() != reflect.Pointer || st.Elem().Kind() != reflect.Struct {
			panic("bus: Register " + t.Name + ": NewSection must return a pointer to a struct")
		}
		if err := checkSectionType(st.Elem()); err != nil {
			panic("bus: Register " + t.Name + ": " + err.Error())
		}
		if _, top := topLevelKeys()[t.Key]; top {
			panic("bus: Register " + t.Name + ": " + t.Key + " is a top-level key of bus.Config")
		}
	}
	registryMu.Lock()
	defer registryMu.Unlock()
	if _, dup := registry[t.Name]; dup {
		panic("bus: Register called twice for broker " + t.Name)
	}
	if _, dup := sections[t.Key]; dup && t.Key != "" {
		panic("bus: Register " + t.Name + ": section " + t.Key + " is already registered")
	}
	registry[t.Name] = t
	if t.Key != "" {
		sections[t.Key] = t
		docTypeCache.Store(nil)
	}
}

// BrokerEndpoints returns the host:port addresses of cfg's broker (its
// transport's Endpoints), or nil when the transport names none (memory,
// postgres) or is not linked.
func BrokerEndpoints(cfg Config) []string {
	registryMu.RLock()
	t, ok := registry[cfg.Broker]
	registryMu.RUnlock()
	if !ok || t.Endpoints == nil || t.Key == "" {
		return nil
	}
	return t.Endpoints(cfg.WithDefaults().Section(t.Key))
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

// registeredSections returns the transports with a section, sorted by key.
func registeredSections() []Transport {
	registryMu.RLock()
	defer registryMu.RUnlock()
	out := make([]Transport, 0, len(sections))
	for _, t := range sections {
		out = append(out, t)
	}
	slices.SortFunc(out, func(a, b Transport) int { return strings.Compare(a.Key, b.Key) })
	return out
}

// sectionOf returns the transport whose section is key.
func sectionOf(key string) (Transport, bool) {
	registryMu.RLock()
	defer registryMu.RUnlock()
	t, ok := sections[key]
	return t, ok
}

// linkHint says how a broker gets linked into a program, without naming
// any: a transport registers itself from its package's init function.
const linkHint = `import its transport package (the built-in ones are github.com/omnibus-go/omnibus/transports/<broker>; import _ "github.com/omnibus-go/omnibus/transports/all" links every one)`

// linkedBrokers returns the names Config.Broker accepts: memory and postgres,
// which bus configures itself, and every registered transport.
func linkedBrokers() []string {
	out := []string{BrokerMemory, BrokerPostgres}
	for _, n := range RegisteredBrokers() {
		if !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out
}

func lookupBroker(name string) (BrokerFactory, error) {
	registryMu.RLock()
	t, ok := registry[name]
	registryMu.RUnlock()
	if ok {
		return t.Open, nil
	}
	return nil, &ConfigError{Field: "broker", Reason: fmt.Sprintf("%q is not linked into this program; %s", name, linkHint)}
}
