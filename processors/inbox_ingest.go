package processors

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	wmw "github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/middleware"
	"github.com/omnibus-go/omnibus/transports/postgres"
)

// Defaults of InboxIngestConfig.
const (
	DefaultIngestHandlerName = "omnibus_inbox_ingest"
	// DefaultIngestBatchSize is how many messages one insert statement takes at most.
	DefaultIngestBatchSize = 100
	// DefaultIngestBatchWait is how long the first message of a batch waits
	// for others to join it.
	DefaultIngestBatchWait = 2 * time.Millisecond
	// DefaultIngestWriters is how many batches are written at once.
	DefaultIngestWriters = 4
	// DefaultIngestStoreTimeout bounds the transaction of one batch.
	DefaultIngestStoreTimeout = 30 * time.Second
)

// Limits of InboxIngestConfig: Validate refuses larger values. BatchSize ×
// Writers is the capacity of the ingest's request queue.
const (
	// MaxIngestBatchSize bounds BatchSize.
	MaxIngestBatchSize = 10_000
	// MaxIngestWriters bounds Writers.
	MaxIngestWriters = 256
)

// ErrIngestClosed is returned (transient) for messages that arrive after the
// InboxIngest was closed: they are nacked and redelivered by the broker.
var ErrIngestClosed = errors.New("inbox ingest: closed")

// InboxIngestConfig configures an InboxIngest.
type InboxIngestConfig struct {
	// Subscriber is the broker subscriber messages are received from (Kafka,
	// Redis Streams, …). Required. A router that runs the ingest closes it
	// when it stops, as Watermill routers do.
	Subscriber message.Subscriber
	// Topic is the broker topic to subscribe to. Required. It is stored as
	// each row's source topic.
	Topic string
	// ConsumerGroup is the inbox consumer group the messages are stored for.
	// Required. Each group stores (and later handles) every message once.
	ConsumerGroup string
	// Inbox configures the inbox table (Table, payload and metadata limits,
	// attempt budget of stored rows).
	Inbox postgres.InboxConfig
	// Inline, when set, handles each new message in the transaction that
	// stores it: the row is written completed, the handler sees the
	// transaction through postgres.TxFromContext(msg.Context()), and if it
	// fails nothing of the message is stored and the broker message is
	// nacked. Nil (the default) is store-only: a Dispatcher handles the rows
	// later. The handlers of one batch run one after another in the batch's
	// transaction; set BatchSize 1 for slow handlers. A Dispatcher's Dispatch
	// method is a ready-made Inline handler.
	Inline message.NoPublishHandlerFunc
	// BatchSize bounds how many concurrently received messages are stored by
	// one insert statement. Default DefaultIngestBatchSize.
	BatchSize int
	// BatchWait is how long the first message of a batch waits for more to
	// join it. Default DefaultIngestBatchWait; negative means no wait (a batch
	// holds what is already queued).
	BatchWait time.Duration
	// Writers is how many batches are written at once. Default DefaultIngestWriters.
	Writers int
	// StoreTimeout bounds the transaction of one batch. Default DefaultIngestStoreTimeout.
	StoreTimeout time.Duration
	// Retry configures the retry decisions recorded for the broker
	// subscriber (store failures and, inline, handler failures).
	Retry middleware.RetryConfig
	// Timeout bounds handling one message (waiting for its batch, and the
	// inline handler). Default middleware.DefaultTimeout (30 s).
	Timeout time.Duration
	// Breaker configures the circuit breaker around storing: while the
	// database is down, messages fail as transient and spend no attempts.
	Breaker middleware.CircuitBreakerConfig
	// HandlerName names the router handler. Default DefaultIngestHandlerName.
	HandlerName string
}

func (c *InboxIngestConfig) setDefaults() {
	if c.BatchSize == 0 {
		c.BatchSize = DefaultIngestBatchSize
	}
	if c.BatchWait == 0 {
		c.BatchWait = DefaultIngestBatchWait
	}
	if c.BatchWait < 0 {
		c.BatchWait = 0
	}
	if c.Writers == 0 {
		c.Writers = DefaultIngestWriters
	}
	if c.StoreTimeout == 0 {
		c.StoreTimeout = DefaultIngestStoreTimeout
	}
	if c.Timeout == 0 {
		c.Timeout = middleware.DefaultTimeout
	}
	if c.HandlerName == "" {
		c.HandlerName = DefaultIngestHandlerName
	}
}

