package redis

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/omnibus-go/omnibus/bus"
	"github.com/redis/go-redis/v9"
)

// Publisher appends messages to Redis streams with XADD. It implements
// watermill's message.Publisher and is safe for concurrent use.
//
// A Publish call returns once all its entries are stored, in the order
// given: a multi-message Publish is one pipeline. Concurrent Publish calls
// share pipelines (group commit): while one pipeline is on the wire the
// next calls queue, and go out together in the next round trip, so the
// number of round trips grows with the number of pipelines in flight, not
// with the number of callers.
//
// Errors that mean Redis could not be reached or could not take the write
// for now (down, out of memory, loading, failing over; see the package
// documentation) are marked bus.Transient, so a relay spends no attempt on
// them; a reply refusing the write itself is counted. A message that cannot
// be encoded, or whose entry is over MaxEntryBytes, is refused with a
// bus.Permanent error before anything of the call is written. A failed
// Publish may otherwise have stored some of its entries; publishing is
// at-least-once.
type Publisher struct {
	cfg    PublisherConfig
	client redis.UniversalClient
	owned  bool
	logger *slog.Logger

	queue chan *publishRequest

	counts shardCounts            // Shards > 1: the topics whose recorded count matches
	topic  atomic.Pointer[string] // the last topic ValidateTopic accepted
	spread atomic.Int64           // Shards > 1: spreads messages without a key

	mu      sync.RWMutex // guards closed against Publish calls in progress
	closed  bool
	calls   sync.WaitGroup // Publish calls in progress
	stop    chan struct{}
	workers sync.WaitGroup
	once    sync.Once
	closeEr error
}

type publishRequest struct {
	stream  string   // the topic's stream, for errors
	streams []string // of each entry: stream, or its shard
	entries [][]any
	done    chan error
}

// requests recycles publishRequests, their done channel and, for calls of
// up to maxPooledEntries messages, their slices: a Publish of one message
// would otherwise allocate five objects before its entry is encoded.
var requests = sync.Pool{New: func() any { return &publishRequest{done: make(chan error, 1)} }}

const maxPooledEntries = 64

func newRequest(stream string, n int) *publishRequest {
	req := requests.Get().(*publishRequest)
	req.stream = stream
	if cap(req.streams) < n {
		req.streams, req.entries = make([]string, n), make([][]any, n)
	}
	req.streams, req.entries = req.streams[:n], req.entries[:n]
	return req
}

// release returns req to the pool. Only a caller that took req's result
// from done (or never queued it) may release it: a request abandoned on a
// context's end is still written to by its worker.
func (req *publishRequest) release() {
	if cap(req.streams) > maxPooledEntries {
		return
	}
	clear(req.streams)
	clear(req.entries)
	req.stream = ""
	requests.Put(req)
}

// NewPublisher checks cfg and returns a Publisher. A nil logger means no
// logging.
func NewPublisher(cfg PublisherConfig, logger *slog.Logger) (*Publisher, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	client, owned, err := cfg.connection().open()
	if err != nil {
		return nil, err
	}
	p := &Publisher{
		cfg:    cfg,
		client: client,
		owned:  owned,
		logger: bus.LoggerOrNop(logger).With("component", "redis_publisher"),
		queue:  make(chan *publishRequest, cfg.BatchSize*cfg.Pipelines),
		stop:   make(chan struct{}),
	}
	p.workers.Add(cfg.Pipelines)
	for range cfg.Pipelines {
		go p.run()
	}
	return p, nil
}

// Publish appends msgs to the stream of topic (StreamPrefix + topic) and
// waits until Redis has stored them, or until the first message's context is
// done (the entries may then still be written).
func (p *Publisher) Publish(topic string, msgs ...*message.Message) error {
	if len(msgs) == 0 {
		return nil
	}
	if last := p.topic.Load(); last == nil || *last != topic {
		if err := ValidateTopic(topic); err != nil {
			return bus.Permanent(fmt.Errorf("publish to redis: %w", err))
		}
		valid := topic
		p.topic.Store(&valid)
	}
	stream := p.cfg.StreamPrefix + topic
	req := newRequest(stream, len(msgs))
	abandoned := false // queued, and given up on: its worker still writes to it
	defer func() {
		if !abandoned {
			req.release()
		}
	}()
	for i, msg := range msgs {
		if msg == nil {
			return bus.Permanent(fmt.Errorf("publish to stream %q: message %d of %d is nil", stream, i+1, len(msgs)))
		}
		req.streams[i] = p.streamOf(stream, msg)
		fields, err := p.cfg.Marshaler.Marshal(topic, msg)
		if err == nil {
			err = p.checkSize(fields)
		}
		if err != nil {
			return bus.Permanent(fmt.Errorf("encode message %s for stream %q: %w", msg.UUID, stream, err))
		}
		req.entries[i] = fields
	}

	p.mu.RLock()
	if p.closed {
		p.mu.RUnlock()
		return classify(fmt.Errorf("publish to stream %q: %w", stream, ErrClosed))
	}
	p.calls.Add(1)
	p.mu.RUnlock()
	defer p.calls.Done()

	// The first message's context bounds the wait (a handler's deadline, a
	// relay shutting down); entries already queued may still be written.
	ctx := msgs[0].Context()
	if err := ctx.Err(); err != nil {
		return classify(fmt.Errorf("publish to stream %q: %w", stream, err))
	}
	// A count that differs from the topic's is an operator's mistake a relay
	// waits out (transient): failing the events would park them.
	if err := p.counts.check(ctx, p.client, topic, stream, p.cfg.Shards); err != nil {
		if ctx.Err() != nil {
			return contextEnded(stream, ctx.Err())
		}
		return bus.Transient(fmt.Errorf("publish to topic %q: %w", topic, err))
	}
	select {
	case p.queue <- req:
	case <-ctx.Done():
		return contextEnded(stream, ctx.Err())
	}
	select {
	case err := <-req.done:
		return err
	case <-ctx.Done():
		abandoned = true
		return contextEnded(stream, ctx.Err())
	}
}

