package postgres

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omnibus-go/omnibus/internal/testenv"
)

// sweepTimes records when each lane sweep statement (sql) started and ended.
type sweepTimes struct {
	sql  string
	mu   sync.Mutex
	runs [][2]time.Time
}

type sweepStartKey struct{}

func (s *sweepTimes) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if d.SQL != s.sql {
		return ctx
	}
	return context.WithValue(ctx, sweepStartKey{}, time.Now())
}

func (s *sweepTimes) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	if start, ok := ctx.Value(sweepStartKey{}).(time.Time); ok {
		s.mu.Lock()
		s.runs = append(s.runs, [2]time.Time{start, time.Now()})
		s.mu.Unlock()
	}
}

// TestSubscriber_ASlowLaneSweepWaitsInProportionToWhatItTook: the lane sweep
// reads the index entry of every pending row, and behind a pinned xmin
// horizon of every version of a row that was ever pending; on the pinned
// stand it took 954 ms at minute 4, more every minute, once a minute, and
// read the whole table through the buffer cache. A sweep waits its interval
// or sweepCostFactor times what the last one took, whichever is longer.
func TestSubscriber_ASlowLaneSweepWaitsInProportionToWhatItTook(t *testing.T) {
	t.Parallel()
	pool, ob := newOutbox(t)
	ctx := context.Background()
	_, err := pool.Exec(ctx, `INSERT INTO `+ob.q.table.quoted()+` (event_id, topic, partition_key, payload)
		SELECT gen_random_uuid(), 't', 'k' || (g % 1000), '\x00' FROM generate_series(1, 50000) g`)
	require.NoError(t, err)

	sweeps := &sweepTimes{sql: ob.q.sweep}
	relayPool := testenv.NewTracedPostgresPool(t, 4, sweeps)
	s, err := NewSubscriber(relayPool, SubscriberConfig{Table: ob.Table(), SweepInterval: 20 * time.Millisecond, DisableListen: true}, nil)
	require.NoError(t, err)
	time.Sleep(3 * time.Second)
	require.NoError(t, s.Close())

	sweeps.mu.Lock()
	defer sweeps.mu.Unlock()
	require.NotEmpty(t, sweeps.runs, "the relay swept its lanes")
	for i := 1; i < len(sweeps.runs); i++ {
		took := sweeps.runs[i-1][1].Sub(sweeps.runs[i-1][0])
		gap := sweeps.runs[i][0].Sub(sweeps.runs[i-1][1])
		assert.GreaterOrEqual(t, gap, sweepCostFactor*took,
			"sweep %d came %v after one that took %v", i+1, gap.Round(time.Millisecond), took.Round(time.Millisecond))
	}
}
