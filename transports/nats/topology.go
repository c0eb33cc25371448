package nats

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/omnibus-go/omnibus/bus"
)

// The layout of a topic T (subject prefix P, N shards) for a group G:
//
//	stream   name(P+T)                 subjects P+T.*, description records N
//	subject  P+T.<i>                   shard i, i in [0, N)
//	stream   name(P+T)_DEAD_LETTER     subjects P+T.dead-letter.*
//	subject  P+T.dead-letter.G         what G gave up on
//	bucket   Bucket (key-value)
//	  key    name(P+T).G.shard.<i>     shard i's lease: owner and position
//	  key    name(P+T).G.member.<c>    consumer c's membership of G
//
// name(s) is s with '.' replaced by '_' (stream names have no dots).

// base is topic's subject base, after checking that it is one.
func base(prefix, topic string) (string, error) {
	if err := bus.ValidateTopic(topic); err != nil {
		return "", err
	}
	if err := checkSubject(topic); err != nil {
		return "", fmt.Errorf("topic %q cannot be a NATS subject: %w", topic, err)
	}
	return prefix + topic, nil
}

func streamName(base string) string { return strings.ReplaceAll(base, ".", "_") }

func shardSubject(base string, shard int) string { return base + "." + strconv.Itoa(shard) }

func deadLetterSubject(base, group string) string { return base + ".dead-letter." + group }

func deadLetterStream(stream string) string { return stream + "_DEAD_LETTER" }

func shardKey(stream, group string, shard int) string {
	return stream + "." + group + ".shard." + strconv.Itoa(shard)
}

func memberKey(stream, group, consumer string) string {
	return stream + "." + group + ".member." + consumer
}

// descriptionPrefix starts the description of the streams this transport
// creates; the shard count follows it.
const descriptionPrefix = "omnibus topic; shards="

// ErrShardCount is the error of a publisher or subscriber whose shard count
// differs from the one recorded for the topic.
var ErrShardCount = errors.New("shard count differs from the topic's recorded count")

// ShardCountError reports a shard count that differs from the topic's. It
// matches ErrShardCount and bus.ErrInvalidConfig.
type ShardCountError struct {
	Topic      string
	Configured int
	// Recorded is the topic's count.
	Recorded int
	// Stream is the stream that records it.
	Stream string
}

func (e *ShardCountError) Error() string {
	return (&bus.ConfigError{Field: "nats.shards", Reason: fmt.Sprintf(
		"%d, but topic %q was set up with %d shards (%v; stream %s records it). To change it: stop the publishers, let every consumer group drain the topic, delete the stream, then start everything with the new count",
		e.Configured, e.Topic, e.Recorded, ErrShardCount, e.Stream)}).Error()
}

// Is makes a ShardCountError match ErrShardCount and bus.ErrInvalidConfig.
func (e *ShardCountError) Is(target error) bool {
	return target == ErrShardCount || target == bus.ErrInvalidConfig
}

// topology creates a topic's streams once and checks their shard count.
type topology struct {
	cfg ConnectionConfig

	mu    sync.Mutex
	ready map[string]bool // streams created or checked
}

func newTopology(cfg ConnectionConfig) *topology {
	return &topology{cfg: cfg, ready: map[string]bool{}}
}

