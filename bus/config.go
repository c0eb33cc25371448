package bus

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/omnibus-go/omnibus/internal/ident"
)

// The names of the two brokers whose configuration is bus's own: memory
// (the default, which needs nothing) and postgres (whose section, postgres:,
// is also the outbox's database). Every other transport names itself when it
// registers (see Register); bus names none of them.
const (
	BrokerMemory   = "memory"
	BrokerPostgres = "postgres"
)

// Defaults of Config's own keys (the transports' sections have theirs in
// their packages). docs/configuration.md lists them; a test keeps the two in
// step.
const (
	DefaultBroker             = BrokerMemory
	DefaultPostgresURL        = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
	DefaultPostgresMaxConns   = 10
	DefaultQueueTable         = "omnibus_queue"
	DefaultOutboxTable        = "omnibus_outbox"
	DefaultInboxTable         = "omnibus_inbox"
	DefaultConsumerGroup      = "omnibus"
	DefaultMaxAttempts        = 6
	DefaultRetention          = 7 * 24 * time.Hour
	DefaultRetryBase          = 10 * time.Second
	DefaultRetryCap           = time.Hour
	DefaultTransientDelay     = time.Second
	DefaultRelayBatchSize     = 100
	DefaultRelayRunLength     = 16
	DefaultRelayLease         = 30 * time.Second
	DefaultRelayPollInterval  = time.Second
	DefaultRelaySweepInterval = time.Minute
	// DefaultRelayVacuumInterval is how often relays and dispatchers vacuum
	// the lanes and notes tables of their table.
	DefaultRelayVacuumInterval = 10 * time.Second
	DefaultRelayTimeout        = 30 * time.Second
	DefaultRelayFailedPolicy   = "skip"
	DefaultBreakerThreshold    = 5
	DefaultBreakerOpenTimeout  = 5 * time.Second
	DefaultRelayCloseTimeout   = 30 * time.Second
	DefaultLogLevel            = "info"
	DefaultLogFormat           = "text"
	DefaultMetricsAddr         = "127.0.0.1:9464"
	DefaultTraces              = TracesOff
	// TracesOff and TracesOTLP are the values of observability.traces.
	TracesOff  = "off"
	TracesOTLP = "otlp"
	// MetricsOff as observability.metrics_addr turns the metrics endpoint off.
	MetricsOff = "-"
)

// Limits of Config's numbers: what the columns, pools and queues they end up
// in can hold. Validate refuses a larger value, naming the key and the limit.
const (
	// MaxAttemptsLimit bounds every attempt budget: outbox.max_attempts,
	// inbox.max_attempts, the transports' MaxAttempts and the budget a
	// message sets for itself (postgres.SetMaxAttempts). The column is an
	// int32; a budget this large already means "retry for days".
	MaxAttemptsLimit = 1000
	// MaxPostgresConns bounds postgres.max_conns (the pool size is an
	// int32; PostgreSQL's max_connections is rarely in the thousands).
	MaxPostgresConns = 10_000
	// MaxRelayBatchSize bounds relay.batch_size (keys one fetch takes).
	MaxRelayBatchSize = 10_000
	// MaxRelayRunLength bounds relay.run_length (rows of one key one fetch takes).
	MaxRelayRunLength = 1_000
	// MaxPayloadLimit bounds outbox.max_payload_bytes and
	// inbox.max_payload_bytes: a relay holds a fetch's payloads in memory,
	// and PostgreSQL's bytea tops out at 1 GiB.
	MaxPayloadLimit = 256 << 20
)

// MinPartitionInterval and MaxPartitionInterval bound
// outbox/inbox.partition_interval.
const (
	MinPartitionInterval = time.Minute
	MaxPartitionInterval = 31 * 24 * time.Hour
)

// tableObjectSuffixes name the objects the postgres migrations create for a
// table T in its schema: T itself, T_lanes, their indexes, sequences,
// functions, triggers and constraints. Two configured tables must not share
// any of these names (a test keeps the list in step with the migrations).
var tableObjectSuffixes = []string{"",
	"_lanes", "_lanes_pkey", "_lanes_ready_idx", "_notes", "_notes_pkey", "_notes_id_seq", "_notes_key_idx", "_pkey", "_id_seq",
	"_event_uidx", "_message_uidx", "_fetch_idx", "_key_idx", "_failed_idx", "_completed_idx",
	"_lane_fn", "_lane_lock_fn", "_lane_trg", "_notify_fn", "_notify_trg", "_status_check", "_max_attempts_check",
	// the partitioned layout (its partitions, T_p<start>, are named by time)
	"_default", "_interval_fn", "_dedup", "_dedup_pkey", "_dedup_at_idx", "_dedup_fn", "_dedup_trg", "_dedup_del_trg",
	"_created_fn", "_created_trg", "_event_idx", "_message_idx",
}

const (
	envPrefix = "OMNIBUS_"
	// maxTableNameLength is PostgreSQL's 63-byte identifier limit less the
	// suffixes of the companion lanes table, indexes and functions.
	maxTableNameLength = ident.MaxTableNameLen
)

// ErrInvalidConfig is wrapped by every error LoadConfig, ParseConfig,
// ApplyEnv and Validate return: test for it with errors.Is. Programs exit
// with a usage status on it (the omnibus command exits 2).
var ErrInvalidConfig = errors.New("invalid config")

// ConfigError names a configuration key (as written in YAML, dotted) and what
// is wrong with it.
type ConfigError struct {
	// Field is the dotted YAML key ("kafka.sasl.password"); "" for the file as a whole.
	Field string
	// Reason says what is wrong, with the accepted values where there is a list.
	Reason string
}

func (e *ConfigError) Error() string {
	if e.Field == "" {
		return ErrInvalidConfig.Error() + ": " + e.Reason
	}
	return ErrInvalidConfig.Error() + ": " + e.Field + ": " + e.Reason
}

// Is makes every ConfigError match ErrInvalidConfig.
func (e *ConfigError) Is(target error) bool { return target == ErrInvalidConfig }

