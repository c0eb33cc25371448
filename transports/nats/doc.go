// Package nats is the NATS JetStream transport: broker "nats" of
// bus.OpenBroker (section nats:), and a Watermill Publisher and Subscriber.
//
// # Layout
//
// A topic T (subject prefix P) is a stream named P+T with '.' replaced by
// '_', whose subjects are P+T.<i> for its shards i; the stream's
// description records the shard count, and another count is refused
// (ShardCountError). A consumer group's dead letters go to subject
// P+T.dead-letter.<group> in stream <stream>_DEAD_LETTER. Shard leases, the
// groups' positions and memberships live in a key-value bucket (Bucket).
//
// # Publishing
//
// Every message carries its UUID as Nats-Msg-Id, so a retry inside the
// stream's duplicate window is stored once, and Publish returns once
// JetStream has acknowledged every message. A message goes to the shard of
// its partition key (bus.ShardOf); unkeyed messages are spread round robin.
//
// # Consuming
//
// A group's live consumers share the shards out; each shard is read by the
// holder of its lease, from the group's recorded floor (the stream sequence
// up to which it has settled every message of the shard), with an ordered
// consumer. A key's messages are handed out one at a time, in stream order;
// different keys at once, up to Prefetch unsettled per shard. Ack settles a
// message; Nack hands it out again after the settlement's retry time (or
// NackDelay); a settlement that gives up, or a message that does not decode,
// is dead-lettered.
//
// # Fencing
//
// A consumer renews its leases by compare-and-set on the key's revision,
// recording the floor as it does, and hands nothing out once its last
// successful renewal was sent more than ShardLease ago, a message already
// waiting for the consumer to take it included. Another consumer
// takes a lease over when the key's revision has not changed for ShardLease
// on its own clock; a consumer whose compare-and-set fails has lost the
// shard and writes nothing more. What an owner read and did not settle is
// read again by the next owner, from the floor.
//
// docs/nats.md has the guarantees with their conditions.
package nats
