package postgres

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestSubscriber_OneKeyBacklogDrainsInOrderWhileWritersAdd drains a backlog
// of one key run after run (the Subscriber keeps the key between runs,
// engine.next) while writers keep adding rows to it, some in transactions
// that stay open for a while, and one relay nacks a row now and then. Every
// row is delivered, first deliveries in id order, each row acked once.
func TestSubscriber_OneKeyBacklogDrainsInOrderWhileWritersAdd(t *testing.T) {
	t.Parallel()
	pool, ob := newOutbox(t)
	const (
		backlog = 1500
		writers = 4
		perW    = 100
	)
	msgs := make([]*message.Message, backlog)
	for i := range msgs {
		msgs[i] = event("k", "b"+strconv.Itoa(i))
	}
	enqueue(t, pool, ob, "t", msgs...)

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perW {
				tx, err := pool.Begin(ctx)
				if !assert.NoError(t, err) {
					return
				}
				assert.NoError(t, ob.Enqueue(ctx, tx, "t", event("k", fmt.Sprintf("w%d-%d", w, i))))
				if i%10 == 0 {
					time.Sleep(30 * time.Millisecond) // in flight: holds the key back
				}
				assert.NoError(t, tx.Commit(ctx))
			}
		}()
	}

	total := backlog + writers*perW
	subs := make([]*Subscriber, 2)
	chans := make([]<-chan *message.Message, len(subs))
	for i := range subs {
		s, err := NewSubscriber(pool, SubscriberConfig{Table: ob.Table(), WorkerID: "relay-" + strconv.Itoa(i),
			PollInterval: 20 * time.Millisecond}, nil)
		require.NoError(t, err)
		defer s.Close()
		chans[i], err = s.Subscribe(ctx, AllTopics)
		require.NoError(t, err)
	}

	var (
		mu    sync.Mutex
		first []string // payloads in order of first delivery
		seen  = map[string]bool{}
		acks  = map[string]int{}
	)
	done := make(chan struct{})
	for i, ch := range chans {
		go func() {
			n := 0
			for m := range ch {
				p := string(m.Payload)
				mu.Lock()
				if !seen[p] {
					seen[p] = true
					first = append(first, p)
				}
				n++
				nack := i == 1 && n%97 == 0
				if !nack {
					acks[p]++
				}
				finished := len(acks) == total
				mu.Unlock()
				if nack {
					m.Nack()
					continue
				}
				m.Ack()
				if finished {
					close(done)
				}
			}
		}()
	}
	wg.Wait()
	select {
	case <-done:
	case <-ctx.Done():
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("only %d of %d rows acked", len(acks), total)
	}

	ids := idsByPayload(t, pool, ob)
	mu.Lock()
	defer mu.Unlock()
	for p, n := range acks {
		assert.Equal(t, 1, n, "row %s acked %d times", p, n)
	}
	for i := 1; i < len(first); i++ {
		if ids[first[i]] < ids[first[i-1]] {
			t.Fatalf("first deliveries out of id order: %s (id %d) after %s (id %d)",
				first[i], ids[first[i]], first[i-1], ids[first[i-1]])
		}
	}
}

// idsByPayload maps each row's payload to its id.
func idsByPayload(t *testing.T, pool *pgxpool.Pool, ob *Outbox) map[string]int64 {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT convert_from(payload, 'UTF8'), id FROM `+ob.q.table.quoted())
	require.NoError(t, err)
	ids := map[string]int64{}
	for rows.Next() {
		var (
			p  string
			id int64
		)
		require.NoError(t, rows.Scan(&p, &id))
		ids[p] = id
	}
	require.NoError(t, rows.Err())
	return ids
}

// TestNext_TakesTheRunAfterOnlyWhileTheKeyIsHeld drives engine.next by
// hand: it hands out the rows after the last run while the worker holds the
// key, and nothing once another worker has taken the key over (its lease
// ran out), even though the first worker still asks for it.
func TestNext_TakesTheRunAfterOnlyWhileTheKeyIsHeld(t *testing.T) {
	t.Parallel()
	pool, ob := newOutbox(t)
	ctx := context.Background()
	msgs := make([]*message.Message, 40)
	for i := range msgs {
		msgs[i] = event("k", "r"+strconv.Itoa(i))
	}
	enqueue(t, pool, ob, "t", msgs...)
	a, b := testEngine(pool, ob, "a", 16), testEngine(pool, ob, "b", 16)

	first, err := a.fetch(ctx, AllTopics, 10, 10)
	require.NoError(t, err)
	require.Len(t, first.units, 1)
	run := first.units[0]
	require.Len(t, run.rows, 16)

	next, err := a.next(ctx, *run.lane, run.rows[15].id, nil)
	require.NoError(t, err)
	require.Len(t, next.units, 1, "the key is still a's: its next run")
	assert.Equal(t, payloads(msgsRows(t, 16, 32)), payloads(next.units[0].rows), "the 16 rows after the first run, in order")

	// a stops (as if SIGSTOPped) and its leases run out; b takes the key.
	_, err = pool.Exec(ctx, `UPDATE `+ob.q.table.quoted()+` SET locked_until = now() - interval '1s';
		UPDATE `+ob.q.table.derived("_lanes").quoted()+` SET locked_until = now() - interval '1s'`)
	require.NoError(t, err)
	taken, err := b.fetch(ctx, AllTopics, 10, 10)
	require.NoError(t, err)
	require.Len(t, taken.units, 1, "b took the key")

	last := next.units[0].rows[15].id
	late, err := a.next(ctx, *run.lane, last, nil)
	require.NoError(t, err)
	assert.Empty(t, late.units, "a no longer holds the key: next hands out nothing")
}

// msgsRows names the payloads r<from>..r<to-1> as rows, for comparing runs.
func msgsRows(t *testing.T, from, to int) []row {
	t.Helper()
	var rs []row
	for i := from; i < to; i++ {
		rs = append(rs, row{payload: []byte("r" + strconv.Itoa(i))})
	}
	return rs
}
