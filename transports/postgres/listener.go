package postgres

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// listeners shares one LISTEN connection per pool: every Subscriber built on
// the same pool listens through it instead of holding a connection each.
var listeners = struct {
	sync.Mutex
	m map[*pgxpool.Pool]*listener
}{m: map[*pgxpool.Pool]*listener{}}

// listener owns one hijacked connection of its pool and fans notifications
// out to subscriptions. Signals are coalesced: a subscriber that has not
// consumed the last one does not get another queued.
type listener struct {
	pool *pgxpool.Pool
	log  *slog.Logger

	mu      sync.Mutex
	subs    map[string]map[*listenSub]struct{}
	changed chan struct{}

	cancel context.CancelFunc
	done   chan struct{}
}

type listenSub struct {
	l       *listener
	channel string
	c       chan struct{}
	once    sync.Once
}

// listen registers interest in channel on pool's shared listener.
func listen(pool *pgxpool.Pool, channel string, log *slog.Logger) *listenSub {
	listeners.Lock()
	l, ok := listeners.m[pool]
	if !ok {
		ctx, cancel := context.WithCancel(context.Background())
		l = &listener{
			pool: pool, log: log,
			subs:    map[string]map[*listenSub]struct{}{},
			changed: make(chan struct{}, 1),
			cancel:  cancel,
			done:    make(chan struct{}),
		}
		listeners.m[pool] = l
		go l.run(ctx)
	}
	s := &listenSub{l: l, channel: channel, c: make(chan struct{}, 1)}
	l.mu.Lock()
	if l.subs[channel] == nil {
		l.subs[channel] = map[*listenSub]struct{}{}
	}
	l.subs[channel][s] = struct{}{}
	l.mu.Unlock()
	listeners.Unlock()
	signal(l.changed)
	return s
}

// C delivers a signal after a notification on the channel (or after the
// listening connection was re-established, when notifications may have been
// missed).
func (s *listenSub) C() <-chan struct{} { return s.c }

// Close unregisters s; the last one out stops the listener and gives its
// connection back.
func (s *listenSub) Close() {
	s.once.Do(func() {
		listeners.Lock()
		defer listeners.Unlock()
		l := s.l
		l.mu.Lock()
		delete(l.subs[s.channel], s)
		if len(l.subs[s.channel]) == 0 {
			delete(l.subs, s.channel)
		}
		empty := len(l.subs) == 0
		l.mu.Unlock()
		if !empty {
			signal(l.changed)
			return
		}
		delete(listeners.m, l.pool)
		l.cancel()
		<-l.done
	})
}

func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

func (l *listener) wantChannels() map[string]bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	want := make(map[string]bool, len(l.subs))
	for ch := range l.subs {
		want[ch] = true
	}
	return want
}

func (l *listener) fanOut(channel string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for ch, subs := range l.subs {
		if channel != "" && ch != channel {
			continue
		}
		for s := range subs {
			signal(s.c)
		}
	}
}

func (l *listener) run(ctx context.Context) {
	defer close(l.done)
	for ctx.Err() == nil {
		err := l.session(ctx)
		if ctx.Err() != nil {
			return
		}
		l.log.Warn("omnibus: LISTEN connection lost; polling until it is back", "error", err)
		// Anything may have been missed while the connection was down.
		l.fanOut("")
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}

// session holds one connection until it fails or ctx ends.
func (l *listener) session(ctx context.Context) error {
	pc, err := l.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	conn := pc.Hijack()
	defer func() {
		closeCtx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = conn.Close(closeCtx)
		cancel()
	}()
	listening := map[string]bool{}
	for {
		want := l.wantChannels()
		for ch := range want {
			if !listening[ch] {
				if _, err := conn.Exec(ctx, channelSQL("Listen", ch)); err != nil {
					return err
				}
				listening[ch] = true
				// Work committed before LISTEN took effect was not announced.
				l.fanOut(ch)
			}
		}
		for ch := range listening {
			if !want[ch] {
				if _, err := conn.Exec(ctx, channelSQL("Unlisten", ch)); err != nil {
					return err
				}
				delete(listening, ch)
			}
		}
		waitCtx, cancel := context.WithCancel(ctx)
		go func() {
			select {
			case <-l.changed:
				cancel()
			case <-waitCtx.Done():
			}
		}()
		n, err := conn.WaitForNotification(waitCtx)
		changed := waitCtx.Err() != nil
		cancel()
		switch {
		case err == nil:
			l.fanOut(n.Channel)
		case ctx.Err() != nil:
			return ctx.Err()
		case changed && (errors.Is(err, context.Canceled) || isTimeout(err)):
			// Woken to change the set of channels; the connection is fine.
		default:
			return err
		}
	}
}

func isTimeout(err error) bool {
	var t interface{ Timeout() bool }
	return errors.As(err, &t) && t.Timeout()
}
