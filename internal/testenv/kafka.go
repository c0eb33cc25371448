package testenv

import (
	"errors"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kfake"
)

// KafkaBrokersEnv names the variable that points tests at a real Kafka
// cluster: comma-separated host:port pairs. Unset, tests use one in-process
// kfake cluster per test binary.
const KafkaBrokersEnv = "OMNIBUS_TEST_KAFKA_BROKERS"

var (
	kafkaOnce    sync.Once
	kafkaBrokers []string
	kafkaErr     error
)

// Kafka returns the brokers tests talk to: those of OMNIBUS_TEST_KAFKA_BROKERS,
// or those of one in-process kfake cluster (real TCP on 127.0.0.1) shared by
// every test of the package. The shared cluster lives as long as the test
// binary. Each test must use its own topics and groups (see Name).
func Kafka(t testing.TB) []string {
	t.Helper()
	kafkaOnce.Do(func() {
		if env := os.Getenv(KafkaBrokersEnv); env != "" {
			for b := range strings.SplitSeq(env, ",") {
				if b = strings.TrimSpace(b); b != "" {
					kafkaBrokers = append(kafkaBrokers, b)
				}
			}
			kafkaErr = pingKafka(kafkaBrokers)
			return
		}
		c, err := kfake.NewCluster(sharedKafkaOpts()...)
		if err != nil {
			kafkaErr = err
			return
		}
		kafkaBrokers = c.ListenAddrs()
	})
	if kafkaErr != nil {
		t.Fatalf("Kafka is not usable (brokers %v): %v\n"+
			"Unset %s to use the in-process kfake cluster, or point it at brokers you run.",
			kafkaBrokers, kafkaErr, KafkaBrokersEnv)
	}
	return kafkaBrokers
}

// sharedKafkaOpts configures the shared cluster: one broker, topics created on
// first use, and group session timeouts short enough for tests.
func sharedKafkaOpts() []kfake.Opt {
	return []kfake.Opt{
		kfake.NumBrokers(1),
		kfake.AllowAutoTopicCreation(),
		kfake.DefaultNumPartitions(4),
		kfake.GroupMinSessionTimeout(time.Second),
	}
}

// NewKafkaCluster starts a private in-process kfake cluster for one test and
// closes it when the test ends. Tests that inject broker faults (kfake's
// Fault, ControlKey) use it, whatever OMNIBUS_TEST_KAFKA_BROKERS says: faults
// cannot be injected into a real broker, and a fault must not hit the
// requests of tests running in parallel. The cluster has one broker and
// creates topics on first use unless opts say otherwise; its brokers are
// c.ListenAddrs().
func NewKafkaCluster(t testing.TB, opts ...kfake.Opt) *kfake.Cluster {
	t.Helper()
	c, err := kfake.NewCluster(append(sharedKafkaOpts(), opts...)...)
	if err != nil {
		t.Fatalf("start in-process kfake cluster: %v", err)
	}
	t.Cleanup(c.Close)
	return c
}

// KafkaTopic creates a topic with the given number of partitions on brokers,
// named after the test (see Name), and returns its name.
func KafkaTopic(t testing.TB, brokers []string, partitions int32) string {
	t.Helper()
	topic := Name(t)
	CreateKafkaTopic(t, brokers, topic, partitions)
	return topic
}

// CreateKafkaTopic creates topic with the given number of partitions on
// brokers and waits until its metadata shows every partition with a leader.
// A topic that already exists is an error: each test owns its topics.
func CreateKafkaTopic(t testing.TB, brokers []string, topic string, partitions int32) {
	t.Helper()
	cfg := sarama.NewConfig()
	cfg.ClientID = "omnibus-testenv"
	cfg.Metadata.AllowAutoTopicCreation = false
	admin, err := sarama.NewClusterAdmin(brokers, cfg)
	if err != nil {
		t.Fatalf("connect to Kafka %v to create topic %q: %v", brokers, topic, err)
	}
	defer func() { _ = admin.Close() }()
	err = admin.CreateTopic(topic, &sarama.TopicDetail{NumPartitions: partitions, ReplicationFactor: 1}, false)
	if err != nil {
		t.Fatalf("create Kafka topic %q with %d partitions: %v", topic, partitions, err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		md, err := admin.DescribeTopics([]string{topic})
		if err == nil && len(md) == 1 && errors.Is(md[0].Err, sarama.ErrNoError) && len(md[0].Partitions) == int(partitions) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("Kafka topic %q not ready after 30s: %v", topic, err)
		}
		time.Sleep(50 * time.Millisecond) // polling with a deadline
	}
}

// pingKafka checks that brokers answer a metadata request.
func pingKafka(brokers []string) error {
	cfg := sarama.NewConfig()
	cfg.ClientID = "omnibus-testenv"
	cfg.Net.DialTimeout = 5 * time.Second
	cfg.Metadata.Retry.Max = 1
	c, err := sarama.NewClient(brokers, cfg)
	if err != nil {
		return err
	}
	return c.Close()
}