// Config is the configuration of an omnibus service: which broker to use and
// how to reach it (the broker's own section, such as kafka:, belongs to its
// transport: see Section and Register), the outbox and inbox tables,
// retries, the processors and observability. Load it with LoadConfig (a YAML file, then OMNIBUS_*
// environment variables, which win), or build it in code: zero values mean
// the defaults (the Default* constants), so Config{} is a valid in-memory bus
// (the memory broker is linked by the omnibus package, transports/all and
// transports/memory).
//
// Printing a Config (String, %v, slog) never shows a secret: the fields
// tagged secret (of the registered sections too: the Redis and SASL
// passwords) and the password inside the PostgreSQL URL are redacted.
type Config struct {
	// Broker selects the transport: memory, postgres, kafka or redis (or the
	// name of a transport registered with Register). Default memory.
	// Switching brokers is a change of this key (and the broker's section),
	// not of code.
	Broker string `yaml:"broker"`
	// Postgres is the database of the outbox and inbox tables (and of the
	// postgres broker).
	Postgres PostgresConfig `yaml:"postgres"`
	// Outbox configures the outbox table.
	Outbox OutboxConfig `yaml:"outbox"`
	// Inbox configures the inbox table and what the ingest receives.
	Inbox InboxConfig `yaml:"inbox"`
	// Retry configures the backoff of counted and transient failures.
	Retry RetryConfig `yaml:"retry"`
	// Relay configures the processors' fetch, lease and protection settings.
	Relay RelayConfig `yaml:"relay"`
	// Observability configures logs and the metrics endpoint.
	Observability ObservabilityConfig `yaml:"observability"`

	// sections are the sections of the registered transports (see Section),
	// by key, each a pointer to the transport's section struct. A stored
	// section is never changed: SetSection stores a new map.
	sections map[string]any

	// expandedSecrets are the values ParseConfigEnv took from variables
	// whose names say secret: errors and printing hide them wherever they
	// landed.
	expandedSecrets []string
}

// PostgresConfig is the database connection.
type PostgresConfig struct {
	// URL is the connection string, postgres://user:password@host:port/db?…
	// or key=value form. Default DefaultPostgresURL (a local development
	// server). Its password is redacted when printed.
	URL string `yaml:"url" secret:"dsn"`
	// MaxConns bounds the connection pool. Default DefaultPostgresMaxConns.
	MaxConns int `yaml:"max_conns"`
	// QueueTable is the table the postgres broker publishes into (an inbox
	// table: one row per message and consumer group). Default DefaultQueueTable.
	QueueTable string `yaml:"queue_table"`
	// QueueGroups are the consumer groups a message published to the postgres
	// broker is delivered to: each gets its own row, so each group receives
	// every message once. Default: inbox.consumer_group.
	QueueGroups []string `yaml:"queue_groups"`
}

// OutboxConfig configures the outbox table.
type OutboxConfig struct {
	// Table is the outbox table, optionally schema-qualified. Default
	// DefaultOutboxTable.
	Table string `yaml:"table"`
	// MaxAttempts is the attempt budget of events that do not set their own.
	// Default DefaultMaxAttempts.
	MaxAttempts int `yaml:"max_attempts"`
	// Retention is how long completed rows are kept before cleanup deletes
	// them. Default DefaultRetention (7 days). In the partitioned layout it
	// is also how long an event is recognised as a duplicate, and relays drop
	// partitions older than it.
	Retention time.Duration `yaml:"retention"`
	// PartitionInterval, when set, makes migrate create the table in the
	// partitioned layout, one partition per interval (docs/operations.md,
	// "Partitions"). Between MinPartitionInterval and MaxPartitionInterval,
	// whole minutes. Default 0: one table.
	PartitionInterval time.Duration `yaml:"partition_interval"`
	// MaxPayloadBytes bounds an event's payload; Enqueue refuses a larger
	// one by name. Default 0: the transport's default, 1 MiB. At most
	// MaxPayloadLimit.
	MaxPayloadBytes int `yaml:"max_payload_bytes"`
}

// InboxConfig configures the inbox table and what the ingest receives.
type InboxConfig struct {
	// Table is the inbox table, optionally schema-qualified. Default
	// DefaultInboxTable.
	Table string `yaml:"table"`
	// ConsumerGroup is the group this service receives as: the broker's
	// consumer group and the inbox rows' group. Default DefaultConsumerGroup.
	ConsumerGroup string `yaml:"consumer_group"`
	// Topics are the broker topics the ingest stores into the inbox.
	// Required by `omnibus ingest`.
	Topics []string `yaml:"topics"`
	// MaxAttempts is the attempt budget of stored messages. Default
	// DefaultMaxAttempts.
	MaxAttempts int `yaml:"max_attempts"`
	// Retention is how long completed rows are kept before cleanup deletes
	// them. Default DefaultRetention. In the partitioned layout it is also
	// how long a message id is recognised as a duplicate (the dedup window),
	// and dispatchers drop partitions older than it.
	Retention time.Duration `yaml:"retention"`
	// PartitionInterval: as OutboxConfig.PartitionInterval, for the inbox.
	PartitionInterval time.Duration `yaml:"partition_interval"`
	// MaxPayloadBytes bounds a stored message's payload; a larger one is a
	// permanent failure of that message (the broker dead-letters it).
	// Default 0: the transport's default, 1 MiB. At most MaxPayloadLimit.
	MaxPayloadBytes int `yaml:"max_payload_bytes"`
}

// RetryConfig configures the backoff between tries (equal jitter: the delay
// after the k-th failure is drawn from [d/2, d] with d = min(cap, base·2^k)).
type RetryConfig struct {
	// Base is the first backoff step. Default DefaultRetryBase; a negative
	// value means no delay (retry on the next cycle).
	Base time.Duration `yaml:"base"`
	// Cap bounds one backoff step. Default DefaultRetryCap.
	Cap time.Duration `yaml:"cap"`
	// TransientDelay is when a transient failure (broker down, timeout, open
	// breaker) is tried again; it spends no attempt. Default DefaultTransientDelay.
	TransientDelay time.Duration `yaml:"transient_delay"`
}

