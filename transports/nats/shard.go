package nats

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/internal/handout"
)

// shard reads one shard subject for its group while this consumer holds
// the shard's lease. It reads from the recorded floor with an ordered
// consumer (no acknowledgements kept by JetStream: the group's position is
// the floor in the lease record, written only under the lease), hands out
// each key's messages one at a time and advances the floor over the prefix
// of settled messages.
type shard struct {
	g       *group
	i       int
	key     string
	subject string
	logger  *slog.Logger

	// soft ends reading and handing out; hard ends waiting for handlers.
	soft, hard         context.Context
	stopSoft, stopHard context.CancelFunc
	done               chan struct{}

	// leaseUntil is when this consumer stops handing out: the time its last
	// successful lease write was sent, plus ShardLease. A process paused
	// past it hands nothing out when it wakes: another consumer may have
	// the shard by then.
	leaseUntil atomic.Int64

	// taken is the record as the lease was taken: where reading starts.
	taken record
	// Used by keep (and by run once keep has ended).
	rec record
	rev uint64

	sem     chan struct{} // bounds the unsettled messages read (Prefetch)
	handing sync.WaitGroup

	mu     sync.Mutex
	floor  uint64
	window []*entry            // read, in stream order, from the first unsettled one
	keys   map[string][]*entry // keys with a message out, and the ones waiting behind it
	lost   bool
}

// entry is one message read from the shard.
type entry struct {
	seq      uint64
	msg      *message.Message
	raw      jetstream.Msg
	key      string
	attempts int
	first    time.Time
	settled  bool
}

func (g *group) start(i int, key string, rec record, rev uint64, sent time.Time) *shard {
	cfg := &g.s.cfg
	sh := &shard{
		g: g, i: i, key: key, subject: shardSubject(g.base, i),
		logger: g.logger.With("shard", i, "lease", rec.Leases),
		done:   make(chan struct{}),
		taken:  rec, rec: rec, rev: rev, floor: rec.Floor,
		sem:  make(chan struct{}, cfg.Prefetch),
		keys: map[string][]*entry{},
	}
	sh.soft, sh.stopSoft = context.WithCancel(g.ctx)
	sh.hard, sh.stopHard = context.WithCancel(context.WithoutCancel(g.ctx))
	sh.leaseUntil.Store(sent.Add(cfg.ShardLease).UnixNano())
	g.s.stats.taken.Add(1)
	sh.logger.Info("took a shard", "from", rec.Floor+1)
	go sh.run()
	return sh
}

func (sh *shard) run() {
	defer close(sh.done)
	var keeping sync.WaitGroup
	keeping.Go(sh.keep)
	if err := sh.read(); err != nil && sh.soft.Err() == nil {
		sh.logger.Warn("reading the shard failed; giving it back", "error", err)
	}
	sh.stopSoft()
	// Let what was handed out be settled, for a while.
	drained := make(chan struct{})
	go func() { sh.handing.Wait(); close(drained) }()
	select {
	case <-drained:
	case <-time.After(sh.g.s.cfg.ShardLease / 2):
	case <-sh.hard.Done():
	}
	sh.stopHard()
	<-drained
	keeping.Wait()

	sh.mu.Lock()
	lost := sh.lost
	rec := sh.rec
	if sh.floor != rec.Floor {
		rec.Floor, rec.Stuck = sh.floor, 0
	}
	sh.mu.Unlock()
	if lost {
		return
	}
	rec.Owner = ""
	ctx, cancel := context.WithTimeout(context.Background(), sh.g.s.cfg.Timeout)
	defer cancel()
	if _, err := sh.g.kv.Update(ctx, sh.key, rec.bytes(), sh.rev); err != nil {
		sh.logger.Warn("giving back a shard lease failed; it lapses on its own", "error", err)
		return
	}
	sh.logger.Info("gave back a shard", "floor", rec.Floor)
}

// keep renews the lease and records the floor as it advances, until hard
// ends; a lease found taken ends the shard without writing anything more.
func (sh *shard) keep() {
	cfg := &sh.g.s.cfg
	t := time.NewTicker(min(200*time.Millisecond, cfg.ShardLease/8))
	defer t.Stop()
	renewed := time.Now()
	for {
		select {
		case <-t.C:
		case <-sh.hard.Done():
			return
		}
		sh.mu.Lock()
		floor := sh.floor
		sh.mu.Unlock()
		if floor == sh.rec.Floor && time.Since(renewed) < cfg.ShardLease/4 {
			continue
		}
		rec := sh.rec
		if floor != rec.Floor {
			rec.Floor, rec.Stuck = floor, 0
		}
		sent := time.Now()
		ctx, cancel := context.WithTimeout(sh.hard, cfg.ShardLease/4)
		rev, err := sh.g.kv.Update(ctx, sh.key, rec.bytes(), sh.rev)
		cancel()
		switch {
		case err == nil:
			sh.rec, sh.rev, renewed = rec, rev, sent
			sh.leaseUntil.Store(sent.Add(cfg.ShardLease).UnixNano())
		case errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyNotFound):
			sh.lose("another consumer holds its lease")
			return
		case sh.hard.Err() != nil:
			return
		case time.Now().UnixNano() >= sh.leaseUntil.Load():
			sh.lose("its lease lapsed before it could be renewed: " + err.Error())
			return
		default:
			sh.logger.Warn("renewing a shard lease failed; will retry", "error", err)
		}
	}
}

