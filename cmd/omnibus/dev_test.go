package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/internal/testenv"
	"github.com/omnibus-go/omnibus/transports/kafka"
)

// freePort returns a loopback port nobody listened on a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := l.Addr().(*net.TCPAddr).Port
	require.NoError(t, l.Close())
	return port
}

// startDevKafka runs `omnibus dev kafka args...` in process and returns its
// output (growing while it runs), a stop function that cancels its context
// and returns its result, and the environment line it printed.
func startDevKafka(t *testing.T, args ...string) (out *testenv.LogBuffer, stop func() result, envLine string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var stdout, stderr testenv.LogBuffer
	a := &app{stdout: &stdout, stderr: &stderr, lookupEnv: func(string) (string, bool) { return "", false }}
	done := make(chan int, 1)
	go func() { done <- a.run(ctx, append([]string{"dev", "kafka"}, args...)) }()
	stopped := false
	stop = func() result {
		t.Helper()
		cancel()
		select {
		case code := <-done:
			stopped = true
			return result{stdout.String(), stderr.String(), code}
		case <-time.After(30 * time.Second):
			t.Fatalf("omnibus dev kafka did not stop within 30s of its context ending; output:\n%s", stdout.String())
			return result{}
		}
	}
	t.Cleanup(func() {
		if !stopped {
			stop()
		}
	})

	envRE := regexp.MustCompile(`OMNIBUS_BROKER=kafka OMNIBUS_KAFKA_BROKERS=\S+`)
	deadline := time.Now().Add(30 * time.Second)
	for envLine == "" {
		select {
		case code := <-done:
			stopped = true
			t.Fatalf("omnibus dev kafka exited with %d before serving:\n%s%s", code, stdout.String(), stderr.String())
		case <-time.After(20 * time.Millisecond):
		}
		envLine = envRE.FindString(stdout.String())
		if envLine == "" && time.Now().After(deadline) {
			t.Fatalf("omnibus dev kafka printed no broker address within 30s:\n%s%s", stdout.String(), stderr.String())
		}
	}
	return &stdout, stop, envLine
}

// TestDevKafka_ServesOnThePortAndOmnibusRoundTripsThroughIt starts the
// command on a free port, points omnibus at it with exactly the variables
// it printed, publishes and consumes a message through the kafka broker,
// and stops it by cancelling its context: it exits 0 and frees the port.
func TestDevKafka_ServesOnThePortAndOmnibusRoundTripsThroughIt(t *testing.T) {
	t.Parallel()
	port := freePort(t)
	addr := "127.0.0.1:" + strconv.Itoa(port)
	topic := testenv.Name(t)
	out, stop, envLine := startDevKafka(t, "--port", strconv.Itoa(port), "--partitions", "2", "--seed-topics", topic)

	assert.Contains(t, out.String(), "listening on "+addr)
	assert.Equal(t, "OMNIBUS_BROKER=kafka OMNIBUS_KAFKA_BROKERS="+addr, envLine)
	assert.Contains(t, out.String(), "topics created: "+topic+" (2 partitions each)")

	// The printed line, as the environment of an omnibus process.
	env := map[string]string{}
	for _, kv := range strings.Fields(envLine) {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	var cfg bus.Config
	require.NoError(t, cfg.ApplyEnv(func(k string) (string, bool) { v, ok := env[k]; return v, ok }))
	require.Equal(t, kafka.Name, cfg.Broker)
	require.Equal(t, []string{addr}, kafka.Section(cfg).Brokers)

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	b, err := bus.OpenBroker(ctx, cfg)
	require.NoError(t, err, "open omnibus's kafka broker against the dev Kafka")
	defer func() { _ = b.Close() }()
	require.NoError(t, b.WaitBroker(ctx), "connect to the dev Kafka at %s", addr)

	sent := message.NewMessage(watermill.NewUUID(), []byte(`{"order":42}`))
	bus.SetPartitionKey(sent, "order-42")
	require.NoError(t, b.Publisher().Publish(topic, sent), "publish to the dev Kafka")

	sub, err := b.Subscriber("dev-kafka-test")
	require.NoError(t, err)
	defer func() { _ = sub.Close() }()
	msgs, err := sub.Subscribe(ctx, topic)
	require.NoError(t, err)
	select {
	case got := <-msgs:
		require.NotNil(t, got, "subscription closed before a message arrived")
		assert.Equal(t, sent.UUID, got.UUID)
		assert.Equal(t, string(sent.Payload), string(got.Payload))
		assert.Equal(t, "order-42", bus.PartitionKey(got))
		got.Ack()
	case <-ctx.Done():
		t.Fatal("the published message was not consumed from the dev Kafka within 60s")
	}
	require.NoError(t, sub.Close())
	require.NoError(t, b.Close())

	res := stop()
	assert.Equal(t, exitOK, res.code, "stderr: %s", res.stderr)
	assert.Contains(t, res.stdout, "stopping the in-process Kafka")
	l, err := net.Listen("tcp", addr)
	require.NoError(t, err, "the port is still taken after the dev Kafka stopped")
	_ = l.Close()
}

func TestDevKafka_BadFlagsAreUsageErrorsNamingTheFlag(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"negative port", []string{"--port", "-1"}, "--port: -1 is not a TCP port"},
		{"port too large", []string{"--port", "65536"}, "--port: 65536 is not a TCP port"},
		{"no partitions", []string{"--partitions", "0"}, "--partitions: must be at least 1, got 0"},
		{"empty seed topic", []string{"--port", "0", "--seed-topics", "orders,,refunds"}, "--seed-topics: topic 2 is empty"},
		{"argument", []string{"extra"}, `unknown command "extra"`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			res := cli(t, context.Background(), append([]string{"dev", "kafka"}, c.args...)...)
			assert.Equal(t, exitUsage, res.code)
			assert.Contains(t, res.stderr, c.want)
			assert.Empty(t, res.stdout, "nothing may be served on bad flags")
		})
	}
}