// Validate reports the first invalid field.
func (c InboxIngestConfig) Validate() error {
	switch {
	case c.Subscriber == nil:
		return errors.New("Subscriber: required")
	case c.Topic == "":
		return errors.New("Topic: required")
	case c.ConsumerGroup == "":
		return errors.New("ConsumerGroup: required")
	case c.BatchSize < 1:
		return fmt.Errorf("BatchSize: must be at least 1, got %d", c.BatchSize)
	case c.BatchSize > MaxIngestBatchSize:
		return fmt.Errorf("BatchSize: at most %d, got %d", MaxIngestBatchSize, c.BatchSize)
	case c.Writers < 1:
		return fmt.Errorf("Writers: must be at least 1, got %d", c.Writers)
	case c.Writers > MaxIngestWriters:
		return fmt.Errorf("Writers: at most %d, got %d", MaxIngestWriters, c.Writers)
	case c.StoreTimeout < 0:
		return fmt.Errorf("StoreTimeout: must not be negative, got %s", c.StoreTimeout)
	case c.Timeout < 0:
		return fmt.Errorf("Timeout: must not be negative, got %s", c.Timeout)
	}
	return nil
}

// InboxIngest receives messages from a broker and stores them in the inbox,
// deduplicated per consumer group: broker Subscriber → store → ack. A broker
// message is acked only after the insert of its row has committed (or its
// id was already stored), so a crash at any point leads to a redelivery,
// never to a lost message; the redelivery is recognised as a duplicate.
//
// Messages received concurrently are stored together: the first one waits
// up to BatchWait for others, and up to BatchSize of them go into one insert
// statement, in one transaction. A message that cannot be stored (too big,
// not text) fails on its own as permanent and never spoils its batch.
//
// The chain is Retry, Recoverer, Timeout and CircuitBreaker, as for the
// outbox relay: a database outage opens the breaker and spends no attempts.
type InboxIngest struct {
	pool    *pgxpool.Pool
	cfg     InboxIngestConfig
	log     *slog.Logger
	inbox   *postgres.Inbox
	retry   *middleware.Retry
	breaker *middleware.CircuitBreaker

	in       chan *ingestRequest
	closing  chan struct{}
	stopped  chan struct{} // closed when no batch will be written any more
	once     sync.Once
	stopped1 sync.Once
	wg       sync.WaitGroup
	slots    chan struct{} // one per writer
}

// ingestRequest is one message waiting for its batch.
type ingestRequest struct {
	checked *postgres.Checked // the message, encoded for the insert by Handle's check
	ctx     context.Context   // the message's context when it was handed in
	id      string
	done    chan error
}

// NewInboxIngest validates cfg and builds the ingest over pool. A nil logger
// means no logging. Close it after the router that runs it has stopped.
func NewInboxIngest(pool *pgxpool.Pool, cfg InboxIngestConfig, logger *slog.Logger) (*InboxIngest, error) {
	if pool == nil {
		return nil, errors.New("invalid config: pool: must not be nil")
	}
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("invalid config: %w", err)
	}
	log := bus.LoggerOrNop(logger).With("topic", cfg.Topic, "consumer_group", cfg.ConsumerGroup)
	inbox, err := postgres.NewInbox(cfg.Inbox)
	if err != nil {
		return nil, fmt.Errorf("ingest inbox: %w", err)
	}
	retry, err := middleware.NewRetry(cfg.Retry, log)
	if err != nil {
		return nil, fmt.Errorf("ingest retry: %w", err)
	}
	breaker, err := middleware.NewCircuitBreaker(cfg.Breaker, log)
	if err != nil {
		return nil, fmt.Errorf("ingest breaker: %w", err)
	}
	g := &InboxIngest{
		pool: pool, cfg: cfg, log: log.With("table", inbox.Table()), inbox: inbox, retry: retry, breaker: breaker,
		in:      make(chan *ingestRequest, cfg.BatchSize*cfg.Writers),
		closing: make(chan struct{}),
		stopped: make(chan struct{}),
		slots:   make(chan struct{}, cfg.Writers),
	}
	g.wg.Add(1)
	go g.collect()
	return g, nil
}

// Inbox returns the inbox the ingest stores into.
func (g *InboxIngest) Inbox() *postgres.Inbox { return g.inbox }

// Breaker returns the ingest's circuit breaker.
func (g *InboxIngest) Breaker() *middleware.CircuitBreaker { return g.breaker }

