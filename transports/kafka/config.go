package kafka

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/IBM/sarama"
	"github.com/xdg-go/scram"

	"github.com/omnibus-go/omnibus/bus"
)

// Connection defaults (ConnectionConfig), shared by PublisherConfig and
// SubscriberConfig.
const (
	// DefaultClientID is the client id sent to the brokers.
	DefaultClientID = "omnibus"
	// DefaultKafkaVersion is the broker protocol version assumed when none is
	// given. Brokers of this version or newer are supported.
	DefaultKafkaVersion = "2.8.0"
	// DefaultDialTimeout bounds connecting to one broker.
	DefaultDialTimeout = 10 * time.Second
)

// Publisher defaults.
const (
	// DefaultLinger is how long the producer waits for more records before it
	// sends a batch: none. A batch goes out as soon as the broker connection
	// is free, and the records that arrive while a request is in flight form
	// the next one, so batches grow with the load without adding latency when
	// it is light. (Measured here with 64 concurrent publishers, a 1 ms linger
	// cost a third of the throughput.)
	DefaultLinger time.Duration = 0
	// DefaultBatchBytes is the batch size that triggers a send before the
	// linger time runs out.
	DefaultBatchBytes = 1 << 20
	// DefaultCompression is the record batch compression codec.
	DefaultCompression = "none"
	// DefaultMaxMessageBytes is the largest record the publisher accepts.
	DefaultMaxMessageBytes = 1_000_000
	// DefaultProduceTimeout is how long a broker waits for its replicas to
	// acknowledge a batch.
	DefaultProduceTimeout = 10 * time.Second
	// DefaultRetries is how many times a failed batch is retried before the
	// Publish waiting for it fails.
	DefaultRetries = 3
	// DefaultRetryBackoff is the pause between two tries of a batch.
	DefaultRetryBackoff = 100 * time.Millisecond
)

// Subscriber defaults.
const (
	// DefaultInitialOffset is where a group without a committed offset starts.
	DefaultInitialOffset = OffsetOldest
	// DefaultSessionTimeout is how long the group coordinator waits for a
	// heartbeat before it evicts a member.
	DefaultSessionTimeout = 10 * time.Second
	// DefaultHeartbeatInterval is how often a member heartbeats; a rebalance is
	// noticed within one interval.
	DefaultHeartbeatInterval = 3 * time.Second
	// DefaultRebalanceTimeout is how long the coordinator waits for members to
	// rejoin during a rebalance.
	DefaultRebalanceTimeout = 60 * time.Second
	// DefaultBalanceStrategy assigns partitions incrementally: a rebalance
	// revokes only the partitions that move, so work on the others goes on.
	DefaultBalanceStrategy = "cooperative-sticky"
	// DefaultMaxInFlight is how many records of one partition may be handled
	// at once.
	DefaultMaxInFlight = 64
	// DefaultMaxReadAheadBytes is how much of a partition's records may be
	// read ahead of their handling: a few fetch responses' worth.
	DefaultMaxReadAheadBytes = 4 << 20
	// DefaultNackDelay is the pause before a nacked record is delivered again
	// when its settlement names no retry time.
	DefaultNackDelay = 100 * time.Millisecond
	// DefaultCommitInterval is how often acked offsets are committed.
	DefaultCommitInterval = time.Second
	// DefaultFetchMaxWait is how long a broker may hold a fetch that found no
	// new records. Kafka's own default is 500 ms; a partition paused for
	// read-ahead resumes only with the next fetch, so a shorter wait lets a
	// backlogged partition catch up next to idle ones.
	DefaultFetchMaxWait = 100 * time.Millisecond
	// DefaultDeadLetterTopic is the dead-letter topic; "{topic}" stands for the
	// topic the record came from.
	DefaultDeadLetterTopic = "{topic}.dlq"
	// NoDeadLetters, as SubscriberConfig.DeadLetterTopic, turns dead letters
	// off: a record that is given up on is logged and skipped.
	NoDeadLetters = "-"
)