// stream makes sure the stream of the topic whose subject base is b exists
// with this configuration's shard count, and returns its name.
func (t *topology) stream(ctx context.Context, js jetstream.JetStream, topic, b string) (string, error) {
	name := streamName(b)
	t.mu.Lock()
	ready := t.ready[name]
	t.mu.Unlock()
	if ready {
		return name, nil
	}
	ctx, cancel := context.WithTimeout(ctx, t.cfg.Timeout)
	defer cancel()
	cfg := jetstream.StreamConfig{
		Name:        name,
		Description: descriptionPrefix + strconv.Itoa(t.cfg.Shards),
		Subjects:    []string{b + ".*"},
		Retention:   jetstream.LimitsPolicy,
		Storage:     jetstream.FileStorage,
		Duplicates:  t.cfg.DuplicateWindow,
		MaxAge:      t.cfg.MaxAge,
	}
	s, err := js.CreateStream(ctx, cfg)
	if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		s, err = js.Stream(ctx, name)
	}
	if err != nil {
		return "", classify(fmt.Errorf("create stream %s for topic %q: %w", name, topic, err))
	}
	info := s.CachedInfo()
	if len(info.Config.Subjects) != 1 || info.Config.Subjects[0] != cfg.Subjects[0] {
		return "", fmt.Errorf("stream %s, which topic %q would use, exists with subjects %v, not [%s]: another topic's name maps to the same stream (stream names replace '.' by '_'); rename one of them",
			name, topic, info.Config.Subjects, cfg.Subjects[0])
	}
	recorded, ok := strings.CutPrefix(info.Config.Description, descriptionPrefix)
	n, err := strconv.Atoi(recorded)
	if !ok || err != nil {
		return "", fmt.Errorf("stream %s, which topic %q would use, was not created by omnibus (its description %q records no shard count)", name, topic, info.Config.Description)
	}
	if n != t.cfg.Shards {
		return "", &ShardCountError{Topic: topic, Configured: t.cfg.Shards, Recorded: n, Stream: name}
	}
	// The dead-letter stream: what the topic's groups gave up on.
	_, err = js.CreateStream(ctx, jetstream.StreamConfig{
		Name:        deadLetterStream(name),
		Description: "omnibus dead letters of topic " + topic,
		Subjects:    []string{b + ".dead-letter.*"},
		Storage:     jetstream.FileStorage,
		Duplicates:  t.cfg.DuplicateWindow,
	})
	if err != nil && !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		return "", classify(fmt.Errorf("create stream %s for topic %q: %w", deadLetterStream(name), topic, err))
	}
	t.mu.Lock()
	t.ready[name] = true
	t.mu.Unlock()
	return name, nil
}

// forget makes the next use of stream check it again (it was deleted under
// us).
func (t *topology) forget(stream string) {
	t.mu.Lock()
	delete(t.ready, stream)
	t.mu.Unlock()
}

// bucket opens (creating it when missing) the lease bucket.
func bucket(ctx context.Context, js jetstream.JetStream, cfg ConnectionConfig) (jetstream.KeyValue, error) {
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	kv, err := js.KeyValue(ctx, cfg.Bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		kv, err = js.CreateKeyValue(ctx, jetstream.KeyValueConfig{
			Bucket:      cfg.Bucket,
			Description: "omnibus shard leases and consumer group positions",
			History:     1,
			Storage:     jetstream.FileStorage,
		})
		if errors.Is(err, jetstream.ErrBucketExists) {
			kv, err = js.KeyValue(ctx, cfg.Bucket)
		}
	}
	if err != nil {
		return nil, classify(fmt.Errorf("open key-value bucket %s: %w", cfg.Bucket, err))
	}
	return kv, nil
}

// DeleteTopic deletes topic's stream and dead-letter stream, and the shard
// leases and memberships of groups: what it held is gone. For tests,
// examples and a drained topic whose shard count is to change.
func DeleteTopic(ctx context.Context, cfg ConnectionConfig, topic string, groups ...string) error {
	cfg.setDefaults()
	b, err := base(cfg.SubjectPrefix, topic)
	if err != nil {
		return err
	}
	nc, err := dial(cfg, "omnibus delete-topic")
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc, jetstream.WithDefaultTimeout(cfg.Timeout))
	if err != nil {
		return err
	}
	stream := streamName(b)
	var errs []error
	for _, s := range []string{stream, deadLetterStream(stream)} {
		if err := js.DeleteStream(ctx, s); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			errs = append(errs, fmt.Errorf("delete stream %s: %w", s, err))
		}
	}
	kv, err := js.KeyValue(ctx, cfg.Bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return errors.Join(errs...)
	}
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	for _, g := range groups {
		keys, err := kv.ListKeysFiltered(ctx, stream+"."+g+".>")
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for k := range keys.Keys() {
			if err := kv.Purge(ctx, k); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}
