// Package redis is the Redis Streams transport of omnibus: a Publisher that
// appends messages to streams with XADD and a consumer-group Subscriber, both
// on go-redis and both implementing Watermill's message interfaces. It needs
// Redis 7 or later (XAUTOCLAIM that reports trimmed entries).
// Importing it registers the redis broker with bus, with its config section
// (Config, the redis: keys and OMNIBUS_REDIS_* variables; Section reads it
// from a bus.Config).
//
//	client := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:6379"})
//	defer client.Close() // ours to close; the transport never closes it
//
//	pub, err := redis.NewPublisher(redis.PublisherConfig{Client: client}, logger)
//	if err != nil { ... }
//	defer pub.Close()
//	msg := message.NewMessage(watermill.NewUUID(), []byte(`{"id":42}`))
//	bus.SetPartitionKey(msg, "order-42")
//	err = pub.Publish("orders", msg) // XADD orders * uuid … payload … meta:partition_key order-42
//
//	sub, err := redis.NewSubscriber(redis.SubscriberConfig{
//		Client:        client,
//		ConsumerGroup: "billing",
//	}, logger)
//	if err != nil { ... }
//	defer sub.Close()
//	msgs, err := sub.Subscribe(ctx, "orders")
//	for msg := range msgs {
//		d, _ := bus.DeliveryOf(msg) // d.Attempts, d.ID (the entry id), d.Source (the stream)
//		msg.Ack()
//	}
//
// # Entries
//
// A message becomes one stream entry with the fields "uuid", "payload" and
// one "meta:<key>" field per metadata entry (DefaultMarshaler). The stream is
// StreamPrefix + topic. Any bytes go through unchanged: the UUID, the
// payload and metadata keys and values (empty, binary, not UTF-8, named like
// the fields themselves). The Publisher refuses, with a permanent error and
// before writing any message of the call, what the Subscriber could not
// decode: a nil message or an empty UUID. An entry the Marshaler cannot
// decode (written by something else) is copied to the dead-letter stream
// with the reason and acknowledged; it never stops the subscription.
//
// # Redis Cluster
//
// Pass a *goredis.ClusterClient as Client (Addr opens a client for a single
// server only); the broker opens one from redis.cluster_addrs. Every command and Lua script the transport sends touches one
// key, and a stream's consumer group lives in the stream's key, so a stream
// and its dead-letter stream need not share a slot and need no {hash tag}:
// the dead-letter copy is its own XADD, followed by the XACK on the stream
// (a crash between the two can leave a copy in the dead-letter stream of an
// entry that is then delivered again: at least once). The Publisher's
// pipelines may mix streams of several nodes; the client splits them per
// node and each stream keeps the order of its Publish calls. The universal
// suite (in short mode), reclaiming, dead-lettering onto another node and
// per-key order are tested against a 3-node cluster. Moving slots
// (resharding) while publishing is not tested.
//
// # TLS and ACL
//
// A Publisher or Subscriber opened from Addr authenticates as Username with
// Password (a Redis ACL user) and speaks TLS when TLS, TLSCAFile or
// TLSServerName is set: TLSCAFile verifies the server with the authorities
// of a PEM file instead of the system roots, TLSServerName is the name
// checked against the server's certificate instead of the host of Addr. A
// CA file that cannot be read or holds no certificate is a *bus.ConfigError; a
// certificate that does not verify, or a refused password, fails each call
// with a transient error that names the cause and never shows the password.
// bus.OpenBroker maps redis.tls, redis.tls_ca_file and redis.tls_server_name the
// same way.
//
// # Publish failures
//
// A Publish error says whether the message should spend an attempt
// (bus.ClassOf). Redis unreachable or unable to take writes for now is
// transient: connection and pool errors, timeouts, TLS failing to verify the
// server, OOM (maxmemory reached), LOADING, READONLY, MASTERDOWN,
// CLUSTERDOWN, TRYAGAIN, BUSY, NOREPLICAS, max clients, MOVED/ASK left over
// by the cluster client, and NOAUTH, WRONGPASS and NOPERM (a relay waits
// for the ACL to be fixed rather than failing events). A reply that refuses
// the write for a reason of its own (WRONGTYPE, a value over the server's
// proto-max-bulk-len, any other) is counted, so a message that can never be
// written runs out of attempts instead of holding its key forever. A
// multi-message Publish is transient only when each failed entry failed
// transiently. A message the Marshaler refuses, or whose entry is over
// PublisherConfig.MaxEntryBytes, fails the call with a permanent error
// before anything of it is written.
//
// # Delivery, retries and dead letters
//
// The Subscriber creates its consumer group at the start of the stream
// (MKSTREAM) when missing, reads with XREADGROUP COUNT BatchSize, keeps up to
// MaxInFlight entries out at once and acknowledges them with batched XACKs.
// Delivery is at-least-once. A read that follows a full batch (a backlog)
// does not block and is parsed by the transport from the raw reply; the
// entries of each read are decoded, in stream order, while the next read
// runs. One goroutine hands the entries out on the messages channel as they
// become ready: in stream order as read, except that a redelivery after a
// nack, a reclaimed entry and (with OrderByKey) an entry that waited for an
// earlier one of its key go behind those already waiting. Without nacks and
// reclaims one subscription receives its stream in order
// (TestSubscriber_HandsEntriesOutInStreamOrder). Another goroutine notices
// acks and nacks, many at a time; a message whose handler takes longer than
// a millisecond is waited for by a goroutine of its own, so it holds back
// the noticing of the others' acks for at most that millisecond. A
// message's context carries its bus.Delivery and is done (context.Canceled)
// once the message is acked or nacked, or the subscription stops while it
// is out.
//
// The pending list is the record of truth. The delivery count Redis keeps
// there is the number of counted attempts plus one, and becomes
// bus.Delivery.Attempts: a counted failure adds one when the entry is
// redelivered, a transient failure (bus.Transient) does not, and a reclaim
// after a consumer died adds one (the dead consumer may have been handling
// the entry, so an entry that crashes its consumers runs out of attempts).
//
// A nacked entry stays pending, owned by the subscription, which redelivers
// it when its bus.Settlement's RetryAt is due (NackDelay when there is no
// settlement or no retry time) — in the background, without a tight loop,
// holding its in-flight slot. While a subscription holds an entry (handler
// running, retry waiting, queued behind its key) it resets the entry's idle
// time every ClaimIdle/3, so no other consumer takes it. When a subscription
// stops it hands what it holds back to the group: claimable at once, or when
// the retry is due. If the process dies instead, any consumer of the group
// reclaims the entries with XAUTOCLAIM after ClaimIdle. Nothing is lost
// either way. Acknowledgements are batched into XACKs; a subscription does
// not hand out again an entry it acked whose XACK is still on its way, even
// when its own reclaim takes the entry back meanwhile. Another consumer may
// reclaim it when the XACK is later than ClaimIdle (Redis unreachable):
// delivery is at least once.
//
// A settlement with GiveUp (set by the Retry middleware for a permanent
// failure or when the attempt budget is spent) copies the entry to the
// dead-letter stream with its reason, its delivery count and its origin
// (metadata omnibus_dead_letter_reason, _error, _class, _attempts, _stream,
// _id, …, named as the Kafka transport's headers) and acknowledges it. Nothing else dead-letters: a plain
// Nack is redelivered after NackDelay, however often.
//
// # Trimming
//
// PublisherConfig.MaxLen trims streams approximately (MAXLEN ~). It is off by
// default, because Redis trims without regard to consumer groups: entries a
// slow group has not read are lost to it silently, and entries it has read but
// not acknowledged lose their data. The Subscriber finds the latter when it
// reclaims or redelivers them, logs each at Error level and counts them in
// Stats().TrimmedPending; it cannot bring them back.
//
// # Ordering
//
// A stream is ordered, but a consumer group with several messages in flight
// is not: entries are handled concurrently, spread over the group's
// consumers, and a failed entry is retried after the ones behind it. With
// OrderByKey, a subscription hands out entries with the same partition_key
// one at a time in stream order (the next after the previous is acked or
// dead-lettered; a nacked one holds its key until it is done). With one
// stream per topic (Shards 1, the default) that holds only within one
// subscription: with several consumers in the group, Redis gives entries of
// one key to different consumers, and an entry reclaimed from a dead
// consumer arrives after later entries of its key. Such a subscription
// logs a warning naming the other consumers once they are delivered entries
// of its stream (it lists the group every 30 s). Shard the topic to keep the
// order with any number of consumers.
//
// # Key-sharded streams
//
// With Shards N > 1 (the same in the Publisher and every Subscriber; the
// broker's redis.shards) a topic is N streams, shard i of stream s named
// s + ":shard:{i}". The Publisher writes a message to the shard
// bus.ShardOf(partition key, N) (FNV-1a 32 of the key modulo N, fixed
// across releases), a message without a key to the shards in turn. A Publish
// call's messages of one key go out in one pipeline, in order.
//
// The Subscribers of a group share a topic's shards like Kafka consumers
// share partitions. Each keeps a membership in the sorted set
// s + ":members:" + group (scored by Redis server time) and owns shard i
// when it is the (i mod members)-th live member, sorted by name; it takes a
// shard's lease (s + ":shard:{i}:owner:" + group, "<token> <consumer>", with
// PX ShardLease; the token counts up in ":epoch:" + group) when the lease is
// free, renews it every third of ShardLease, and gives back the shards
// that stop being its share (acknowledgements flushed, held entries handed
// back, lease deleted). A Subscriber reads only the shards it owns: one
// shard subscription per shard, with OrderByKey as configured.
//
// A shard subscription first claims every entry pending in its shard's group
// (the previous owner's, idle or not, in stream order, with XAUTOCLAIM;
// each claim counts an attempt unless the previous owner handed the entry
// back) and hands those out before it reads anything new, so a key's order
// holds across a handover.
//
// Fencing: a lease is "surely ours" until the local time a renewal was sent
// plus ShardLease. A shard subscription checks that before each handoff,
// and a message waiting for the consumer to take it is not handed out once
// that time has passed;
// Redis checks the lease's token with each read (XREADGROUP in a MULTI
// under WATCH of the lease, so it does not block: the subscription waits
// for new entries with a plain XREAD), and in the same Lua script as each
// takeover claim and each XACK. A
// consumer that was stopped past its lease (SIGSTOP, a GC pause, a network
// partition) so hands out and acknowledges nothing of the shard when it
// wakes: its late XACKs are refused, it drops what it held, counts the
// shard in Stats().ShardsLost and rejoins the group. A handler that was
// running when it stalled may still finish, so its effect can happen twice:
// deduplicate by message id (the inbox does, keeping the first).
//
// The shard count is recorded in s + ":shards" on a topic's first use (by
// the Publisher or a Subscriber, with any count, 1 included). Another count
// is refused with a *ShardCountError naming redis.shards and both counts: a
// Subscriber's Subscribe fails, a Publisher's Publish fails with a transient
// error (a relay waits). To change the count, stop the publishers, let every
// group drain the topic, delete the :shards key and the old streams, and
// start with the new count. Keys are never moved to other shards silently.
//
// On Redis Cluster a shard's keys (stream, lease, epoch) share one slot: the
// {i} hash tag, or whatever tag the topic's name holds, lies in the prefix
// they share. A topic's shards spread over the nodes.
package redis