// Acks is how many replicas must have stored a record before the broker
// acknowledges it.
type Acks string

// The acknowledgement levels.
const (
	// AcksAll waits for every in-sync replica. Required by idempotence.
	AcksAll Acks = "all"
	// AcksLeader waits for the partition leader only.
	AcksLeader Acks = "leader"
	// AcksNone does not wait at all; Publish returns once the batch is sent.
	AcksNone Acks = "none"
)

// InitialOffset is where a consumer group without a committed offset starts
// reading a partition.
type InitialOffset string

// The initial offsets.
const (
	// OffsetOldest starts at the oldest retained record.
	OffsetOldest InitialOffset = "oldest"
	// OffsetNewest starts after the last record, reading only new ones.
	OffsetNewest InitialOffset = "newest"
)

var initialOffsets = []InitialOffset{OffsetOldest, OffsetNewest}

// The SASL mechanisms.
const (
	SASLPlain       = "PLAIN"
	SASLScramSHA256 = "SCRAM-SHA-256"
	SASLScramSHA512 = "SCRAM-SHA-512"
)

// SASLMechanisms are the SASL mechanisms supported, for SASLConfig.Mechanism.
var SASLMechanisms = []string{SASLPlain, SASLScramSHA256, SASLScramSHA512}

// MinFetchMaxWait is the shortest FetchMaxWait: brokers wait in whole
// milliseconds.
const MinFetchMaxWait = time.Millisecond

