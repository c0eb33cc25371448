// Package rabbitmq is the omnibus transport for RabbitMQ (AMQP 0-9-1, on
// github.com/rabbitmq/amqp091-go). It registers the broker "rabbitmq" and
// the configuration section rabbitmq: (see docs/configuration.md); import
// it, or transports/all, to link it.
//
// # Layout
//
// A topic T is a durable direct exchange (ExchangePrefix + T). Each consumer
// group G has, per shard i, a durable quorum queue
// "<exchange>.G.shard.i" with single-active-consumer, bound with routing key
// "shard.i", and a dead-letter queue "<exchange>.G.dead-letter". A message
// goes to shard bus.ShardOf(partition key, Shards) — FNV-1a 32 of the key
// modulo the count, the hash every sharded transport uses — and a message
// without a key to the shards in turn. The queue "<exchange>.shards" records
// the topic's shard count (as its x-max-length, which RabbitMQ checks on
// every declaration, and in its one message); a publisher or subscriber with
// another count is refused with a *ShardCountError naming rabbitmq.shards
// and both counts. Keys are never re-hashed silently.
//
// # Publishing
//
// Publish uses publisher confirms and mandatory, persistent messages: it
// returns once RabbitMQ has every message in the queues of every group
// bound to the topic. A message that no queue takes is an error naming the
// way out (subscribe the group first, or list it in rabbitmq.groups: the
// Publisher declares those groups' queues on a topic's first publish, by
// default inbox.consumer_group's), never a drop. A broker that cannot be
// reached, a lost connection or a nacked confirm is a transient error, so a
// relay spends no attempt on it. Messages of one Publish call go out on one
// channel, in order; the message's UUID is its message-id, its metadata
// string headers.
//
// # Receiving and per-key order
//
// A Subscriber consumes every shard queue of its group; RabbitMQ makes one
// consumer of the group active per queue (single-active-consumer), so each
// shard has one reader at a time however many consumers run, and a consumer
// that goes away (closed, killed, cut off) leaves its unacknowledged
// messages to the next one, which receives them in queue order before the
// rest. Within a subscription, the messages of one partition key are handed
// out one at a time, in queue order: a nacked message holds its key until it
// is redelivered (after its settlement's retry time, or NackDelay) and
// settled; other keys go on. A message is acked after its handler acks it.
// bus.Delivery.Attempts counts the failed attempts, RabbitMQ's redeliveries
// after a consumer went away (x-delivery-count) included.
//
// Single-active-consumer does not balance: the active consumer of a shard
// is the first that subscribed to it, and the others stand by. In practice
// the first consumer of a group is active on every shard and the others
// take over when it goes: scaling consumers out on RabbitMQ gives failover
// with order kept, not more parallelism (within one consumer, the keys of a
// shard are handled concurrently, up to rabbitmq.prefetch).
//
// # Fencing
//
// A subscription's lease on its queues is the heartbeat (rabbitmq.heartbeat):
// it makes a round trip to RabbitMQ every quarter of it, and hands nothing
// out once the last successful round trip was sent longer ago than that,
// a message already waiting for the consumer to take it included.
// RabbitMQ closes a connection that missed two heartbeats and gives its
// queues, with what it held unacknowledged, to the group's next consumer. So
// a process stopped past its lease (SIGSTOP, a long GC pause, a network
// partition) hands out nothing more when it wakes, and its acks no longer
// count (its channel is gone: the next consumer has those messages again).
// A handler that was already running may still finish: its effect then
// happens twice unless it is deduplicated by message id, as the inbox does.
//
// # Dead letters
//
// A message given up on (a settlement with GiveUp: a permanent failure, or
// a counted one past its budget) and a message that does not decode (no
// message-id, a header that is not a string) are copied to the group's
// dead-letter queue with the omnibus_dead_letter_* headers (reason, error,
// class, attempts, topic, group, time), confirmed, and then acked; if the
// copy fails, the message stays and is delivered again. The subscription
// goes on with the next message.
//
// # Limits
//
// RabbitMQ's consumer_timeout (30 minutes by default) closes a channel whose
// delivery stays unacknowledged longer: a retry delay longer than that ends
// the subscription's session, and the message is delivered again. Metadata
// keys RabbitMQ sets itself (x-delivery-count, x-death, …) are refused on
// publish.
package rabbitmq