// contextEnded classifies a Publish that stopped waiting because its
// message's context ended. A deadline means the publish was attempted and
// timed out: counted, like any failure of an attempted message (DESIGN §3),
// so a message that always times out reaches its budget. A cancellation (the
// relay shutting down) says nothing about the message: transient.
func contextEnded(stream string, err error) error {
	wrapped := fmt.Errorf("publish to stream %q: %w", stream, err)
	if errors.Is(err, context.DeadlineExceeded) {
		return wrapped
	}
	return bus.Transient(wrapped)
}

// checkSize refuses an entry larger than MaxEntryBytes, naming its largest
// field.
func (p *Publisher) checkSize(fields []any) error {
	total, largest, largestAt := 0, 0, 0
	for i, f := range fields {
		n := valueLen(f)
		total += n
		if i%2 == 1 && n > largest {
			largest, largestAt = n, i-1
		}
	}
	if total > p.cfg.MaxEntryBytes {
		return fmt.Errorf("stream entry of %d bytes is over MaxEntryBytes (%d); its largest field is %q (%d bytes)",
			total, p.cfg.MaxEntryBytes, fmt.Sprint(fields[largestAt]), largest)
	}
	return nil
}

func valueLen(v any) int {
	switch v := v.(type) {
	case string:
		return len(v)
	case []byte:
		return len(v)
	default:
		return len(fmt.Sprint(v))
	}
}

// run sends the queued requests, as many as fit in one pipeline at a time.
// When the queue runs dry before the pipeline is full it yields the
// processor a few times first: the callers whose last pipeline just came
// back are about to queue their next message, and one pipeline that carries
// them all costs Redis and the network far less than several small ones
// (measured: 55-62 % of a raw pipeline loop without the yields, 65-74 %
// with them, BenchmarkPublish). A yield is not a timer: with nobody else
// runnable it returns at once, so a lone caller waits for nothing.
func (p *Publisher) run() {
	defer p.workers.Done()
	batch := make([]*publishRequest, 0, 64)
	for {
		select {
		case req := <-p.queue:
			batch = append(batch[:0], req)
		case <-p.stop:
			return
		}
		n := len(batch[0].entries)
		yields := 0 // at most fillYields
	fill:
		for n < p.cfg.BatchSize {
			select {
			case req := <-p.queue:
				batch = append(batch, req)
				n += len(req.entries)
			default:
				if yields == fillYields {
					break fill
				}
				yields++
				runtime.Gosched()
			}
		}
		p.send(batch)
		clear(batch)
	}
}

// fillYields is how many times run yields for a pipeline that is not full.
const fillYields = 4

func (p *Publisher) send(batch []*publishRequest) {
	ctx := context.Background()
	if len(batch) == 1 && len(batch[0].entries) == 1 {
		req := batch[0]
		err := p.client.XAdd(ctx, p.xaddArgs(req.streams[0], req.entries[0])).Err()
		req.done <- p.wrap(req, err)
		return
	}
	pipe := p.client.Pipeline()
	cmds := make([]*redis.StringCmd, 0, len(batch))
	for _, req := range batch {
		for i, fields := range req.entries {
			cmds = append(cmds, pipe.XAdd(ctx, p.xaddArgs(req.streams[i], fields)))
		}
	}
	_, _ = pipe.Exec(ctx) // each command carries its own error
	i := 0
	for _, req := range batch {
		var errs []error
		for range req.entries {
			if err := cmds[i].Err(); err != nil {
				errs = append(errs, err)
			}
			i++
		}
		req.done <- p.wrap(req, errors.Join(errs...))
	}
}

// streamOf returns the stream msg goes to: stream, or with Shards > 1 the
// shard of its partition key (any shard, in turn, when it has none).
func (p *Publisher) streamOf(stream string, msg *message.Message) string {
	if p.cfg.Shards <= 1 {
		return stream
	}
	key := bus.PartitionKey(msg)
	if key == "" {
		return shardStream(stream, int(p.spread.Add(1)%int64(p.cfg.Shards)))
	}
	return shardStream(stream, bus.ShardOf(key, p.cfg.Shards))
}

func (p *Publisher) xaddArgs(stream string, fields []any) *redis.XAddArgs {
	a := &redis.XAddArgs{Stream: stream, Values: fields}
	if p.cfg.MaxLen > 0 {
		a.MaxLen = p.cfg.MaxLen
		a.Approx = true
	}
	return a
}

func (p *Publisher) wrap(req *publishRequest, err error) error {
	if err == nil {
		return nil
	}
	wrapped := fmt.Errorf("publish %d message(s) to stream %q: %w", len(req.entries), req.stream, err)
	if allTransient(err) {
		return bus.Transient(wrapped)
	}
	return wrapped
}

// Close waits for the Publish calls in progress, then stops. It closes the
// client only if the Publisher opened it from Addr; a caller's Client stays
// usable. Close is idempotent.
func (p *Publisher) Close() error {
	p.once.Do(func() {
		p.mu.Lock()
		p.closed = true
		p.mu.Unlock()
		p.calls.Wait()
		close(p.stop)
		p.workers.Wait()
		if p.owned {
			p.closeEr = p.client.Close()
		}
	})
	return p.closeEr
}