// Handle stores one broker message (and, inline, handles it) and returns
// once its batch has committed: nil acks it. A duplicate returns nil at once
// after the insert found it, without running the inline handler.
func (g *InboxIngest) Handle(msg *message.Message) error {
	checked, err := g.inbox.CheckMessage(msg, g.cfg.Topic)
	if err != nil {
		return bus.Permanent(fmt.Errorf("ingest: %w", err))
	}
	ctx := msg.Context()
	r := &ingestRequest{checked: checked, ctx: ctx, id: bus.EventID(msg), done: make(chan error, 1)}
	select {
	case g.in <- r:
	case <-ctx.Done():
		return bus.Transient(fmt.Errorf("ingest %s: %w", r.id, ctx.Err()))
	case <-g.closing:
		return bus.Transient(ErrIngestClosed)
	}
	select {
	case err := <-r.done:
		return err
	case <-g.stopped:
		select {
		case err := <-r.done:
			return err
		default:
			return bus.Transient(ErrIngestClosed)
		}
	case <-ctx.Done():
		// The batch may still commit; the redelivery is then a duplicate.
		return bus.Transient(fmt.Errorf("ingest %s: waiting for the insert: %w", r.id, ctx.Err()))
	}
}

// Middleware returns the ingest's chain, outermost first.
func (g *InboxIngest) Middleware() []message.HandlerMiddleware {
	return []message.HandlerMiddleware{
		g.retry.Middleware,
		wmw.Recoverer,
		middleware.Timeout(g.cfg.Timeout),
		g.breaker.Middleware,
	}
}

// AddTo registers the ingest on router, subscribed to Topic. Close the
// ingest after the router has stopped.
func (g *InboxIngest) AddTo(router *message.Router) *message.Handler {
	h := router.AddConsumerHandler(g.cfg.HandlerName, g.cfg.Topic, g.cfg.Subscriber, g.Handle)
	h.AddMiddleware(g.Middleware()...)
	return h
}

// Run runs the ingest on a router of its own until ctx ends, then stops:
// the router closes the broker subscriber and waits for in-flight messages,
// whose batches are written before Run returns.
func (g *InboxIngest) Run(ctx context.Context) error {
	return runStandalone(ctx, "ingest", g.cfg.Timeout+time.Second, g.log, g.AddTo, g.Close)
}

// Close stops taking messages (later ones fail as transient and are
// redelivered by the broker) and waits for the batches being written. It
// does not close the broker subscriber. It is idempotent.
func (g *InboxIngest) Close() error {
	g.once.Do(func() { close(g.closing) })
	g.wg.Wait()
	g.stopped1.Do(func() { close(g.stopped) })
	return nil
}

// collect forms batches. It takes a writer first and only then fills the
// batch: from what queued up meanwhile, then waiting up to BatchWait for
// more, up to BatchSize. So while every writer is busy, requests queue and
// the next batch leaves full the moment a writer is free; when they are
// idle, a batch leaves after BatchWait.
func (g *InboxIngest) collect() {
	defer g.wg.Done()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		var batch []*ingestRequest
		select {
		case r := <-g.in:
			batch = append(batch, r)
		case <-g.closing:
			g.drain()
			return
		}
		g.slots <- struct{}{}
		if g.cfg.BatchWait > 0 {
			timer.Reset(g.cfg.BatchWait)
		}
	fill:
		for len(batch) < g.cfg.BatchSize {
			select {
			case r := <-g.in:
				batch = append(batch, r)
				continue
			default:
			}
			if g.cfg.BatchWait == 0 {
				break
			}
			select {
			case r := <-g.in:
				batch = append(batch, r)
			case <-timer.C:
				break fill
			case <-g.closing:
				break fill
			}
		}
		if g.cfg.BatchWait > 0 && !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		g.wg.Add(1)
		go func() {
			defer g.wg.Done()
			defer func() { <-g.slots }()
			g.write(batch)
		}()
	}
}

// drain fails the requests still queued at close: they are redelivered.
func (g *InboxIngest) drain() {
	for {
		select {
		case r := <-g.in:
			r.done <- bus.Transient(ErrIngestClosed)
		default:
			return
		}
	}
}

// write stores one batch and answers each request.
func (g *InboxIngest) write(batch []*ingestRequest) {
	live := batch[:0:0]
	for _, r := range batch {
		if err := r.ctx.Err(); err != nil {
			// Its handler has given up waiting; the broker redelivers it.
			r.done <- bus.Transient(fmt.Errorf("ingest %s: %w", r.id, err))
			continue
		}
		live = append(live, r)
	}
	if len(live) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), g.cfg.StoreTimeout)
	defer cancel()
	results := g.store(ctx, live)
	for i, r := range live {
		r.done <- results[i]
	}
}