// RelayConfig configures the processors: the outbox relay and, over the
// inbox, the dispatcher (fetch and lease settings), and the ingest (timeout
// and breaker).
type RelayConfig struct {
	// BatchSize is how many keys (and unkeyed rows) one fetch takes.
	// Default DefaultRelayBatchSize.
	BatchSize int `yaml:"batch_size"`
	// RunLength is how many rows of one key one fetch takes; 1 is head-only.
	// Default DefaultRelayRunLength.
	RunLength int `yaml:"run_length"`
	// Lease is how long fetched rows stay reserved; renewed while handled.
	// Default DefaultRelayLease.
	Lease time.Duration `yaml:"lease"`
	// PollInterval is how often the table is polled without a notification.
	// Default DefaultRelayPollInterval.
	PollInterval time.Duration `yaml:"poll_interval"`
	// SweepInterval is how often the relay recreates missing lanes (rows
	// inserted with the lane trigger disabled, lanes deleted by hand).
	// Default DefaultRelaySweepInterval; negative turns the sweep off.
	SweepInterval time.Duration `yaml:"sweep_interval"`
	// VacuumInterval is how often the relay vacuums the lanes and notes
	// tables of its table (small tables every lease and new key writes to;
	// docs/operations.md, "Vacuum"). Default DefaultRelayVacuumInterval;
	// negative turns it off.
	VacuumInterval time.Duration `yaml:"vacuum_interval"`
	// Timeout bounds one publish or handler call; a timeout is transient.
	// Default DefaultRelayTimeout.
	Timeout time.Duration `yaml:"timeout"`
	// FailedPolicy is skip (a failed row does not hold its key back) or block
	// (the key stays frozen behind it until an operator acts). Default skip.
	FailedPolicy string `yaml:"failed_policy"`
	// BreakerThreshold is how many failures in a row open the circuit breaker.
	// Default DefaultBreakerThreshold.
	BreakerThreshold int `yaml:"breaker_threshold"`
	// BreakerOpenTimeout is how long the breaker stays open before a probe.
	// Default DefaultBreakerOpenTimeout.
	BreakerOpenTimeout time.Duration `yaml:"breaker_open_timeout"`
	// CloseTimeout is how long a stopping processor waits for in-flight
	// messages before it releases their rows. Default DefaultRelayCloseTimeout.
	CloseTimeout time.Duration `yaml:"close_timeout"`
}

// ObservabilityConfig configures logs, metrics and trace export.
type ObservabilityConfig struct {
	// LogLevel is debug, info, warn or error. Default info.
	LogLevel string `yaml:"log_level"`
	// LogFormat is text or json. Default text.
	LogFormat string `yaml:"log_format"`
	// MetricsAddr is where `omnibus relay` and `omnibus ingest` serve
	// /metrics and /healthz, host:port; "-" turns the endpoint off. Default
	// DefaultMetricsAddr.
	MetricsAddr string `yaml:"metrics_addr"`
	// Traces is off or otlp: with otlp, `omnibus relay` and `omnibus
	// ingest` create OpenTelemetry spans (middleware.Tracing) and export
	// them over OTLP/HTTP. Default off (the trace context the events carry
	// is passed on either way).
	Traces string `yaml:"traces"`
	// OTLPEndpoint is the OTLP/HTTP traces URL, such as
	// http://collector:4318/v1/traces. Default: the standard
	// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT
	// variables, else http://localhost:4318/v1/traces.
	OTLPEndpoint string `yaml:"otlp_endpoint" secret:"dsn"`
}

// LoadConfig reads the YAML file at path (none when path is ""), expanding
// the ${VAR} and $VAR of its values (see ParseConfigEnv), then applies the
// OMNIBUS_* environment variables, which win over the file, fills in the
// defaults and validates the result. Every error wraps ErrInvalidConfig and
// names the key at fault; none shows a secret.
//
// An environment variable's name is OMNIBUS_ followed by the key's dotted
// path in upper case with underscores: postgres.url is OMNIBUS_POSTGRES_URL,
// kafka.sasl.password is OMNIBUS_KAFKA_SASL_PASSWORD. Lists are
// comma-separated (OMNIBUS_KAFKA_BROKERS=a:9092,b:9092), durations are Go
// durations (30s, 1h30m). An OMNIBUS_* variable that sets no key is an
// error, as an unknown YAML key is (CheckEnv).
func LoadConfig(path string) (Config, error) {
	if err := CheckEnv(os.Environ()); err != nil {
		return Config{}, err
	}
	return loadConfig(path, os.LookupEnv)
}

func loadConfig(path string, lookup func(string) (string, bool)) (Config, error) {
	var data []byte
	if path != "" {
		var err error
		if data, err = os.ReadFile(path); err != nil {
			return Config{}, &ConfigError{Reason: fmt.Sprintf("read config file: %v", err)}
		}
	}
	return loadConfigData(path, data, lookup)
}

// loadConfigData is LoadConfig of a file's content (none when path is "").
func loadConfigData(path string, data []byte, lookup func(string) (string, bool)) (Config, error) {
	var cfg Config
	if path != "" {
		var err error
		if cfg, err = ParseConfigEnv(data, lookup); err != nil {
			return Config{}, fmt.Errorf("%s: %w", path, err)
		}
	}
	if err := cfg.ApplyEnv(lookup); err != nil {
		return Config{}, err
	}
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return Config{}, err
	}
	return cfg, nil
}

// ParseConfig decodes a YAML document into a Config, expanding the
// environment variables (os.LookupEnv) its values name; see ParseConfigEnv.
// Defaults are not applied and nothing is validated.
func ParseConfig(data []byte) (Config, error) {
	return ParseConfigEnv(data, os.LookupEnv)
}

