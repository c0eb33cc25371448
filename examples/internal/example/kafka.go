package example

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/IBM/sarama"
)

// CreateKafkaTopic creates topic with partitions partitions. A topic of that
// name that is being deleted (DropKafkaTopic) is waited for.
func CreateKafkaTopic(ctx context.Context, brokers []string, topic string, partitions int32) error {
	admin, err := sarama.NewClusterAdmin(brokers, sarama.NewConfig())
	if err != nil {
		return fmt.Errorf("Kafka at %v: %w", brokers, err)
	}
	defer admin.Close()
	// A real broker deletes a topic asynchronously: retry the creation until
	// an old one is gone.
	for {
		err := admin.CreateTopic(topic, &sarama.TopicDetail{NumPartitions: partitions, ReplicationFactor: 1}, false)
		if err == nil {
			return nil
		}
		if !errors.Is(err, sarama.ErrTopicAlreadyExists) {
			return fmt.Errorf("create topic %q: %w", topic, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("create topic %q: the previous one is still being deleted: %w", topic, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// DropKafkaTopic deletes consumer group and topic; neither need exist.
func DropKafkaTopic(brokers []string, topic, group string) error {
	admin, err := sarama.NewClusterAdmin(brokers, sarama.NewConfig())
	if err != nil {
		return fmt.Errorf("Kafka at %v: %w", brokers, err)
	}
	defer admin.Close()
	if err := admin.DeleteConsumerGroup(group); err != nil && !errors.Is(err, sarama.ErrGroupIDNotFound) {
		return fmt.Errorf("delete consumer group %q: %w", group, err)
	}
	if err := admin.DeleteTopic(topic); err != nil && !errors.Is(err, sarama.ErrUnknownTopicOrPartition) {
		return fmt.Errorf("delete topic %q: %w", topic, err)
	}
	return nil
}