// TestDevKafka_PortInUseFailsNamingThePort: a port another process holds is
// a run-time failure (exit 1) that says which port.
func TestDevKafka_PortInUseFailsNamingThePort(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)

	res := cli(t, context.Background(), "dev", "kafka", "--port", port)
	assert.Equal(t, exitFailure, res.code)
	assert.Contains(t, res.stderr, "start in-process Kafka on 127.0.0.1:"+port)
}

// TestDockerCompose_DeclaresTheServicesOnTheirLoopbackPorts checks the
// repository's docker-compose.yml parses and declares what docs/operations.md
// says: PostgreSQL 15 with trust auth, Redis 7, a 3-node Redis Cluster and a
// single-node KRaft Kafka advertised on 127.0.0.1:9092, RabbitMQ and NATS
// with JetStream, every port published
// on 127.0.0.1 only. (Docker is not run here; this is the file's contract.)
func TestDockerCompose_DeclaresTheServicesOnTheirLoopbackPorts(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile(filepath.Join("..", "..", "docker-compose.yml"))
	require.NoError(t, err)
	var compose struct {
		Services map[string]struct {
			Image       string            `yaml:"image"`
			Environment map[string]string `yaml:"environment"`
			Ports       []string          `yaml:"ports"`
			Command     any               `yaml:"command"`
		} `yaml:"services"`
	}
	require.NoError(t, yaml.Unmarshal(data, &compose), "docker-compose.yml is not valid YAML")

	cases := []struct {
		service string
		image   string
		ports   []string
		env     map[string]string
	}{
		{"postgres", "postgres:15", []string{"127.0.0.1:5432:5432"},
			map[string]string{"POSTGRES_USER": "postgres", "POSTGRES_HOST_AUTH_METHOD": "trust"}},
		{"redis", "redis:7", []string{"127.0.0.1:6379:6379"}, nil},
		{"redis-cluster", "redis:7", []string{"127.0.0.1:7001:7001", "127.0.0.1:7002:7002", "127.0.0.1:7003:7003"}, nil},
		{"kafka", "apache/kafka:", []string{"127.0.0.1:9092:9092"}, map[string]string{
			"KAFKA_PROCESS_ROLES":        "broker,controller", // KRaft, no ZooKeeper
			"KAFKA_ADVERTISED_LISTENERS": "PLAINTEXT://127.0.0.1:9092",
		}},
		{"rabbitmq", "rabbitmq:3", []string{"127.0.0.1:5672:5672"}, nil},
		{"nats", "nats:2", []string{"127.0.0.1:4222:4222"}, nil},
	}
	assert.Len(t, compose.Services, len(cases), "services declared")
	for _, c := range cases {
		s, ok := compose.Services[c.service]
		if !assert.True(t, ok, "service %q missing", c.service) {
			continue
		}
		assert.True(t, strings.HasPrefix(s.Image, c.image), "service %q image %q, want %s…", c.service, s.Image, c.image)
		assert.Equal(t, c.ports, s.Ports, "ports of service %q", c.service)
		for k, v := range c.env {
			assert.Equal(t, v, s.Environment[k], "service %q environment %s", c.service, k)
		}
	}
	assert.Contains(t, fmt.Sprint(compose.Services["redis-cluster"].Command),
		"redis-cli --cluster create 127.0.0.1:7001 127.0.0.1:7002 127.0.0.1:7003")
	assert.Contains(t, fmt.Sprint(compose.Services["nats"].Command), "-js", "NATS with JetStream")
}