// ParseConfigEnv decodes a YAML document into a Config. Unknown keys are an
// error (a misspelled key must not be ignored silently). Defaults are not
// applied and nothing is validated.
//
// In every value (not in keys or comments), ${NAME} and $NAME are replaced by
// the variable lookup finds, as text: the value may hold any character,
// YAML's included, and a number key gets a number. $$ is a literal $, and a $
// not followed by a letter, _ or { is kept as it is. A variable that is not
// set is an error naming it, the key and the line (a variable set to "" gives
// ""), and so is a ${ without a name and its closing }. A value from a
// variable whose name says secret (PASSWORD, TOKEN, KEY, …), or put into a
// secret key, is treated as a secret wherever it lands: errors and printing
// never show it.
func ParseConfigEnv(data []byte, lookup func(string) (string, bool)) (Config, error) {
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		msg := nameYAMLKeys(data, strings.TrimPrefix(err.Error(), "yaml: "))
		return Config{}, &ConfigError{Reason: "parse YAML: " + hideAnchorNames(msg)}
	}
	if len(root.Content) == 0 {
		return Config{}, nil // an empty document
	}
	doc := root.Content[0]
	var problems []string
	d := reflect.New(layout().typ)
	checkKnownKeys(doc, d.Type().Elem(), "", map[*yaml.Node]bool{}, &problems)
	x := expander{lookup: lookup, keys: configKeyFields(), seen: map[*yaml.Node]bool{}, lines: map[int]bool{}}
	x.walk(doc, "")

	if err := doc.Decode(d.Interface()); err != nil {
		var te *yaml.TypeError
		if errors.As(err, &te) {
			for _, m := range te.Errors {
				problems = append(problems, x.hideExpandedValues(m))
			}
		} else {
			problems = append(problems, strings.TrimPrefix(err.Error(), "yaml: "))
		}
	}
	cfg := Config{}.fromDoc(d.Elem())
	cfg.expandedSecrets = x.secrets
	secrets := append(cfg.secretValues(), x.secrets...)
	var errs []error
	if len(problems) > 0 {
		msg := nameYAMLKeys(data, strings.Join(problems, "; "))
		errs = append(errs, &ConfigError{Reason: "parse YAML: " + scrub(hideAnchorNames(msg), secrets)})
	}
	errs = append(errs, x.errs...)
	if err := errors.Join(errs...); err != nil {
		return Config{}, err
	}
	return cfg, nil
}

// checkKnownKeys reports the keys of the mapping n that the struct t has no
// field for, as yaml's KnownFields does ("KEY (line N): field X not found in
// type T"), and descends into the fields that are structs. Merge keys (<<)
// are checked against t too.
func checkKnownKeys(n *yaml.Node, t reflect.Type, prefix string, seen map[*yaml.Node]bool, problems *[]string) {
	for n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	if seen[n] {
		return
	}
	seen[n] = true
	switch n.Kind {
	case yaml.SequenceNode: // the value of a merge key: a list of mappings
		for _, item := range n.Content {
			checkKnownKeys(item, t, prefix, seen, problems)
		}
		return
	case yaml.MappingNode:
	default:
		return // a scalar where a mapping belongs: Decode reports it
	}
	fields := yamlFields(t)
	typeName := t.String()
	if prefix == "" {
		typeName = "bus.Config"
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.ShortTag() == "!!merge" {
			checkKnownKeys(v, t, prefix, seen, problems)
			continue
		}
		key := k.Value
		if prefix != "" {
			key = prefix + "." + k.Value
		}
		ft, ok := fields[k.Value]
		if !ok && prefix == "" && v.Kind == yaml.MappingNode {
			*problems = append(*problems, fmt.Sprintf("%s (line %d): field %s not found in type %s; if it is the section of a broker, that broker is not linked into this program (%s)",
				key, k.Line, k.Value, typeName, linkHint))
			continue
		}
		if !ok {
			*problems = append(*problems, fmt.Sprintf("%s (line %d): field %s not found in type %s", key, k.Line, k.Value, typeName))
			continue
		}
		if isNested(ft) {
			checkKnownKeys(v, ft, key, seen, problems)
		}
	}
}

// keyField is what the expander needs to know of a configuration key.
type keyField struct {
	typ    reflect.Type
	secret bool
}

// configKeyFields maps every dotted key to its field.
func configKeyFields() map[string]keyField {
	out := map[string]keyField{}
	walkConfig(Config{}.doc(), "", func(key string, f reflect.StructField, _ reflect.Value) {
		out[key] = keyField{typ: f.Type, secret: f.Tag.Get("secret") != ""}
	})
	return out
}

// expander expands the environment variables in the values of a YAML tree.
type expander struct {
	lookup  func(string) (string, bool)
	keys    map[string]keyField
	seen    map[*yaml.Node]bool
	lines   map[int]bool // lines of values that were expanded
	secrets []string     // expanded values to be kept secret
	errs    []error
}

// walk expands the scalar values under n, whose dotted key is key. Each node
// is expanded once, however many aliases point to it.
func (x *expander) walk(n *yaml.Node, key string) {
	if n.Kind == yaml.AliasNode || x.seen[n] {
		return
	}
	x.seen[n] = true
	switch n.Kind {
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			child := k.Value
			if k.ShortTag() == "!!merge" {
				child = key
			} else if key != "" {
				child = key + "." + k.Value
			}
			x.walk(v, child)
		}
	case yaml.SequenceNode:
		for i, item := range n.Content {
			x.walk(item, fmt.Sprintf("%s[%d]", key, i))
		}
	case yaml.ScalarNode:
		x.scalar(n, key)
	}
}

func (x *expander) scalar(n *yaml.Node, key string) {
	if !strings.Contains(n.Value, "$") {
		return
	}
	// A list item ("inbox.topics[1]") has the field of its list.
	listKey, _, _ := strings.Cut(key, "[")
	field, known := x.keys[listKey]
	out, used, problem := expandVars(n.Value, x.lookup, field.secret)
	if problem != "" {
		x.errs = append(x.errs, &ConfigError{Field: key, Reason: fmt.Sprintf("line %d: %s", n.Line, problem)})
		return
	}
	for _, u := range used {
		if field.secret || secretKey(u.name) {
			x.secrets = append(x.secrets, u.value)
		}
	}
	if out == n.Value {
		return
	}
	x.lines[n.Line] = true
	n.Value = out
	// A value expanded into a string key stays a string ("null", "0x10"); in
	// any other key it is read as if it had been written in the file.
	isString := known && (field.typ.Kind() == reflect.String || field.typ.Kind() == reflect.Slice)
	if n.Style&yaml.TaggedStyle == 0 {
		if isString {
			n.Tag = "!!str"
		} else {
			n.Tag = ""
		}
	}
}

var yamlQuotedValueRE = regexp.MustCompile("`[^`]*`")

// hideExpandedValues drops the value yaml quotes in a decoding error when it
// came from the environment (it may be a secret put in the wrong key).
func (x *expander) hideExpandedValues(msg string) string {
	m := yamlLineRE.FindStringSubmatch(msg)
	if m == nil {
		return msg
	}
	if line, _ := strconv.Atoi(m[1]); !x.lines[line] {
		return msg
	}
	return yamlQuotedValueRE.ReplaceAllLiteralString(msg, "(a value from the environment)")
}

// expandedVar is a variable a value used.
type expandedVar struct{ name, value string }