// lose ends the shard at once: what it read and did not settle is read
// again by the shard's next owner.
func (sh *shard) lose(why string) {
	sh.mu.Lock()
	already := sh.lost
	sh.lost = true
	sh.mu.Unlock()
	if already {
		return
	}
	sh.g.s.stats.lost.Add(1)
	sh.logger.Warn("lost a shard: " + why + "; its next owner hands out what this consumer had not settled")
	sh.stopSoft()
	sh.stopHard()
}

// read reads the shard from the floor until soft ends or reading fails.
func (sh *shard) read() error {
	cfg := &sh.g.s.cfg
	occ := jetstream.OrderedConsumerConfig{FilterSubjects: []string{sh.subject}, DeliverPolicy: jetstream.DeliverAllPolicy}
	if sh.taken.Floor > 0 {
		occ.DeliverPolicy, occ.OptStartSeq = jetstream.DeliverByStartSequencePolicy, sh.taken.Floor+1
	}
	cons, err := sh.g.js.OrderedConsumer(sh.soft, sh.g.stream, occ)
	if err != nil {
		return classify(err)
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(min(cfg.Prefetch, 512)))
	if err != nil {
		return classify(err)
	}
	defer it.Stop()
	stop := context.AfterFunc(sh.soft, it.Stop)
	defer stop()
	stuck := sh.taken.Stuck
	for {
		select {
		case sh.sem <- struct{}{}:
		case <-sh.soft.Done():
			return nil
		}
		m, err := it.Next()
		if err != nil {
			<-sh.sem
			if sh.soft.Err() != nil || errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				return nil
			}
			return classify(err)
		}
		md, err := m.Metadata()
		if err != nil {
			<-sh.sem
			return err
		}
		e := &entry{seq: md.Sequence.Stream, raw: m, attempts: stuck}
		stuck = 0 // only the first message after the floor can be what killed its owners
		sh.mu.Lock()
		sh.window = append(sh.window, e)
		sh.mu.Unlock()
		msg, err := decode(m)
		if err != nil {
			sh.handing.Go(func() { sh.deadLetter(e, bus.DeadLetterReasonUndecodable, err.Error(), bus.ClassPermanent) })
			continue
		}
		e.msg, e.key = msg, bus.PartitionKey(msg)
		if e.key != "" {
			sh.mu.Lock()
			q, busy := sh.keys[e.key]
			sh.keys[e.key] = append(q, e)
			sh.mu.Unlock()
			if busy {
				continue // handed out when the one before it is settled
			}
		}
		sh.handing.Go(func() { sh.handle(e) })
	}
}

// settle marks e settled and moves the floor over the settled prefix.
func (sh *shard) settle(e *entry) {
	sh.mu.Lock()
	e.settled, e.msg, e.raw = true, nil, nil
	n := 0
	for n < len(sh.window) && sh.window[n].settled {
		sh.floor = sh.window[n].seq
		n++
	}
	sh.window = sh.window[n:]
	sh.mu.Unlock()
	<-sh.sem
}

// handle hands e out until it is settled or the shard stops, then does the
// same with the entries of its key that wait behind it.
func (sh *shard) handle(e *entry) {
	for e != nil && sh.soft.Err() == nil {
		for sh.handOut(e) {
		}
		if !e.settled {
			return
		}
		e = sh.next(e)
	}
}

// next forgets done, the head of its key, and returns the entry behind it.
func (sh *shard) next(done *entry) *entry {
	if done.key == "" {
		return nil
	}
	sh.mu.Lock()
	defer sh.mu.Unlock()
	q := sh.keys[done.key][1:]
	if len(q) == 0 {
		delete(sh.keys, done.key)
		return nil
	}
	sh.keys[done.key] = q
	return q[0]
}

