package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/omnibus-go/omnibus/bus"
)

// The layout of a topic T (exchange prefix P, N shards) for a group G:
//
//	exchange  P+T                      direct, durable
//	queue     P+T + "." + G + ".shard." + i   quorum, single-active-consumer,
//	                                   bound with routing key "shard." + i
//	queue     P+T + "." + G + ".dead-letter"  quorum: what G gave up on
//	queue     P+T + ".shards"          x-max-length = N (checked by RabbitMQ on
//	                                   every declaration); one message: N

func exchangeName(prefix, topic string) string { return prefix + topic }

func routingKey(shard int) string { return "shard." + strconv.Itoa(shard) }

func shardQueue(exchange, group string, shard int) string {
	return exchange + "." + group + ".shard." + strconv.Itoa(shard)
}

func deadLetterQueue(exchange, group string) string {
	return exchange + "." + group + DefaultDeadLetterSuffix
}

func countQueue(exchange string) string { return exchange + ".shards" }

// ErrShardCount is the error of a publisher or subscriber whose shard count
// differs from the one recorded for the topic.
var ErrShardCount = errors.New("shard count differs from the topic's recorded count")

// ShardCountError reports a shard count that differs from the topic's. It
// matches ErrShardCount and bus.ErrInvalidConfig.
type ShardCountError struct {
	Topic      string
	Configured int
	// Recorded is the topic's count; 0 when it could not be read.
	Recorded int
	// Queue is the queue that records it.
	Queue string
}

func (e *ShardCountError) Error() string {
	recorded := "another count"
	if e.Recorded > 0 {
		recorded = strconv.Itoa(e.Recorded)
	}
	return (&bus.ConfigError{Field: "rabbitmq.shards", Reason: fmt.Sprintf(
		"%d, but topic %q was set up with %s shards (%v; queue %s records it). To change it: stop the publishers, let every consumer group drain the topic, delete the exchange and its queues, then start everything with the new count",
		e.Configured, e.Topic, recorded, ErrShardCount, e.Queue)}).Error()
}

// Is makes a ShardCountError match ErrShardCount and bus.ErrInvalidConfig.
func (e *ShardCountError) Is(target error) bool {
	return target == ErrShardCount || target == bus.ErrInvalidConfig
}

// topology declares exchanges and queues once per connection.
type topology struct {
	prefix  string
	shards  int
	expires time.Duration

	mu       sync.Mutex
	declared map[string]bool // exchanges and "exchange\x00group"
}

func newTopology(cfg ConnectionConfig) *topology {
	return &topology{prefix: cfg.ExchangePrefix, shards: cfg.Shards, expires: cfg.QueueExpires, declared: map[string]bool{}}
}

// queueArgs are the arguments of a queue of the layout.
func (t *topology) queueArgs(args amqp.Table) amqp.Table {
	if t.expires > 0 {
		args["x-expires"] = t.expires.Milliseconds()
	}
	return args
}

// exchange declares topic's exchange with the shard count (RabbitMQ refuses
// a declaration whose arguments differ: the count is checked there) and
// records the count for error messages. A channel that fails a declaration
// is closed by the server; conn opens the next.
func (t *topology) exchange(ctx context.Context, conn *amqp.Connection, topic string) (string, error) {
	name := exchangeName(t.prefix, topic)
	t.mu.Lock()
	done := t.declared[name]
	t.mu.Unlock()
	if done {
		return name, nil
	}
	ch, err := conn.Channel()
	if err != nil {
		return "", classify(fmt.Errorf("open a channel: %w", err))
	}
	defer ch.Close()
	if err := ch.ExchangeDeclare(name, amqp.ExchangeDirect, true, false, false, false, nil); err != nil {
		return "", classify(fmt.Errorf("declare exchange %q: %w", name, err))
	}
	if err := t.recordCount(ch, name); err != nil {
		var amqpErr *amqp.Error
		if errors.As(err, &amqpErr) && amqpErr.Code == amqp.PreconditionFailed {
			return "", &ShardCountError{Topic: topic, Configured: t.shards, Recorded: readCount(conn, name), Queue: countQueue(name)}
		}
		return "", err
	}
	t.mu.Lock()
	t.declared[name] = true
	t.mu.Unlock()
	return name, nil
}