// expandVars expands ${NAME} and $NAME in s (NAME: a letter or _, then
// letters, digits and _), $$ to $, and keeps any other $. It returns the
// result and the variables used, or a problem: an unset variable (named,
// unless inSecret and written $NAME: then the name may be part of a password
// that needed $$) or a ${ without a name and its closing }.
func expandVars(s string, lookup func(string) (string, bool), inSecret bool) (string, []expandedVar, string) {
	var b strings.Builder
	var used []expandedVar
	for i := 0; i < len(s); i++ {
		if s[i] != '$' || i+1 == len(s) {
			b.WriteByte(s[i])
			continue
		}
		var name string
		braced := false
		switch next := s[i+1]; {
		case next == '$':
			b.WriteByte('$')
			i++
			continue
		case next == '{':
			end := strings.IndexByte(s[i+2:], '}')
			if end < 0 || !isVarName(s[i+2:i+2+end]) {
				return "", nil, "a ${ without a variable name and its closing } (write ${NAME}, or $$ for a literal $)"
			}
			name, braced = s[i+2:i+2+end], true
			i += 2 + end
		case next == '_' || 'A' <= next && next <= 'Z' || 'a' <= next && next <= 'z':
			j := i + 1
			for j < len(s) && isVarByte(s[j]) {
				j++
			}
			name = s[i+1 : j]
			i = j - 1
		default:
			b.WriteByte('$')
			continue
		}
		value, ok := lookup(name)
		if !ok {
			switch {
			case braced:
				return "", nil, fmt.Sprintf("${%s} is not set (set the variable, or write $$ for a literal $)", name)
			case inSecret:
				return "", nil, "a $NAME in this secret value is not set; the name is not shown, it may be part of the secret (set the variable, or write $$ for a literal $)"
			default:
				return "", nil, fmt.Sprintf("$%s is not set (set the variable, or write $$ for a literal $)", name)
			}
		}
		used = append(used, expandedVar{name: name, value: value})
		b.WriteString(value)
	}
	return b.String(), used, ""
}

func isVarByte(c byte) bool {
	return c == '_' || 'A' <= c && c <= 'Z' || 'a' <= c && c <= 'z' || '0' <= c && c <= '9'
}

func isVarName(s string) bool {
	if s == "" || '0' <= s[0] && s[0] <= '9' {
		return false
	}
	for i := range len(s) {
		if !isVarByte(s[i]) {
			return false
		}
	}
	return true
}

var yamlAnchorRE = regexp.MustCompile(`anchor '[^']*'`)

// hideAnchorNames drops the names from YAML's anchor errors: an unquoted
// value that starts with '*' (a password, say) is read as an alias, and the
// error would quote the rest of it.
func hideAnchorNames(msg string) string {
	return yamlAnchorRE.ReplaceAllLiteralString(msg, "anchor (an unquoted value starting with * or & is an alias or anchor: quote it)")
}

var yamlLineRE = regexp.MustCompile(`line (\d+): `)

// nameYAMLKeys puts the dotted key in front of each "line N: " of a YAML
// decoding error, so that the message names the key at fault.
func nameYAMLKeys(data []byte, msg string) string {
	var root yaml.Node
	if yaml.Unmarshal(data, &root) != nil || len(root.Content) == 0 {
		return msg
	}
	keys := map[int]string{}
	var walk func(n *yaml.Node, prefix string)
	walk = func(n *yaml.Node, prefix string) {
		if n.Kind != yaml.MappingNode {
			return
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			key := k.Value
			if prefix != "" {
				key = prefix + "." + key
			}
			keys[k.Line] = key
			if v.Line != k.Line {
				keys[v.Line] = key
			}
			walk(v, key)
		}
	}
	walk(root.Content[0], "")
	return yamlLineRE.ReplaceAllStringFunc(msg, func(m string) string {
		line, _ := strconv.Atoi(yamlLineRE.FindStringSubmatch(m)[1])
		if key, ok := keys[line]; ok {
			return key + " (" + m[:len(m)-2] + "): "
		}
		return m
	})
}

// ApplyEnv overrides c's keys with the OMNIBUS_* variables lookup finds
// (os.LookupEnv in LoadConfig). A variable set to "" sets the key to its zero
// value, which means its default.
func (c *Config) ApplyEnv(lookup func(string) (string, bool)) error {
	var bad []*ConfigError
	d := c.doc()
	walkConfig(d, "", func(key string, f reflect.StructField, v reflect.Value) {
		name := EnvName(key)
		raw, ok := lookup(name)
		if !ok {
			return
		}
		if err := setFromString(v, raw); err != nil {
			shown := strconv.Quote(redactValue(raw))
			if f.Tag.Get("secret") != "" {
				shown = "(value not shown)"
			}
			bad = append(bad, &ConfigError{Field: key, Reason: fmt.Sprintf("%s=%s: %v", name, shown, err)})
		}
	})
	*c = c.fromDoc(d)
	// The secrets are known once every variable is applied.
	secrets := append(c.secretValues(), c.expandedSecrets...)
	errs := make([]error, len(bad))
	for i, e := range bad {
		e.Reason = scrub(e.Reason, secrets)
		errs[i] = e
	}
	return errors.Join(errs...)
}

// EnvName returns the environment variable that sets the dotted key:
// EnvName("kafka.sasl.password") is "OMNIBUS_KAFKA_SASL_PASSWORD". A key of
// a registered section takes the section's Transport.EnvPrefix.
func EnvName(key string) string {
	prefix := envPrefix
	if section, rest, ok := strings.Cut(key, "."); ok {
		if t, ok := sectionOf(section); ok {
			prefix, key = t.EnvPrefix, rest
		}
	}
	return prefix + strings.ToUpper(strings.ReplaceAll(key, ".", "_"))
}

