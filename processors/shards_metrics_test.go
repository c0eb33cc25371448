package processors_test

import (
	"context"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/processors"
)

type shardSource map[string][]bus.ShardStatus

func (s shardSource) ShardStatus(_ context.Context, topic, _ string) ([]bus.ShardStatus, error) {
	return s[topic], nil
}

// Each shard of a sharded topic is exported with its owner, lag, pending
// messages and lease count; a topic that is not sharded exports nothing.
func TestShardCollector_ExportsEachShard(t *testing.T) {
	reg := prometheus.NewRegistry()
	src := shardSource{"orders": {
		{Shard: 0, Owner: "host-a", Lag: 3, Pending: 1, Leases: 2},
		{Shard: 1, Owner: "", Lag: -1, Pending: 0, Leases: 5},
	}}
	_, err := processors.NewShardCollector(reg, src, "billing", []string{"orders", "plain"}, 0)
	require.NoError(t, err)
	want := `
# HELP omnibus_shard_lag_messages Messages of the shard not yet handed to the group (-1 when the broker cannot tell).
# TYPE omnibus_shard_lag_messages gauge
omnibus_shard_lag_messages{consumer_group="billing",shard="0",topic="orders"} 3
omnibus_shard_lag_messages{consumer_group="billing",shard="1",topic="orders"} -1
# HELP omnibus_shard_leases_total Times a consumer of the group took the shard's lease: rebalances, takeovers and restarts.
# TYPE omnibus_shard_leases_total counter
omnibus_shard_leases_total{consumer_group="billing",shard="0",topic="orders"} 2
omnibus_shard_leases_total{consumer_group="billing",shard="1",topic="orders"} 5
# HELP omnibus_shard_owner 1 for the consumer holding the shard's lease (owner="" when none does).
# TYPE omnibus_shard_owner gauge
omnibus_shard_owner{consumer_group="billing",owner="",shard="1",topic="orders"} 1
omnibus_shard_owner{consumer_group="billing",owner="host-a",shard="0",topic="orders"} 1
# HELP omnibus_shard_pending_messages Messages of the shard handed out and not yet acknowledged.
# TYPE omnibus_shard_pending_messages gauge
omnibus_shard_pending_messages{consumer_group="billing",shard="0",topic="orders"} 1
omnibus_shard_pending_messages{consumer_group="billing",shard="1",topic="orders"} 0
`
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(want)))
}