// configErr reports an invalid field as a *bus.ConfigError (the one config
// error type of omnibus), Field the struct field's name (dotted for nested
// ones). It matches bus.ErrInvalidConfig.
func configErr(field, format string, args ...any) error {
	return &bus.ConfigError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// TLSConfig secures the connections to the brokers.
type TLSConfig struct {
	// Enable turns TLS on. Setting any other field turns it on too.
	Enable bool `yaml:"enable"`
	// CAFile is a PEM file of the certificate authorities that verify the
	// brokers. Empty means the system roots.
	CAFile string `yaml:"ca_file"`
	// CertFile and KeyFile are the PEM client certificate and key for mutual
	// TLS. Set both or neither.
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
	// ServerName is checked against the brokers' certificates instead of the
	// host name dialled.
	ServerName string `yaml:"server_name"`
	// InsecureSkipVerify accepts any broker certificate. Off by default; it
	// defeats TLS and belongs in tests only.
	InsecureSkipVerify bool `yaml:"insecure_skip_verify"`
}

func (c TLSConfig) enabled() bool {
	return c.Enable || c.CAFile != "" || c.CertFile != "" || c.KeyFile != "" || c.ServerName != "" || c.InsecureSkipVerify
}

// build returns the tls.Config, or nil when TLS is off. It reads the files,
// so an unreadable or empty file is reported here, naming the field.
func (c TLSConfig) build() (*tls.Config, error) {
	if !c.enabled() {
		return nil, nil
	}
	tc := &tls.Config{
		MinVersion:         tls.VersionTLS12,
		ServerName:         c.ServerName,
		InsecureSkipVerify: c.InsecureSkipVerify, //nolint:gosec // off by default, documented
	}
	if c.CAFile != "" {
		pem, err := os.ReadFile(c.CAFile)
		if err != nil {
			return nil, configErr("TLS.CAFile", "%v", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, configErr("TLS.CAFile", "no PEM certificate in %q", c.CAFile)
		}
		tc.RootCAs = pool
	}
	if missing := c.missingPairFile(); missing != "" {
		return nil, configErr("TLS."+missing, "required with TLS.%s", map[string]string{"KeyFile": "CertFile", "CertFile": "KeyFile"}[missing])
	}
	if c.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
		if err != nil {
			return nil, configErr("TLS.CertFile", "load key pair (%q, %q): %v", c.CertFile, c.KeyFile, err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}

// missingPairFile names the half of the client key pair that is missing
// ("CertFile" or "KeyFile"), or "" when both or neither are set.
func (c TLSConfig) missingPairFile() string {
	switch {
	case c.CertFile != "" && c.KeyFile == "":
		return "KeyFile"
	case c.KeyFile != "" && c.CertFile == "":
		return "CertFile"
	}
	return ""
}

// SASLConfig authenticates the connections to the brokers.
type SASLConfig struct {
	// Mechanism is SASLPlain, SASLScramSHA256 or SASLScramSHA512; empty
	// means no SASL. PLAIN sends the password as is: use it with TLS. SCRAM
	// refuses a server whose iteration count is outside
	// MinSCRAMIterations..MaxSCRAMIterations.
	Mechanism string `yaml:"mechanism"`
	// User and Password are the credentials. The password is used as given
	// (no SASLprep normalisation).
	User     string `yaml:"user"`
	Password string `yaml:"password" secret:"true"`
}

func (c SASLConfig) validate() error {
	switch c.Mechanism {
	case "":
		if c.User != "" || c.Password != "" {
			return configErr("SASL.Mechanism", "required when SASL.User or SASL.Password is set")
		}
		return nil
	default:
		if slices.Contains(SASLMechanisms, c.Mechanism) {
			break
		}
		return configErr("SASL.Mechanism", "unsupported %q (want %s, %s or %s)",
			c.Mechanism, SASLPlain, SASLScramSHA256, SASLScramSHA512)
	}
	if c.User == "" {
		return configErr("SASL.User", "required with mechanism %s", c.Mechanism)
	}
	return nil
}

func (c SASLConfig) apply(sc *sarama.Config) {
	if c.Mechanism == "" {
		return
	}
	sc.Net.SASL.Enable = true
	sc.Net.SASL.Handshake = true
	sc.Net.SASL.User = c.User
	sc.Net.SASL.Password = c.Password
	switch c.Mechanism {
	case SASLPlain:
		sc.Net.SASL.Mechanism = sarama.SASLTypePlaintext
	case SASLScramSHA256:
		sc.Net.SASL.Mechanism = sarama.SASLTypeSCRAMSHA256
		sc.Net.SASL.SCRAMClientGeneratorFunc = func() sarama.SCRAMClient { return newSCRAMClient(scram.SHA256) }
	case SASLScramSHA512:
		sc.Net.SASL.Mechanism = sarama.SASLTypeSCRAMSHA512
		sc.Net.SASL.SCRAMClientGeneratorFunc = func() sarama.SCRAMClient { return newSCRAMClient(scram.SHA512) }
	}
}

// ConnectionConfig is how a client reaches the brokers. PublisherConfig and
// SubscriberConfig embed it, so its fields read as theirs (cfg.Brokers), and
// one value can serve both. It is ignored when the config sets a Client: the
// caller's client brings its own connection. Client and Tune stay in each
// config, since what a caller's client must be set up for, and the sarama
// settings Tune sees, differ between the two.
type ConnectionConfig struct {
	// Brokers are the bootstrap brokers as host:port. Required unless the
	// config sets a Client.
	Brokers []string `yaml:"brokers"`
	// ClientID names this client to the brokers. Default DefaultClientID.
	ClientID string `yaml:"client_id"`
	// KafkaVersion is the oldest broker version to speak to, as
	// "major.minor.patch", at least 0.11.0 (record headers). Default
	// DefaultKafkaVersion.
	KafkaVersion string `yaml:"version"`
	// TLS secures the connections. Off by default.
	TLS TLSConfig `yaml:"tls"`
	// SASL authenticates the connections. Off by default.
	SASL SASLConfig `yaml:"sasl"`
	// DialTimeout bounds connecting to one broker. Default DefaultDialTimeout.
	DialTimeout time.Duration `yaml:"-"`
}

func (c *ConnectionConfig) setDefaults() {
	if c.ClientID == "" {
		c.ClientID = DefaultClientID
	}
	if c.KafkaVersion == "" {
		c.KafkaVersion = DefaultKafkaVersion
	}
	if c.DialTimeout == 0 {
		c.DialTimeout = DefaultDialTimeout
	}
}

// validate checks the connection fields, or, when client is set, the
// client's protocol version instead.
func (c ConnectionConfig) validate(client sarama.Client) error {
	if client != nil {
		// The caller's client brings its own connection settings.
		if v := client.Config().Version; !v.IsAtLeast(sarama.V0_11_0_0) {
			return configErr("Client", "its config's Version %s is older than 0.11.0, which cannot carry record headers (the message UUID and metadata travel in them)", v)
		}
		return nil
	}
	if len(c.Brokers) == 0 {
		return configErr("Brokers", "empty (give at least one host:port, or a Client)")
	}
	for i, b := range c.Brokers {
		if strings.TrimSpace(b) == "" {
			return configErr("Brokers", "entry %d is empty", i)
		}
	}
	v, err := sarama.ParseKafkaVersion(c.KafkaVersion)
	if err != nil {
		return configErr("KafkaVersion", "%v", err)
	}
	if !v.IsAtLeast(sarama.V0_11_0_0) {
		return configErr("KafkaVersion", "%s is older than 0.11.0, which cannot carry record headers (the message UUID and metadata travel in them)", c.KafkaVersion)
	}
	if c.DialTimeout < 0 {
		return configErr("DialTimeout", "negative (%s)", c.DialTimeout)
	}
	if err := c.SASL.validate(); err != nil {
		return err
	}
	if _, err := c.TLS.build(); err != nil {
		return err
	}
	return nil
}

// sarama returns a sarama config with the connection settings applied. It
// assumes validate passed.
func (c ConnectionConfig) sarama() (*sarama.Config, error) {
	sc := sarama.NewConfig()
	sc.ClientID = c.ClientID
	v, err := sarama.ParseKafkaVersion(c.KafkaVersion)
	if err != nil {
		return nil, configErr("KafkaVersion", "%v", err)
	}
	sc.Version = v
	sc.Net.DialTimeout = c.DialTimeout
	tc, err := c.TLS.build()
	if err != nil {
		return nil, err
	}
	if tc != nil {
		sc.Net.TLS.Enable = true
		sc.Net.TLS.Config = tc
	}
	c.SASL.apply(sc)
	return sc, nil
}

// PublisherConfig configures a Publisher.
type PublisherConfig struct {
	// ConnectionConfig is how the Publisher reaches the brokers (Brokers,
	// ClientID, KafkaVersion, TLS, SASL, DialTimeout).
	ConnectionConfig
	// Client, when set, is used instead of a client built from this config:
	// the connection and producer settings are then those of its own config,
	// which must have Producer.Return.Successes and Producer.Return.Errors
	// set. The caller owns it; Close never closes it.
	Client sarama.Client
	// Tune, when set, is called last with the sarama config built from this
	// one, for settings it does not name. Ignored when Client is set.
	Tune func(*sarama.Config)

	// Marshaler turns messages into records. Default DefaultMarshaler.
	Marshaler Marshaler
	// Acks is how many replicas must have a record before Publish returns.
	// Default AcksAll; idempotence requires it.
	Acks Acks
	// DisableIdempotence turns the idempotent producer off. It is on by
	// default, so that retried batches are neither duplicated nor reordered.
	DisableIdempotence bool
	// Linger is how long the producer waits for more records before it sends
	// a batch. Default DefaultLinger (0: send as soon as the connection to
	// the broker is free).
	Linger time.Duration
	// BatchBytes sends a lingering batch as soon as it holds this many bytes.
	// Used only with a Linger. Default DefaultBatchBytes.
	BatchBytes int
	// Compression is the batch codec: "none", "gzip", "snappy", "lz4" or
	// "zstd". Default DefaultCompression.
	Compression string
	// MaxMessageBytes is the largest record accepted; a bigger one fails its
	// Publish with a permanent error. Default DefaultMaxMessageBytes.
	MaxMessageBytes int
	// ProduceTimeout is how long a broker waits for its replicas before it
	// fails a batch. Default DefaultProduceTimeout.
	ProduceTimeout time.Duration
	// Retries is how many times a batch that failed with a retriable error
	// (no leader, not enough replicas, timeout, lost connection) is retried
	// before Publish returns the error. Default DefaultRetries.
	Retries int
	// RetryBackoff is the pause between two tries. Default DefaultRetryBackoff.
	RetryBackoff time.Duration
}

func (c *PublisherConfig) setDefaults() {
	c.ConnectionConfig.setDefaults()
	if c.Marshaler == nil {
		c.Marshaler = DefaultMarshaler{}
	}
	if c.Acks == "" {
		c.Acks = AcksAll
	}
	if c.BatchBytes == 0 {
		c.BatchBytes = DefaultBatchBytes
	}
	if c.Compression == "" {
		c.Compression = DefaultCompression
	}
	if c.MaxMessageBytes == 0 {
		c.MaxMessageBytes = DefaultMaxMessageBytes
	}
	if c.ProduceTimeout == 0 {
		c.ProduceTimeout = DefaultProduceTimeout
	}
	if c.Retries == 0 {
		c.Retries = DefaultRetries
	}
	if c.RetryBackoff == 0 {
		c.RetryBackoff = DefaultRetryBackoff
	}
}

// Validate reports the first invalid field, as a *bus.ConfigError. Zero fields
// are valid: they mean the default.
func (c PublisherConfig) Validate() error {
	c.setDefaults()
	if err := c.ConnectionConfig.validate(c.Client); err != nil {
		return err
	}
	if c.Client != nil {
		return validateProducerClient(c.Client)
	}
	switch c.Acks {
	case AcksAll, AcksLeader, AcksNone:
	default:
		return configErr("Acks", "unsupported %q (want %q, %q or %q)", c.Acks, AcksAll, AcksLeader, AcksNone)
	}
	if !c.DisableIdempotence && c.Acks != AcksAll {
		return configErr("Acks", "idempotence requires %q (or set DisableIdempotence)", AcksAll)
	}
	if c.Linger < 0 {
		return configErr("Linger", "negative (%s)", c.Linger)
	}
	if c.BatchBytes < 0 {
		return configErr("BatchBytes", "negative (%d)", c.BatchBytes)
	}
	if _, err := compressionCodec(c.Compression); err != nil {
		return err
	}
	if c.MaxMessageBytes < 0 {
		return configErr("MaxMessageBytes", "negative (%d)", c.MaxMessageBytes)
	}
	if c.ProduceTimeout < 0 {
		return configErr("ProduceTimeout", "negative (%s)", c.ProduceTimeout)
	}
	if c.Retries < 0 {
		return configErr("Retries", "negative (%d)", c.Retries)
	}
	if c.RetryBackoff < 0 {
		return configErr("RetryBackoff", "negative (%s)", c.RetryBackoff)
	}
	return nil
}

func validateProducerClient(client sarama.Client) error {
	pc := client.Config().Producer
	if !pc.Return.Successes || !pc.Return.Errors {
		return configErr("Client", "its config must set Producer.Return.Successes and Producer.Return.Errors")
	}
	return nil
}

func compressionCodec(name string) (sarama.CompressionCodec, error) {
	switch strings.ToLower(name) {
	case "none":
		return sarama.CompressionNone, nil
	case "gzip":
		return sarama.CompressionGZIP, nil
	case "snappy":
		return sarama.CompressionSnappy, nil
	case "lz4":
		return sarama.CompressionLZ4, nil
	case "zstd":
		return sarama.CompressionZSTD, nil
	}
	return 0, configErr("Compression", "unsupported %q (want none, gzip, snappy, lz4 or zstd)", name)
}

// saramaConfig builds the producer's sarama config. It assumes setDefaults
// and Validate ran.
func (c *PublisherConfig) saramaConfig() (*sarama.Config, error) {
	sc, err := c.ConnectionConfig.sarama()
	if err != nil {
		return nil, err
	}
	p := &sc.Producer
	p.Return.Successes = true
	p.Return.Errors = true
	switch c.Acks {
	case AcksAll:
		p.RequiredAcks = sarama.WaitForAll
	case AcksLeader:
		p.RequiredAcks = sarama.WaitForLocal
	case AcksNone:
		p.RequiredAcks = sarama.NoResponse
	}
	if !c.DisableIdempotence {
		p.Idempotent = true
		// The idempotent producer keeps order across retries with one
		// request in flight per broker connection (sarama's requirement).
		sc.Net.MaxOpenRequests = 1
	}
	if c.Linger > 0 {
		p.Flush.Frequency = c.Linger
		p.Flush.Bytes = c.BatchBytes
	}
	p.Flush.MaxMessages = 0
	p.Compression, _ = compressionCodec(c.Compression)
	p.MaxMessageBytes = c.MaxMessageBytes
	p.Timeout = c.ProduceTimeout
	p.Retry.Max = c.Retries
	p.Retry.Backoff = c.RetryBackoff
	p.Partitioner = sarama.NewHashPartitioner
	if c.Tune != nil {
		c.Tune(sc)
	}
	if err := sc.Validate(); err != nil {
		return nil, configErr("Tune", "the resulting sarama config is invalid: %v", err)
	}
	return sc, nil
}

// SubscriberConfig configures a Subscriber.
type SubscriberConfig struct {
	// ConnectionConfig is how the Subscriber (and its dead-letter
	// publisher) reaches the brokers (Brokers, ClientID, KafkaVersion, TLS,
	// SASL, DialTimeout).
	ConnectionConfig
	// Client, when set, is used instead of a client built from this config:
	// the connection, group and offset settings are then those of its own
	// config, which must keep Consumer.Offsets.AutoCommit enabled. A sarama
	// client serves one consumer group at a time, so a Subscriber with a
	// Client allows one subscription at a time. The caller owns it; Close
	// never closes it. Dead letters are produced through it too, so its
	// config must also set Producer.Return.Successes and Producer.Return.Errors
	// unless dead letters are off.
	Client sarama.Client
	// Tune, when set, is called last with the sarama config built from this
	// one, for settings it does not name. Ignored when Client is set.
	Tune func(*sarama.Config)

	// ConsumerGroup is the Kafka consumer group. Required.
	ConsumerGroup string
	// InitialOffset is where the group starts on a partition it has no
	// committed offset for. Default DefaultInitialOffset (oldest).
	InitialOffset InitialOffset
	// SessionTimeout is how long the coordinator waits for a heartbeat before
	// it evicts this member. Default DefaultSessionTimeout.
	SessionTimeout time.Duration
	// HeartbeatInterval is how often this member heartbeats; it notices a
	// rebalance within one interval. Default DefaultHeartbeatInterval.
	HeartbeatInterval time.Duration
	// RebalanceTimeout is how long the coordinator waits for members to rejoin
	// during a rebalance. Default DefaultRebalanceTimeout.
	RebalanceTimeout time.Duration
	// BalanceStrategy assigns partitions to members: "cooperative-sticky"
	// (default), "sticky", "range" or "roundrobin". With cooperative-sticky a
	// rebalance stops only the partitions that move; with the others it
	// stops every partition of the member.
	BalanceStrategy string
	// MaxInFlight is how many records of one partition may be handled at
	// once: records with different keys run concurrently, records of one key
	// one after another. 1 delivers a partition strictly in offset order.
	// Default DefaultMaxInFlight.
	MaxInFlight int
	// MaxReadAheadBytes bounds the memory of one partition's records read
	// and not yet done (keys, values and headers, plus a few hundred bytes a
	// record): fetching from the partition pauses above it and resumes at
	// half. At least four times MaxInFlight records are read ahead whatever
	// their size. Default DefaultMaxReadAheadBytes.
	MaxReadAheadBytes int
	// NackDelay is the pause before a nacked record is delivered again when
	// its settlement names no retry time (or it has none). Default
	// DefaultNackDelay.
	NackDelay time.Duration
	// MaxAttempts is reported to handlers in bus.Delivery.MaxAttempts. 0 (the
	// default) leaves the Retry middleware's own budget in force. The
	// subscriber itself never gives up on a record: only a settlement with
	// GiveUp sends it to the dead-letter topic.
	MaxAttempts int
	// CommitInterval is how often acked offsets are committed. Default
	// DefaultCommitInterval.
	CommitInterval time.Duration
	// FetchMaxWait is how long a broker may hold a fetch request that finds
	// no new records (sarama's Consumer.MaxWaitTime). Lower resumes paused
	// partitions sooner at the cost of more fetch requests while idle.
	// Default DefaultFetchMaxWait.
	FetchMaxWait time.Duration
	// DeadLetterTopic is where records go that are given up on (a settlement
	// with GiveUp) or cannot be decoded; "{topic}" in it stands for the
	// source topic. Default DefaultDeadLetterTopic. The topic must exist or
	// the brokers must create topics on first use: a dead letter is retried
	// until it is acknowledged, and the records behind it in its partition
	// are not committed meanwhile. NoDeadLetters ("-") turns dead letters
	// off: such records are logged and skipped.
	DeadLetterTopic string
	// Marshaler turns records into messages. Default DefaultMarshaler.
	Marshaler Marshaler
}

func (c *SubscriberConfig) setDefaults() {
	c.ConnectionConfig.setDefaults()
	if c.InitialOffset == "" {
		c.InitialOffset = DefaultInitialOffset
	}
	if c.SessionTimeout == 0 {
		c.SessionTimeout = DefaultSessionTimeout
	}
	if c.HeartbeatInterval == 0 {
		c.HeartbeatInterval = DefaultHeartbeatInterval
	}
	if c.RebalanceTimeout == 0 {
		c.RebalanceTimeout = DefaultRebalanceTimeout
	}
	if c.BalanceStrategy == "" {
		c.BalanceStrategy = DefaultBalanceStrategy
	}
	if c.MaxInFlight == 0 {
		c.MaxInFlight = DefaultMaxInFlight
	}
	if c.MaxReadAheadBytes == 0 {
		c.MaxReadAheadBytes = DefaultMaxReadAheadBytes
	}
	if c.NackDelay == 0 {
		c.NackDelay = DefaultNackDelay
	}
	if c.CommitInterval == 0 {
		c.CommitInterval = DefaultCommitInterval
	}
	if c.FetchMaxWait == 0 {
		c.FetchMaxWait = DefaultFetchMaxWait
	}
	if c.DeadLetterTopic == "" {
		c.DeadLetterTopic = DefaultDeadLetterTopic
	}
	if c.Marshaler == nil {
		c.Marshaler = DefaultMarshaler{}
	}
}

// Validate reports the first invalid field, as a *bus.ConfigError. Zero fields
// are valid: they mean the default.
func (c SubscriberConfig) Validate() error {
	c.setDefaults()
	if err := c.ConnectionConfig.validate(c.Client); err != nil {
		return err
	}
	if strings.TrimSpace(c.ConsumerGroup) == "" {
		return configErr("ConsumerGroup", "empty")
	}
	if c.MaxInFlight < 0 {
		return configErr("MaxInFlight", "negative (%d)", c.MaxInFlight)
	}
	if c.MaxReadAheadBytes < 0 {
		return configErr("MaxReadAheadBytes", "negative (%d)", c.MaxReadAheadBytes)
	}
	if c.NackDelay < 0 {
		return configErr("NackDelay", "negative (%s)", c.NackDelay)
	}
	if c.MaxAttempts < 0 {
		return configErr("MaxAttempts", "negative (%d)", c.MaxAttempts)
	}
	if c.CommitInterval < 0 {
		return configErr("CommitInterval", "negative (%s)", c.CommitInterval)
	}
	if c.FetchMaxWait < MinFetchMaxWait {
		return configErr("FetchMaxWait", "below 1ms (%s): brokers wait in whole milliseconds", c.FetchMaxWait)
	}
	if c.DeadLetterTopic != NoDeadLetters && strings.TrimSpace(c.DeadLetterTopic) == "" {
		return configErr("DeadLetterTopic", "blank")
	}
	if c.Client != nil {
		if !c.Client.Config().Consumer.Offsets.AutoCommit.Enable {
			return configErr("Client", "its config must keep Consumer.Offsets.AutoCommit enabled")
		}
		if c.DeadLetterTopic != NoDeadLetters {
			return validateProducerClient(c.Client)
		}
		return nil
	}
	if !slices.Contains(initialOffsets, c.InitialOffset) {
		return configErr("InitialOffset", "unsupported %q (want %q or %q)", c.InitialOffset, OffsetOldest, OffsetNewest)
	}
	if c.SessionTimeout < 0 {
		return configErr("SessionTimeout", "negative (%s)", c.SessionTimeout)
	}
	if c.HeartbeatInterval < 0 {
		return configErr("HeartbeatInterval", "negative (%s)", c.HeartbeatInterval)
	}
	if c.HeartbeatInterval >= c.SessionTimeout {
		return configErr("HeartbeatInterval", "%s is not below SessionTimeout %s", c.HeartbeatInterval, c.SessionTimeout)
	}
	if c.RebalanceTimeout < 0 {
		return configErr("RebalanceTimeout", "negative (%s)", c.RebalanceTimeout)
	}
	if _, err := balanceStrategy(c.BalanceStrategy); err != nil {
		return err
	}
	return nil
}

func balanceStrategy(name string) (sarama.BalanceStrategy, error) {
	switch name {
	case "cooperative-sticky":
		return sarama.NewBalanceStrategyCooperativeSticky(), nil
	case "sticky":
		return sarama.NewBalanceStrategySticky(), nil
	case "range":
		return sarama.NewBalanceStrategyRange(), nil
	case "roundrobin":
		return sarama.NewBalanceStrategyRoundRobin(), nil
	}
	return nil, configErr("BalanceStrategy", "unsupported %q (want cooperative-sticky, sticky, range or roundrobin)", name)
}

// saramaConfig builds the consumer's sarama config. It assumes setDefaults
// and Validate ran.
func (c *SubscriberConfig) saramaConfig() (*sarama.Config, error) {
	sc, err := c.ConnectionConfig.sarama()
	if err != nil {
		return nil, err
	}
	g := &sc.Consumer.Group
	g.Session.Timeout = c.SessionTimeout
	g.Heartbeat.Interval = c.HeartbeatInterval
	g.Rebalance.Timeout = c.RebalanceTimeout
	bs, err := balanceStrategy(c.BalanceStrategy)
	if err != nil {
		return nil, err
	}
	g.Rebalance.GroupStrategies = []sarama.BalanceStrategy{bs}
	if c.InitialOffset == OffsetNewest {
		sc.Consumer.Offsets.Initial = sarama.OffsetNewest
	} else {
		sc.Consumer.Offsets.Initial = sarama.OffsetOldest
	}
	sc.Consumer.Offsets.AutoCommit.Enable = true
	sc.Consumer.Offsets.AutoCommit.Interval = c.CommitInterval
	sc.Consumer.MaxWaitTime = c.FetchMaxWait
	sc.Consumer.Return.Errors = true
	if c.Tune != nil {
		c.Tune(sc)
	}
	if err := sc.Validate(); err != nil {
		return nil, configErr("Tune", "the resulting sarama config is invalid: %v", err)
	}
	return sc, nil
}