// store writes reqs in one statement (one transaction inline) and returns
// each one's outcome. If the database rejects the statement itself (not the
// connection), the requests are stored one by one, so that one message the
// checks let through cannot fail the others.
func (g *InboxIngest) store(ctx context.Context, reqs []*ingestRequest) []error {
	var (
		results []error
		err     error
	)
	if g.cfg.Inline == nil {
		results, err = g.storeOnly(ctx, reqs)
	} else {
		results, err = g.storeInline(ctx, reqs)
	}
	if err == nil {
		return results
	}
	var pgErr *pgconn.PgError
	if len(reqs) > 1 && errors.As(err, &pgErr) && ctx.Err() == nil {
		g.log.Warn("omnibus: inbox batch refused; storing its messages one by one", "messages", len(reqs), "error", err)
		results = make([]error, len(reqs))
		for i, r := range reqs {
			results[i] = g.store(ctx, []*ingestRequest{r})[0]
		}
		return results
	}
	results = make([]error, len(reqs))
	for i := range reqs {
		results[i] = storeError(err)
	}
	return results
}

// storeError classifies a failed insert (postgres.ClassifyError): a
// statement the database refuses for this message's data is permanent; the
// database unreachable or shutting down is transient; any other refusal is
// counted.
func storeError(err error) error { return postgres.ClassifyError(err) }

func (g *InboxIngest) checked(reqs []*ingestRequest) []*postgres.Checked {
	out := make([]*postgres.Checked, len(reqs))
	for i, r := range reqs {
		out[i] = r.checked
	}
	return out
}

func (g *InboxIngest) storeOnly(ctx context.Context, reqs []*ingestRequest) ([]error, error) {
	fresh, err := g.inbox.StoreChecked(ctx, g.pool, postgres.StoreOptions{Group: g.cfg.ConsumerGroup}, g.checked(reqs)...)
	if err != nil {
		return nil, err
	}
	for i, r := range reqs {
		if !fresh[i] {
			g.log.Debug("omnibus: duplicate message; already in the inbox", "event_id", r.id)
		}
	}
	return make([]error, len(reqs)), nil
}

// storeInline inserts the batch as completed rows, runs the handler of each
// new message inside a savepoint, and removes the rows of the messages whose
// handler failed, all in one transaction. A repeat of a message within the
// batch shares the outcome of its first occurrence.
func (g *InboxIngest) storeInline(ctx context.Context, reqs []*ingestRequest) ([]error, error) {
	tx, err := g.pool.Begin(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	fresh, err := g.inbox.StoreChecked(ctx, tx, postgres.StoreOptions{Group: g.cfg.ConsumerGroup, Completed: true}, g.checked(reqs)...)
	if err != nil {
		return nil, err
	}
	results := make([]error, len(reqs))
	first := make(map[string]int, len(reqs))
	var failed []*message.Message
	for i, r := range reqs {
		if j, seen := first[r.id]; seen {
			results[i] = results[j]
			continue
		}
		first[r.id] = i
		if !fresh[i] {
			g.log.Debug("omnibus: duplicate message; already handled", "event_id", r.id)
			continue
		}
		herr, txErr := g.runInline(ctx, tx, r)
		if txErr != nil {
			return nil, txErr
		}
		if herr != nil {
			results[i] = herr
			failed = append(failed, r.checked.Message())
		}
	}
	if err := g.inbox.Remove(ctx, tx, g.cfg.ConsumerGroup, failed...); err != nil {
		return nil, err
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("commit inbox batch: %w", err)
	}
	// A repeat of a failed message shares its error; every other repeat of
	// a message stored here is acked with it.
	for i, r := range reqs {
		if j := first[r.id]; j != i {
			results[i] = results[j]
		}
	}
	return results, nil
}

// runInline runs the inline handler of r inside a savepoint of tx. herr is
// the handler's outcome; txErr means tx itself is broken.
func (g *InboxIngest) runInline(ctx context.Context, tx pgx.Tx, r *ingestRequest) (herr, txErr error) {
	if _, err := tx.Exec(ctx, "SAVEPOINT omnibus_inline"); err != nil {
		return nil, fmt.Errorf("savepoint: %w", err)
	}
	// The handler gets a copy of the message, so that nothing it does races
	// with the broker's goroutine, which may stop waiting (timeout) and
	// settle the original.
	m := r.checked.Message().Copy()
	m.SetContext(postgres.WithTx(r.ctx, tx))
	herr = g.callInline(m)
	if herr == nil {
		_, err := tx.Exec(ctx, "RELEASE SAVEPOINT omnibus_inline")
		if err == nil {
			return nil, nil
		}
		// The handler left the transaction aborted (it swallowed a failed
		// statement): that is its failure, not the batch's.
		herr = fmt.Errorf("inline handler of %s left the transaction aborted: %w", r.id, err)
	}
	if _, err := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT omnibus_inline"); err != nil {
		return nil, fmt.Errorf("roll back to savepoint: %w", err)
	}
	return herr, nil
}

func (g *InboxIngest) callInline(m *message.Message) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("inline handler of %s panicked: %v\n%s", m.UUID, p, debug.Stack())
		}
	}()
	return g.cfg.Inline(m)
}