func setFromString(v reflect.Value, raw string) error {
	raw = strings.TrimSpace(raw)
	switch {
	case v.Type() == reflect.TypeFor[time.Duration]():
		if raw == "" {
			v.SetInt(0)
			return nil
		}
		d, err := time.ParseDuration(raw)
		if err != nil {
			return errors.New("not a duration (examples: 500ms, 30s, 1h)")
		}
		v.SetInt(int64(d))
	case v.Kind() == reflect.String:
		v.SetString(raw)
	case v.Kind() == reflect.Bool:
		if raw == "" {
			v.SetBool(false)
			return nil
		}
		b, err := strconv.ParseBool(raw)
		if err != nil {
			return errors.New("not a boolean (true or false)")
		}
		v.SetBool(b)
	case v.Kind() == reflect.Int || v.Kind() == reflect.Int64:
		if raw == "" {
			v.SetInt(0)
			return nil
		}
		n, err := strconv.ParseInt(raw, 10, 64)
		if err != nil || v.OverflowInt(n) {
			return errors.New("not an integer")
		}
		v.SetInt(n)
	case v.Kind() == reflect.Slice && v.Type().Elem().Kind() == reflect.String:
		var items []string
		for item := range strings.SplitSeq(raw, ",") {
			if item = strings.TrimSpace(item); item != "" {
				items = append(items, item)
			}
		}
		v.Set(reflect.ValueOf(items))
	default:
		return fmt.Errorf("unsupported type %s", v.Type())
	}
	return nil
}

// ConfigKeys returns every configuration key, dotted: Config's own, with
// the keys of the registered transports' sections after postgres.
func ConfigKeys() []string {
	var keys []string
	walkConfig(Config{}.doc(), "", func(key string, _ reflect.StructField, _ reflect.Value) {
		keys = append(keys, key)
	})
	return keys
}

// WithDefaults returns c with every zero key set to its default, those of
// the registered sections included.
func (c Config) WithDefaults() Config {
	setDefault(&c.Broker, DefaultBroker)
	setDefault(&c.Postgres.URL, DefaultPostgresURL)
	setDefault(&c.Postgres.MaxConns, DefaultPostgresMaxConns)
	setDefault(&c.Postgres.QueueTable, DefaultQueueTable)
	c = c.withSectionDefaults()
	setDefault(&c.Outbox.Table, DefaultOutboxTable)
	setDefault(&c.Outbox.MaxAttempts, DefaultMaxAttempts)
	setDefault(&c.Outbox.Retention, DefaultRetention)
	setDefault(&c.Inbox.Table, DefaultInboxTable)
	setDefault(&c.Inbox.ConsumerGroup, DefaultConsumerGroup)
	setDefault(&c.Inbox.MaxAttempts, DefaultMaxAttempts)
	setDefault(&c.Inbox.Retention, DefaultRetention)
	if len(c.Postgres.QueueGroups) == 0 {
		c.Postgres.QueueGroups = []string{c.Inbox.ConsumerGroup}
	} else {
		c.Postgres.QueueGroups = slices.Clone(c.Postgres.QueueGroups)
	}
	c.Inbox.Topics = slices.Clone(c.Inbox.Topics)
	setDefault(&c.Retry.Base, DefaultRetryBase)
	setDefault(&c.Retry.Cap, DefaultRetryCap)
	setDefault(&c.Retry.TransientDelay, DefaultTransientDelay)
	setDefault(&c.Relay.BatchSize, DefaultRelayBatchSize)
	setDefault(&c.Relay.RunLength, DefaultRelayRunLength)
	setDefault(&c.Relay.Lease, DefaultRelayLease)
	setDefault(&c.Relay.PollInterval, DefaultRelayPollInterval)
	setDefault(&c.Relay.SweepInterval, DefaultRelaySweepInterval)
	setDefault(&c.Relay.VacuumInterval, DefaultRelayVacuumInterval)
	setDefault(&c.Relay.Timeout, DefaultRelayTimeout)
	setDefault(&c.Relay.FailedPolicy, DefaultRelayFailedPolicy)
	setDefault(&c.Relay.BreakerThreshold, DefaultBreakerThreshold)
	setDefault(&c.Relay.BreakerOpenTimeout, DefaultBreakerOpenTimeout)
	setDefault(&c.Relay.CloseTimeout, DefaultRelayCloseTimeout)
	setDefault(&c.Observability.LogLevel, DefaultLogLevel)
	setDefault(&c.Observability.LogFormat, DefaultLogFormat)
	setDefault(&c.Observability.MetricsAddr, DefaultMetricsAddr)
	setDefault(&c.Observability.Traces, DefaultTraces)
	return c
}

func setDefault[T comparable](p *T, def T) {
	var zero T
	if *p == zero {
		*p = def
	}
}

