//go:build soak

package main

import (
	"os"
	"testing"
	"time"
)

// soakDuration is OMNIBUS_SOAK_DURATION (default 3m).
func soakDuration(t *testing.T) time.Duration {
	d := 3 * time.Minute
	if s := os.Getenv("OMNIBUS_SOAK_DURATION"); s != "" {
		var err error
		if d, err = time.ParseDuration(s); err != nil {
			t.Fatalf("OMNIBUS_SOAK_DURATION=%q: %v", s, err)
		}
	}
	return d
}

// The Redis scale-out stand for OMNIBUS_SOAK_DURATION: about 250 messages a
// second over 500 keys, with kills every few seconds and one pause of 4
// leases.
func TestSoak_ShardedRedisKeepsKeyOrderAcrossKillsAndAPause(t *testing.T) {
	d := soakDuration(t)
	runShardStand(t, shardStand{duration: d, messages: int(d.Seconds() * 250), keys: 500, lease: 2 * time.Second})
}

// The same stand on RabbitMQ.
func TestSoak_ShardedRabbitMQKeepsKeyOrderAcrossKillsAndAPause(t *testing.T) {
	d := soakDuration(t)
	runShardStand(t, shardStand{broker: "rabbitmq", duration: d, messages: int(d.Seconds() * 250), keys: 500, lease: 2 * time.Second})
}

// The same stand on NATS JetStream.
func TestSoak_ShardedNATSKeepsKeyOrderAcrossKillsAndAPause(t *testing.T) {
	d := soakDuration(t)
	runShardStand(t, shardStand{broker: "nats", duration: d, messages: int(d.Seconds() * 250), keys: 500, lease: 2 * time.Second})
}
