package redis

import (
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"fmt"
	"os"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/internal/tlsconf"
)

// Defaults of PublisherConfig and SubscriberConfig. A zero field takes its
// default.
const (
	// DefaultPublishBatchSize is the most entries the Publisher sends in one
	// pipeline.
	DefaultPublishBatchSize = 512
	// DefaultPublishPipelines is how many pipelines the Publisher keeps in
	// flight at once: two, so one fills while Redis (one thread) serves the
	// other. More cost round trips of fewer entries each (BenchmarkPublish,
	// 64 callers: 67-70 % of a raw pipeline loop with 4, 72-73 % with 2).
	DefaultPublishPipelines = 2
	// DefaultMaxEntryBytes is the largest stream entry the Publisher sends:
	// 512 MiB, the default proto-max-bulk-len of Redis (the largest value it
	// accepts).
	DefaultMaxEntryBytes = 512 << 20

	// DefaultBatchSize is the COUNT of each XREADGROUP and XAUTOCLAIM.
	// A backlog is read in fewer round trips with larger batches
	// (docs/benchmarks.md, "One goroutine hands out").
	DefaultBatchSize = 250
	// DefaultBlockTime is how long one XREADGROUP waits for new entries. It
	// also bounds how long Close waits for a blocked read to return.
	DefaultBlockTime = time.Second
	// DefaultMaxInFlight is how many entries a subscription holds at once:
	// handed to handlers, waiting behind their key or waiting for a retry.
	// Twice BatchSize, so that the next read can run while a batch is out.
	DefaultMaxInFlight = 512
	// DefaultClaimIdle is how long an entry must sit unacknowledged in another
	// consumer's pending list before it is reclaimed.
	DefaultClaimIdle = 30 * time.Second
	// DefaultClaimInterval is how often a subscription looks for idle
	// entries to reclaim.
	DefaultClaimInterval = 5 * time.Second
	// DefaultNackDelay is how long a nacked entry waits before it is
	// redelivered when its settlement names no retry time.
	DefaultNackDelay = 100 * time.Millisecond
	// DefaultDeadLetterSuffix is appended to a stream's name to name its
	// dead-letter stream when SubscriberConfig.DeadLetterStream is empty.
	DefaultDeadLetterSuffix = ":dead-letter"
)

// Limits of PublisherConfig's and SubscriberConfig's sizes: Validate refuses
// larger values. They size queues (BatchSize × Pipelines) and reads; beyond
// them a value only exhausts memory.
const (
	// MaxPublishBatchSize bounds PublisherConfig.BatchSize.
	MaxPublishBatchSize = 10_000
	// MaxPublishPipelines bounds PublisherConfig.Pipelines.
	MaxPublishPipelines = 64
	// MaxBatchSize bounds SubscriberConfig.BatchSize (the COUNT of a read).
	MaxBatchSize = 10_000
	// MaxMaxInFlight bounds SubscriberConfig.MaxInFlight.
	MaxMaxInFlight = 100_000
)

