//go:build soak

package postgres

import (
	"testing"
	"time"
)

// TestSoak_MultiKeyTransactionsNeverDeadlock is the deadlock stand of
// TestEnqueue_MultiKeyTransactionsNeverDeadlock at ten times its size, with
// relays of the default batch size.
func TestSoak_MultiKeyTransactionsNeverDeadlock(t *testing.T) {
	t.Parallel()
	pool, ob := newOutbox(t)
	interleavedWritersStand(t, pool, ob, standConfig{
		writers: 8, txs: 100_000 / 8, keys: 20, newKeys: true, relays: 2, minKeys: 2, maxKeys: 5,
		// The default batch: with 10 the relays fell behind the writers,
		// and on this server (autovacuum off, so a lanes table of dead
		// versions that is never analysed) drained 130 events/s.
		timeout: 30 * time.Minute, batch: DefaultBatchSize,
	})
}
