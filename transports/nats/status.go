package nats

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/omnibus-go/omnibus/bus"
)

// ShardStatus reports each shard of topic for group: the lease's owner
// ("" when given back or never taken), how many messages of the shard lie
// after the group's recorded position (Lag, counted by JetStream), and how
// many times the lease was taken. Pending is -1: what a consumer holds
// unsettled lives in its memory, not in JetStream.
func ShardStatus(ctx context.Context, js jetstream.JetStream, cfg ConnectionConfig, topic, group string) ([]bus.ShardStatus, error) {
	cfg.setDefaults()
	b, err := base(cfg.SubjectPrefix, topic)
	if err != nil {
		return nil, err
	}
	if err := checkToken(group); err != nil {
		return nil, fmt.Errorf("consumer group: %w", err)
	}
	stream := streamName(b)
	kv, err := js.KeyValue(ctx, cfg.Bucket)
	if err != nil && !errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, classify(err)
	}
	out := make([]bus.ShardStatus, cfg.Shards)
	for i := range cfg.Shards {
		st := bus.ShardStatus{Shard: i, Stream: shardSubject(b, i), Pending: -1, Lag: -1}
		var rec record
		if kv != nil {
			e, err := kv.Get(ctx, shardKey(stream, group, i))
			switch {
			case errors.Is(err, jetstream.ErrKeyNotFound):
			case err != nil:
				return nil, classify(err)
			default:
				if rec, err = parseRecord(e.Value()); err != nil {
					return nil, fmt.Errorf("shard %d: lease record: %w", i, err)
				}
			}
		}
		st.Owner, st.Leases = rec.Owner, rec.Leases
		if lag, err := lagAfter(ctx, js, stream, st.Stream, rec.Floor); err == nil {
			st.Lag = lag
		}
		out[i] = st
	}
	return out, nil
}

// lagAfter counts the messages on subject after sequence floor, with a
// short-lived consumer that reads nothing.
func lagAfter(ctx context.Context, js jetstream.JetStream, stream, subject string, floor uint64) (int64, error) {
	cc := jetstream.ConsumerConfig{
		FilterSubject: subject, AckPolicy: jetstream.AckNonePolicy,
		DeliverPolicy: jetstream.DeliverAllPolicy, InactiveThreshold: 5 * time.Second,
	}
	if floor > 0 {
		cc.DeliverPolicy, cc.OptStartSeq = jetstream.DeliverByStartSequencePolicy, floor+1
	}
	c, err := js.CreateConsumer(ctx, stream, cc)
	if err != nil {
		return 0, err
	}
	info := c.CachedInfo()
	_ = js.DeleteConsumer(ctx, stream, info.Name)
	return int64(info.NumPending), nil
}

// ShardStatus implements bus.ShardReporter.
func (b *natsBroker) ShardStatus(ctx context.Context, topic, group string) ([]bus.ShardStatus, error) {
	js, err := b.pub.client()
	if err != nil {
		return nil, err
	}
	return ShardStatus(ctx, js, b.conn, topic, group)
}