// handOut delivers e once; it returns true when e is due again.
func (sh *shard) handOut(e *entry) (again bool) {
	g := sh.g
	now := time.Now()
	if e.first.IsZero() {
		e.first = now
	}
	msg := e.msg.Copy() // a message is acked or nacked once
	ctx, cancel := context.WithCancel(context.WithoutCancel(sh.hard))
	defer cancel()
	ctx = bus.WithDelivery(ctx, bus.Delivery{
		Attempts:         e.attempts,
		FirstDeliveredAt: e.first,
		DeliveredAt:      now,
		Source:           sh.subject,
		Topic:            g.topic,
		ID:               strconv.FormatUint(e.seq, 10),
		DeadLetter:       deadLetterSubject(g.base, g.s.cfg.ConsumerGroup),
	})
	msg.SetContext(ctx)
	if !sh.send(msg) {
		if sh.soft.Err() == nil {
			sh.lose("its lease lapsed before it could be renewed")
		}
		return false
	}
	g.s.stats.delivered.Add(1)
	select {
	case <-msg.Acked():
		g.s.stats.acked.Add(1)
		sh.settle(e)
		return false
	case <-msg.Nacked():
		g.s.stats.nacked.Add(1)
		r := bus.RedeliveryOf(ctx, g.s.cfg.NackDelay)
		if r.GiveUp {
			sh.deadLetter(e, bus.DeadLetterReasonGaveUp, r.Settlement.Error, r.Settlement.Class)
			return false
		}
		if r.Counted {
			e.attempts++
		}
		select {
		case <-time.After(time.Until(r.Due)):
			return true
		case <-sh.soft.Done():
			return false
		}
	case <-sh.hard.Done():
		return false
	}
}

// send hands msg to the consumer and reports whether it did: not once soft
// ends, nor once the lease has lapsed, before or while msg waits for the
// consumer to take it (a process paused past its lease hands out nothing
// when it wakes, whether or not keep has run since).
func (sh *shard) send(msg *message.Message) bool {
	var t handout.Timer
	left := func() time.Duration { return time.Duration(sh.leaseUntil.Load() - time.Now().UnixNano()) }
	return handout.Send(sh.g.out, msg, left, sh.soft.Done(), nil, &t)
}

// KeyDeadLetterMessageID is the header of a dead letter that holds the
// message's UUID (its Nats-Msg-Id when published): the dead letter's own
// Nats-Msg-Id names the group and stream position, so that each group's
// copy is stored once.
const KeyDeadLetterMessageID = bus.DeadLetterPrefix + "message_id"

// deadLetter stores e on the group's dead-letter subject with the reason
// and settles it; while JetStream refuses the copy, e stays unsettled and
// the shard is given back, so it is read again.
func (sh *shard) deadLetter(e *entry, reason, errText string, class bus.Class) {
	g := sh.g
	group := g.s.cfg.ConsumerGroup
	subject := deadLetterSubject(g.base, group)
	m := natsgo.NewMsg(subject)
	m.Data = e.raw.Data()
	id := e.raw.Headers().Get(jetstream.MsgIDHeader)
	for k, vs := range e.raw.Headers() {
		nats := len(k) >= 5 && strings.EqualFold(k[:5], "Nats-")
		if !nats && !strings.HasPrefix(k, bus.DeadLetterPrefix) {
			m.Header[k] = vs
		}
	}
	m.Header.Set(bus.KeyDeadLetterReason, reason)
	m.Header.Set(bus.KeyDeadLetterError, errText)
	m.Header.Set(bus.KeyDeadLetterClass, class.String())
	m.Header.Set(bus.KeyDeadLetterAttempts, strconv.Itoa(e.attempts+1))
	m.Header.Set(bus.KeyDeadLetterTopic, g.topic)
	m.Header.Set(bus.KeyDeadLetterGroup, group)
	m.Header.Set(bus.KeyDeadLetterAt, time.Now().UTC().Format(time.RFC3339Nano))
	m.Header.Set(KeyDeadLetterMessageID, id)
	// One copy per group and stream position, however often it is retried.
	m.Header.Set(jetstream.MsgIDHeader, group+"/"+g.stream+"/"+strconv.FormatUint(e.seq, 10))
	ctx, cancel := context.WithTimeout(sh.hard, g.s.cfg.Timeout)
	defer cancel()
	if _, err := g.js.PublishMsg(ctx, m, jetstream.WithExpectStream(deadLetterStream(g.stream))); err != nil {
		sh.logger.Warn("could not dead-letter a message; giving the shard back so that it is read again", "message_id", id, "subject", subject, "error", err)
		sh.stopSoft()
		return
	}
	g.s.stats.deadLettered.Add(1)
	sh.logger.Warn("message dead-lettered", "message_id", id, "subject", subject, "reason", reason, "error", errText)
	sh.settle(e)
}