// Validate reports every invalid key of c (zero keys stand for their
// defaults and are valid), joined; each is a *ConfigError naming the key and,
// where there is a list, the accepted values. It checks what can be known
// without connecting: required keys of the selected broker, enumerations,
// ranges (numbers up to what they are stored in: MaxAttemptsLimit,
// MaxPostgresConns, MaxRelayBatchSize, MaxRelayRunLength), table names and
// the names of the objects each table brings (no two tables may need the
// same), postgres.url with the driver's grammar, addresses. Its messages
// quote values redacted and never show a secret of c.
func (c Config) Validate() error {
	c = c.WithDefaults()
	ck := &Check{secrets: append(c.secretValues(), c.expandedSecrets...)}
	bad := ck.Fail
	show := Quote
	table := func(field, name string) {
		if !ident.Table(name) {
			bad(field, "%s is not a table name (letters, digits and _, not starting with a digit, optionally schema.table)", show(name))
			return
		}
		for part := range strings.SplitSeq(name, ".") {
			if len(part) > maxTableNameLength {
				bad(field, "%s: %s is longer than %d bytes (room is left for the suffixes of its lanes table and indexes)", show(name), show(part), maxTableNameLength)
			}
		}
	}

	if brokers := linkedBrokers(); !slices.Contains(brokers, c.Broker) {
		bad("broker", "%s is not one of the brokers linked into this program (%s); to link another, %s",
			show(c.Broker), strings.Join(brokers, ", "), linkHint)
	}

	// postgres
	if err := checkPostgresURL(c.Postgres.URL); err != nil {
		bad("postgres.url", "%v", err)
	}
	ck.UpTo("postgres.max_conns", int64(c.Postgres.MaxConns), MaxPostgresConns)
	table("postgres.queue_table", c.Postgres.QueueTable)
	for i, g := range c.Postgres.QueueGroups {
		if strings.TrimSpace(g) == "" {
			bad(fmt.Sprintf("postgres.queue_groups[%d]", i), "must not be empty")
		}
	}
	if dup := firstDuplicate(c.Postgres.QueueGroups); dup != "" {
		bad("postgres.queue_groups", "%s is listed twice", show(dup))
	}

	// the sections of the registered transports
	for _, t := range registeredSections() {
		if t.Validate != nil {
			ck.sectionErrors(t.Key, t.Validate(c.sections[t.Key], c.Broker == t.Name))
		}
	}

	// outbox and inbox
	table("outbox.table", c.Outbox.Table)
	ck.UpTo("outbox.max_attempts", int64(c.Outbox.MaxAttempts), MaxAttemptsLimit)
	ck.NotNegativeDuration("outbox.retention", c.Outbox.Retention)
	ck.PartitionInterval("outbox.partition_interval", c.Outbox.PartitionInterval)
	ck.UpTo("outbox.max_payload_bytes", int64(c.Outbox.MaxPayloadBytes), MaxPayloadLimit)
	table("inbox.table", c.Inbox.Table)
	tables := []struct{ field, name string }{
		{"outbox.table", c.Outbox.Table}, {"inbox.table", c.Inbox.Table}, {"postgres.queue_table", c.Postgres.QueueTable},
	}
	for _, t := range tables {
		if tableKey(t.name) == tableKey(migrationsTable) {
			bad(t.field, "%s is the table of applied migrations", migrationsTable)
		}
	}
	for i, b := range tables {
		for _, a := range tables[:i] {
			switch shared := sharedTableObject(a.name, b.name); {
			case tableKey(a.name) == tableKey(b.name) && b.field == "inbox.table":
				bad(b.field, "%s is also outbox.table: the outbox and the inbox need tables of their own", show(b.name))
			case tableKey(a.name) == tableKey(b.name):
				bad(b.field, "%s is also %s: the postgres broker needs a table of its own", show(b.name), a.field)
			case shared != "":
				bad(b.field, "%s collides with %s %s: both need %q (each table brings objects named after it: its lanes table, indexes, functions)",
					show(b.name), a.field, show(a.name), shared)
			}
		}
	}
	if strings.TrimSpace(c.Inbox.ConsumerGroup) != c.Inbox.ConsumerGroup {
		bad("inbox.consumer_group", "%s has leading or trailing spaces", show(c.Inbox.ConsumerGroup))
	}
	for i, t := range c.Inbox.Topics {
		if strings.TrimSpace(t) == "" {
			bad(fmt.Sprintf("inbox.topics[%d]", i), "must not be empty")
		}
	}
	if dup := firstDuplicate(c.Inbox.Topics); dup != "" {
		bad("inbox.topics", "%s is listed twice", show(dup))
	}
	ck.UpTo("inbox.max_attempts", int64(c.Inbox.MaxAttempts), MaxAttemptsLimit)
	ck.NotNegativeDuration("inbox.retention", c.Inbox.Retention)
	ck.PartitionInterval("inbox.partition_interval", c.Inbox.PartitionInterval)
	ck.UpTo("inbox.max_payload_bytes", int64(c.Inbox.MaxPayloadBytes), MaxPayloadLimit)

	// retry
	if c.Retry.Base > 0 && c.Retry.Cap < c.Retry.Base {
		bad("retry.cap", "%s is less than retry.base (%s)", c.Retry.Cap, c.Retry.Base)
	}
	ck.NotNegativeDuration("retry.cap", c.Retry.Cap)
	ck.NotNegativeDuration("retry.transient_delay", c.Retry.TransientDelay)

	// relay
	ck.UpTo("relay.batch_size", int64(c.Relay.BatchSize), MaxRelayBatchSize)
	ck.UpTo("relay.run_length", int64(c.Relay.RunLength), MaxRelayRunLength)
	ck.NotNegativeDuration("relay.lease", c.Relay.Lease)
	if c.Relay.Lease > 0 && c.Relay.Lease < time.Second {
		bad("relay.lease", "%s is too short: at least 1s", c.Relay.Lease)
	}
	ck.NotNegativeDuration("relay.poll_interval", c.Relay.PollInterval)
	ck.NotNegativeDuration("relay.timeout", c.Relay.Timeout)
	ck.OneOf("relay.failed_policy", c.Relay.FailedPolicy, "skip", "block")
	ck.NotNegative("relay.breaker_threshold", int64(c.Relay.BreakerThreshold))
	ck.NotNegativeDuration("relay.breaker_open_timeout", c.Relay.BreakerOpenTimeout)
	ck.NotNegativeDuration("relay.close_timeout", c.Relay.CloseTimeout)

	// observability
	ck.OneOf("observability.log_level", c.Observability.LogLevel, "debug", "info", "warn", "error")
	ck.OneOf("observability.log_format", c.Observability.LogFormat, "text", "json")
	if c.Observability.MetricsAddr != MetricsOff {
		ck.HostPort("observability.metrics_addr", c.Observability.MetricsAddr)
	}
	ck.OneOf("observability.traces", c.Observability.Traces, TracesOff, TracesOTLP)
	if e := c.Observability.OTLPEndpoint; e != "" {
		// The URL is shown redacted, and net/url's error, which quotes it
		// whole, is not shown at all.
		if u, err := url.Parse(e); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			bad("observability.otlp_endpoint", "%s is not an http(s) URL such as http://collector:4318/v1/traces", strconv.Quote(RedactDSN(e)))
		}
	}
	return ck.Err()
}

func firstDuplicate(items []string) string {
	seen := make(map[string]bool, len(items))
	for _, it := range items {
		if seen[it] {
			return it
		}
		seen[it] = true
	}
	return ""
}

// checkPostgresURL accepts what the PostgreSQL driver accepts: a
// postgres:// or postgresql:// URL (libpq's grammar, several hosts allowed)
// or libpq key=value pairs. Its errors show the string only redacted, and
// never the parts that do not parse (they may be a misplaced password).
func checkPostgresURL(s string) error {
	if loc := schemeRE.FindStringIndex(s); loc != nil {
		if !strings.HasPrefix(s, "postgres://") && !strings.HasPrefix(s, "postgresql://") {
			scheme := strings.TrimSpace(s[:loc[1]-len("://")])
			if scheme == "postgres" || scheme == "postgresql" {
				return errors.New("must start with postgres:// or postgresql://, without spaces before it")
			}
			return fmt.Errorf("scheme %q is not postgres or postgresql", scheme)
		}
		if why := checkLibpqURL(s[loc[1]:]); why != "" {
			return fmt.Errorf("%s is not a valid URL: %s", strconv.Quote(RedactDSN(s)), why)
		}
		return nil
	}
	kv := parseKeyValue(s)
	switch {
	case kv.failAt < 0 && strings.IndexByte(s, 0) >= 0:
		return errors.New("contains a NUL byte")
	case kv.failAt < 0:
		return nil
	case kv.pairs == 0:
		return errors.New("is neither a postgres:// URL nor a key=value connection string (the value is not shown: it may hold a password)")
	default:
		return fmt.Errorf("%s is not a valid key=value connection string: %s", strconv.Quote(RedactDSN(s)), kv.reason)
	}
}