// invalid reports an invalid field as a *bus.ConfigError (the one config
// error type of omnibus), Field the struct field's name. It matches
// bus.ErrInvalidConfig.
func invalid(field, format string, args ...any) error {
	return &bus.ConfigError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// connection holds what both configs say about reaching Redis.
type connection struct {
	client        redis.UniversalClient
	addr          string
	username      string
	password      string
	db            int
	tls           *tls.Config
	tlsCAFile     string
	tlsServerName string
}

func (c connection) validate() error {
	if c.client != nil {
		return nil
	}
	if c.addr == "" {
		return invalid("Addr", "empty and no Client given")
	}
	if c.db < 0 {
		return invalid("DB", "negative (%d)", c.db)
	}
	_, err := c.tlsConfig()
	return err
}

// tlsConfig returns the TLS settings of the connection opened from Addr:
// nil when TLS is off. TLSCAFile and TLSServerName turn it on, and apply
// over TLS when both are given.
func (c connection) tlsConfig() (*tls.Config, error) {
	return tlsConfigFrom(c.tls, c.tlsCAFile, c.tlsServerName)
}

// tlsConfigFrom is tlsconf.FromFiles with its error naming TLSCAFile.
func tlsConfigFrom(base *tls.Config, caFile, serverName string) (*tls.Config, error) {
	cfg, err := tlsconf.FromFiles(base, caFile, serverName)
	if err != nil {
		return nil, invalid("TLSCAFile", "%v", err)
	}
	return cfg, nil
}

// open returns the client to use and whether the caller of open owns it
// (and must close it).
func (c connection) open() (redis.UniversalClient, bool, error) {
	if c.client != nil {
		return c.client, false, nil
	}
	tlsCfg, err := c.tlsConfig()
	if err != nil {
		return nil, false, err
	}
	return redis.NewClient(&redis.Options{
		Addr:      c.addr,
		Username:  c.username,
		Password:  c.password,
		DB:        c.db,
		TLSConfig: tlsCfg,
	}), true, nil
}

// PublisherConfig configures a Publisher.
type PublisherConfig struct {
	// Client is a client owned by the caller. When set, the address fields
	// are ignored and the Publisher never closes it.
	Client redis.UniversalClient
	// Addr is the "host:port" of the Redis server, used when Client is nil.
	// The Publisher then opens its own client and closes it on Close.
	Addr string
	// Username and Password authenticate the connection opened from Addr
	// (Redis ACL user; Username empty means the default user).
	Username string
	Password string
	// DB selects the database of the connection opened from Addr.
	DB int
	// TLS, when set, makes the connection opened from Addr use TLS.
	TLS *tls.Config
	// TLSCAFile is a PEM file of the certificate authorities that verify
	// the server (instead of the system roots); setting it turns TLS on.
	TLSCAFile string
	// TLSServerName is the name checked against the server's certificate
	// instead of the host of Addr; setting it turns TLS on.
	TLSServerName string

	// StreamPrefix is prepended to a topic to name its stream.
	StreamPrefix string
	// MaxLen, when positive, trims every stream written to to about MaxLen
	// entries (XADD MAXLEN ~). Off by default. Trimming does not wait for
	// consumers: an entry a slow consumer group has not read yet, or has read
	// and not acknowledged, can be trimmed and is then lost to that group
	// (the Subscriber reports such entries, it cannot recover them). Size it
	// well above the backlog any group may build.
	MaxLen int64
	// Marshaler turns messages into stream fields; DefaultMarshaler when nil.
	Marshaler Marshaler

	// BatchSize is the most entries sent in one pipeline; concurrent Publish
	// calls share pipelines up to this size. Default DefaultPublishBatchSize.
	BatchSize int
	// Pipelines is how many pipelines may be in flight at once. Default
	// DefaultPublishPipelines.
	Pipelines int
	// MaxEntryBytes bounds one stream entry (its field names and values
	// together). Publish refuses a message whose entry is larger with a
	// permanent error, before writing anything: Redis drops the connection
	// on a value over its proto-max-bulk-len, which would fail the whole
	// pipeline as if Redis were down, again on every retry. Set it to at
	// most the server's proto-max-bulk-len. Default DefaultMaxEntryBytes.
	MaxEntryBytes int
	// Shards spreads each topic over this many streams, a message to the
	// shard of its partition key (bus.ShardOf; a message without a key to
	// any shard). It must equal the Subscribers' Shards and the count
	// recorded for the topic on its first use (see the package
	// documentation). Default DefaultShards (1: one stream per topic).
	Shards int
}

func (c *PublisherConfig) setDefaults() {
	if c.Marshaler == nil {
		c.Marshaler = DefaultMarshaler{}
	}
	if c.BatchSize == 0 {
		c.BatchSize = DefaultPublishBatchSize
	}
	if c.Pipelines == 0 {
		c.Pipelines = DefaultPublishPipelines
	}
	if c.MaxEntryBytes == 0 {
		c.MaxEntryBytes = DefaultMaxEntryBytes
	}
	if c.Shards == 0 {
		c.Shards = DefaultShards
	}
}

// validShards checks a Shards field.
func validShards(n int) error {
	if n < 0 || n > bus.MaxShards {
		return invalid("Shards", "%d is not between 1 and %d", n, bus.MaxShards)
	}
	return nil
}

// Validate reports the first invalid field as a *bus.ConfigError.
func (c PublisherConfig) Validate() error {
	if err := c.connection().validate(); err != nil {
		return err
	}
	if c.MaxLen < 0 {
		return invalid("MaxLen", "negative (%d); use 0 for no trimming", c.MaxLen)
	}
	if c.BatchSize < 0 {
		return invalid("BatchSize", "negative (%d)", c.BatchSize)
	}
	if c.BatchSize > MaxPublishBatchSize {
		return invalid("BatchSize", "at most %d, got %d", MaxPublishBatchSize, c.BatchSize)
	}
	if c.Pipelines < 0 {
		return invalid("Pipelines", "negative (%d)", c.Pipelines)
	}
	if c.Pipelines > MaxPublishPipelines {
		return invalid("Pipelines", "at most %d, got %d", MaxPublishPipelines, c.Pipelines)
	}
	if c.MaxEntryBytes < 0 {
		return invalid("MaxEntryBytes", "negative (%d)", c.MaxEntryBytes)
	}
	return validShards(c.Shards)
}

func (c PublisherConfig) connection() connection {
	return connection{
		client: c.Client, addr: c.Addr, username: c.Username, password: c.Password, db: c.DB,
		tls: c.TLS, tlsCAFile: c.TLSCAFile, tlsServerName: c.TLSServerName,
	}
}

// SubscriberConfig configures a Subscriber.
type SubscriberConfig struct {
	// Client is a client owned by the caller. When set, the address fields
	// are ignored and the Subscriber never closes it. Each subscription keeps
	// one connection blocked in XREADGROUP; size the pool for it.
	Client redis.UniversalClient
	// Addr is the "host:port" of the Redis server, used when Client is nil.
	// The Subscriber then opens its own client and closes it on Close.
	Addr string
	// Username and Password authenticate the connection opened from Addr.
	Username string
	Password string
	// DB selects the database of the connection opened from Addr.
	DB int
	// TLS, when set, makes the connection opened from Addr use TLS.
	TLS *tls.Config
	// TLSCAFile is a PEM file of the certificate authorities that verify
	// the server (instead of the system roots); setting it turns TLS on.
	TLSCAFile string
	// TLSServerName is the name checked against the server's certificate
	// instead of the host of Addr; setting it turns TLS on.
	TLSServerName string

	// StreamPrefix is prepended to a topic to name its stream.
	StreamPrefix string
	// ConsumerGroup is the group the Subscriber reads as. Required. The group
	// is created at the start of the stream (and the stream with it) when
	// missing, so a new group reads everything the stream still holds.
	ConsumerGroup string
	// Consumer is this Subscriber's name within the group. Default: the host
	// name and a random suffix, unique per Subscriber. Two live Subscribers
	// must never share a name.
	Consumer string

	// BatchSize is the COUNT of each XREADGROUP and XAUTOCLAIM. Default
	// DefaultBatchSize.
	BatchSize int
	// BlockTime is how long one XREADGROUP waits for new entries. Close waits
	// up to this long for a blocked read. Default DefaultBlockTime.
	BlockTime time.Duration
	// MaxInFlight bounds the entries a subscription holds at once: handed to
	// handlers, waiting behind their key, or waiting for a retry. Reading
	// stops while it is reached. Default DefaultMaxInFlight.
	MaxInFlight int
	// ClaimIdle is how long an entry must sit unacknowledged in a consumer's
	// pending list before another consumer reclaims it (a consumer that died
	// leaves its entries there). Entries a live subscription holds are
	// touched every ClaimIdle/3 so they are never reclaimed from it, however
	// long their handler or retry delay. Must be at least BlockTime, and the
	// same for every consumer of a group. Default DefaultClaimIdle.
	ClaimIdle time.Duration
	// ClaimInterval is how often a subscription runs XAUTOCLAIM. Negative
	// turns reclaiming off. Default DefaultClaimInterval.
	ClaimInterval time.Duration
	// NackDelay is how long a nacked entry waits before it is redelivered
	// when its settlement names no retry time (or it has no settlement).
	// Default DefaultNackDelay.
	NackDelay time.Duration
	// DeadLetterStream receives the entries that are given up on and the
	// entries that cannot be decoded. Default: the stream's name followed by
	// DefaultDeadLetterSuffix. It is never trimmed by the Subscriber.
	DeadLetterStream string
	// OrderByKey, when true, hands out entries that carry the same
	// partition_key one at a time, in the order this subscription received
	// them: the next only after the previous is acked or dead-lettered. A
	// nacked entry holds its key until it is redelivered and settled. The
	// order holds within one subscription only; Redis spreads a group's
	// entries over its consumers without regard to keys, and reclaimed
	// entries come back late. See the package documentation.
	OrderByKey bool
	// Marshaler turns stream fields into messages; DefaultMarshaler when nil.
	Marshaler Marshaler

	// Shards is the number of streams each topic is spread over (see
	// PublisherConfig.Shards; the two must agree). With more than one, the
	// consumers of a group share the shards: each shard is read by one
	// consumer at a time, which holds a lease on it (ShardLease), so the
	// entries of a key are handled in stream order however many consumers
	// run. Default DefaultShards.
	Shards int
	// ShardLease is how long a consumer owns a shard without renewing its
	// lease (it renews every third of it). A consumer that stops renewing
	// (killed, paused, cut off) loses its shards to the others after about
	// this long, and hands out and acknowledges nothing of them once it
	// knows. Used only with Shards > 1. Default DefaultShardLease.
	ShardLease time.Duration
}

func (c *SubscriberConfig) setDefaults() {
	if c.Consumer == "" {
		c.Consumer = defaultConsumerName()
	}
	if c.BatchSize == 0 {
		c.BatchSize = DefaultBatchSize
	}
	if c.BlockTime == 0 {
		c.BlockTime = DefaultBlockTime
	}
	if c.MaxInFlight == 0 {
		c.MaxInFlight = DefaultMaxInFlight
	}
	if c.ClaimIdle == 0 {
		c.ClaimIdle = DefaultClaimIdle
	}
	if c.ClaimInterval == 0 {
		c.ClaimInterval = DefaultClaimInterval
	}
	if c.NackDelay == 0 {
		c.NackDelay = DefaultNackDelay
	}
	if c.Marshaler == nil {
		c.Marshaler = DefaultMarshaler{}
	}
	if c.Shards == 0 {
		c.Shards = DefaultShards
	}
	if c.ShardLease == 0 {
		c.ShardLease = DefaultShardLease
	}
}

// Validate reports the first invalid field as a *bus.ConfigError. It checks the
// fields as given; NewSubscriber fills in defaults before it validates, so a
// zero field is valid there.
func (c SubscriberConfig) Validate() error {
	if err := c.connection().validate(); err != nil {
		return err
	}
	if c.ConsumerGroup == "" {
		return invalid("ConsumerGroup", "empty")
	}
	if c.BatchSize < 0 {
		return invalid("BatchSize", "negative (%d)", c.BatchSize)
	}
	if c.BatchSize > MaxBatchSize {
		return invalid("BatchSize", "at most %d, got %d", MaxBatchSize, c.BatchSize)
	}
	if c.BlockTime < 0 {
		return invalid("BlockTime", "negative (%s)", c.BlockTime)
	}
	if c.MaxInFlight < 0 {
		return invalid("MaxInFlight", "negative (%d)", c.MaxInFlight)
	}
	if c.MaxInFlight > MaxMaxInFlight {
		return invalid("MaxInFlight", "at most %d, got %d", MaxMaxInFlight, c.MaxInFlight)
	}
	if c.ClaimIdle < 0 {
		return invalid("ClaimIdle", "negative (%s)", c.ClaimIdle)
	}
	blockTime := c.BlockTime
	if blockTime == 0 {
		blockTime = DefaultBlockTime
	}
	if c.ClaimIdle != 0 && c.ClaimIdle < blockTime {
		return invalid("ClaimIdle", "%s is shorter than BlockTime (%s)", c.ClaimIdle, blockTime)
	}
	if c.NackDelay < 0 {
		return invalid("NackDelay", "negative (%s)", c.NackDelay)
	}
	if c.ShardLease != 0 && c.ShardLease < MinShardLease {
		return invalid("ShardLease", "%s is shorter than %s", c.ShardLease, MinShardLease)
	}
	return validShards(c.Shards)
}

func (c SubscriberConfig) connection() connection {
	return connection{
		client: c.Client, addr: c.Addr, username: c.Username, password: c.Password, db: c.DB,
		tls: c.TLS, tlsCAFile: c.TLSCAFile, tlsServerName: c.TLSServerName,
	}
}

func (c SubscriberConfig) deadLetterStream(stream string) string {
	if c.DeadLetterStream != "" {
		return c.DeadLetterStream
	}
	return stream + DefaultDeadLetterSuffix
}

func defaultConsumerName() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "consumer"
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	return host + "-" + hex.EncodeToString(b[:])
}