// recordCount declares the topic's count queue with the shard count as its
// x-max-length: RabbitMQ refuses (406) to declare it again with another, so
// the first user's count holds. The queue keeps one message with the count
// in its body, for the error that names both counts.
func (t *topology) recordCount(ch *amqp.Channel, exchange string) error {
	q, err := ch.QueueDeclare(countQueue(exchange), true, false, false, false,
		t.queueArgs(amqp.Table{"x-queue-type": "quorum", "x-max-length": int64(t.shards)}))
	if err != nil {
		return fmt.Errorf("declare queue %q: %w", countQueue(exchange), err)
	}
	if q.Messages > 0 {
		return nil
	}
	return classify(ch.Publish("", q.Name, false, false, amqp.Publishing{
		DeliveryMode: amqp.Persistent, Body: []byte(strconv.Itoa(t.shards)),
	}))
}

// readCount reads the count recorded for exchange; 0 when it cannot.
func readCount(conn *amqp.Connection, exchange string) int {
	ch, err := conn.Channel()
	if err != nil {
		return 0
	}
	defer ch.Close()
	d, ok, err := ch.Get(countQueue(exchange), false)
	if err != nil || !ok {
		return 0
	}
	_ = d.Nack(false, true) // leave it for the next reader
	n, _ := strconv.Atoi(string(d.Body))
	return n
}

// group declares the shard queues and the dead-letter queue of group on
// topic's exchange and binds them.
func (t *topology) group(ctx context.Context, conn *amqp.Connection, topic, group string) (exchange string, err error) {
	exchange, err = t.exchange(ctx, conn, topic)
	if err != nil {
		return "", err
	}
	key := exchange + "\x00" + group
	t.mu.Lock()
	done := t.declared[key]
	t.mu.Unlock()
	if done {
		return exchange, nil
	}
	ch, err := conn.Channel()
	if err != nil {
		return "", classify(fmt.Errorf("open a channel: %w", err))
	}
	defer ch.Close()
	for i := range t.shards {
		q := shardQueue(exchange, group, i)
		if _, err := ch.QueueDeclare(q, true, false, false, false, t.queueArgs(amqp.Table{
			"x-queue-type": "quorum", "x-single-active-consumer": true,
		})); err != nil {
			return "", classify(fmt.Errorf("declare queue %q: %w", q, err))
		}
		if err := ch.QueueBind(q, routingKey(i), exchange, false, nil); err != nil {
			return "", classify(fmt.Errorf("bind queue %q: %w", q, err))
		}
	}
	dl := deadLetterQueue(exchange, group)
	if _, err := ch.QueueDeclare(dl, true, false, false, false, t.queueArgs(amqp.Table{"x-queue-type": "quorum"})); err != nil {
		return "", classify(fmt.Errorf("declare queue %q: %w", dl, err))
	}
	t.mu.Lock()
	t.declared[key] = true
	t.mu.Unlock()
	return exchange, nil
}

// DeleteTopic removes topic's exchange, the queues of groups on it, their
// dead-letter queues and the count queue (tests and examples tidy up with
// it).
func DeleteTopic(ctx context.Context, url, prefix, topic string, shards int, groups ...string) error {
	conn, err := amqp.Dial(url)
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	exchange := exchangeName(prefix, topic)
	var errs []error
	for _, g := range groups {
		for i := range shards {
			_, err := ch.QueueDelete(shardQueue(exchange, g, i), false, false, false)
			errs = append(errs, err)
		}
		_, err := ch.QueueDelete(deadLetterQueue(exchange, g), false, false, false)
		errs = append(errs, err)
	}
	_, err = ch.QueueDelete(countQueue(exchange), false, false, false)
	errs = append(errs, err, ch.ExchangeDelete(exchange, false, false))
	return errors.Join(errs...)
}

// forget drops what was declared on exchange, so that it is declared again.
func (t *topology) forget(exchange string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for k := range t.declared {
		if k == exchange || len(k) > len(exchange) && k[:len(exchange)+1] == exchange+"\x00" {
			delete(t.declared, k)
		}
	}
}