// urlEncodeHint ends the messages about URLs whose user info may hold an
// unescaped character.
const urlEncodeHint = " (percent-encode these characters of a user name or password: @ as %40, / as %2F, ? as %3F, # as %23, : as %3A, % as %25)"

// checkLibpqURL checks rest, a connection URL after its "postgres://", with
// the grammar of libpq (as the PostgreSQL driver implements it): user info up
// to the first '@' before any '/', a comma-separated list of host[:port]
// (IPv6 in brackets), /database, ?key=value&…. It returns why the URL is not
// valid, or "". It also refuses what the driver would take apart in a way
// nobody means: an '@' in a host or in the database name is the rest of a
// password with an unescaped '@'.
// checkPortList checks the comma-joined ports of a URL's hosts as the
// driver reads them: spaces around the whole list are dropped, a space
// inside it is refused, the list is percent-decoded, and each port that is
// not empty is a number from 1 to 65535.
func checkPortList(raw string) string {
	raw = strings.Trim(raw, " ")
	if raw == "" {
		return ""
	}
	if strings.Contains(raw, " ") {
		return "a port has a space in it" + urlEncodeHint
	}
	dec, err := url.PathUnescape(raw)
	if err != nil || strings.IndexByte(dec, 0) >= 0 {
		return "a port has a % that is not followed by two hex digits (or encodes NUL)"
	}
	for i, port := range strings.Split(dec, ",") {
		if port == "" {
			continue
		}
		if pn, err := strconv.ParseUint(port, 10, 16); err != nil || pn == 0 {
			return fmt.Sprintf("host %d: the port is not a number from 1 to 65535", i+1) + urlEncodeHint
		}
	}
	return ""
}

func checkLibpqURL(rest string) string {
	if strings.IndexByte(rest, 0) >= 0 {
		return "it contains a NUL byte"
	}
	p := rest
	if i := strings.IndexAny(p, "@/"); i >= 0 && p[i] == '@' {
		if !validPercentEncoding(p[:i]) {
			return "the user name or password has a % that is not followed by two hex digits" + urlEncodeHint
		}
		p = p[i+1:]
	}
	// The ports of every host, comma-joined as the driver reads them.
	var ports strings.Builder
	for n := 1; ; n++ {
		if strings.HasPrefix(p, "[") {
			end := strings.IndexByte(p, ']')
			switch {
			case end < 0:
				return fmt.Sprintf("host %d: an IPv6 address without its closing ]", n)
			case end == 1:
				return fmt.Sprintf("host %d: an empty IPv6 address", n)
			}
			p = p[end+1:]
			if p != "" && !strings.ContainsRune(":/?,", rune(p[0])) {
				return fmt.Sprintf("host %d: text after the IPv6 address that is not :port", n)
			}
		} else {
			i := strings.IndexAny(p, ":/?,")
			if i < 0 {
				i = len(p)
			}
			if strings.Contains(p[:i], "@") {
				return fmt.Sprintf("host %d contains '@'", n) + urlEncodeHint
			}
			if !validPercentEncoding(p[:i]) {
				return fmt.Sprintf("host %d has a %% that is not followed by two hex digits", n)
			}
			p = p[i:]
		}
		if strings.HasPrefix(p, ":") {
			p = p[1:]
			i := strings.IndexAny(p, "/?,")
			if i < 0 {
				i = len(p)
			}
			ports.WriteString(p[:i])
			p = p[i:]
		}
		if !strings.HasPrefix(p, ",") {
			break
		}
		p = p[1:]
		ports.WriteByte(',')
	}
	if why := checkPortList(ports.String()); why != "" {
		return why
	}
	if strings.HasPrefix(p, "/") {
		db := p[1:]
		p = ""
		if i := strings.IndexByte(db, '?'); i >= 0 {
			db, p = db[:i], db[i:]
		}
		if strings.Contains(db, "@") {
			return "the database name contains '@'" + urlEncodeHint
		}
		if !validPercentEncoding(db) {
			return "the database name has a % that is not followed by two hex digits"
		}
	}
	if strings.HasPrefix(p, "?") {
		// As libpq: pairs are read while text is left, so "?" and a
		// trailing "&" are fine.
		params := p[1:]
		for n := 1; params != ""; n++ {
			pair := params
			if i := strings.IndexByte(params, '&'); i >= 0 {
				pair, params = params[:i], params[i+1:]
			} else {
				params = ""
			}
			if strings.Count(pair, "=") != 1 {
				return fmt.Sprintf("query parameter %d is not key=value (one '=')", n)
			}
			if !validPercentEncoding(pair) {
				return fmt.Sprintf("query parameter %d has a %% that is not followed by two hex digits", n)
			}
		}
	}
	return ""
}

// validPercentEncoding reports whether every '%' of s starts a %XX escape.
func validPercentEncoding(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] != '%' {
			continue
		}
		if i+2 >= len(s) || !isHex(s[i+1]) || !isHex(s[i+2]) {
			return false
		}
		i += 2
	}
	return true
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

// migrationsTable is the table in which the postgres migrations record what
// they applied, one per schema.
const migrationsTable = "omnibus_schema_migrations"

// tableKey is the schema-qualified name of a configured table, for
// comparisons: an unqualified table is in schema public (the default
// search_path). Names are compared as written: they are quoted in SQL.
func tableKey(name string) string {
	if strings.Contains(name, ".") {
		return name
	}
	return "public." + name
}

// sharedTableObject returns a name (schema-qualified) that the objects of the
// tables a and b would both take, or "".
func sharedTableObject(a, b string) string {
	ka, kb := tableKey(a), tableKey(b)
	for _, sa := range tableObjectSuffixes {
		for _, sb := range tableObjectSuffixes {
			if ka+sa == kb+sb {
				return strings.TrimPrefix(ka+sa, "public.")
			}
		}
	}
	return ""
}
