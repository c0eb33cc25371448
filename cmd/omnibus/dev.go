package main

import (
	"context"
	"fmt"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/transports/kafka"
)

// Defaults of `omnibus dev kafka`.
const (
	// DefaultDevKafkaPort is the port the in-process Kafka listens on.
	DefaultDevKafkaPort = 9092
	// DefaultDevKafkaPartitions is the partition count of topics created on
	// first use and of --seed-topics.
	DefaultDevKafkaPartitions = 4
)

// devKafkaOptions are the flags of `omnibus dev kafka`.
type devKafkaOptions struct {
	port       int
	partitions int
	seedTopics []string
}

// devCommand groups the commands for local development.
func (a *app) devCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "dev",
		Short: "Services for local development (not for production)",
		RunE:  group,
	}
	cmd.AddCommand(a.devKafkaCommand())
	return cmd
}

func (a *app) devKafkaCommand() *cobra.Command {
	var o devKafkaOptions
	cmd := &cobra.Command{
		Use:   "kafka",
		Short: "Serve an in-process Kafka (kfake) on 127.0.0.1 until interrupted",
		Long: `Serve a single-broker, in-process Kafka (franz-go's kfake) on 127.0.0.1:PORT
until Ctrl-C, and print how to point omnibus at it. Topics are created on
first use with --partitions partitions; --seed-topics creates some up front.
Records live in memory and are lost when it stops. For local work and
demos only: kfake is a test double of Kafka, not a Kafka to run in
production. --port 0 picks a free port.`,
		Args: noArgs,
		RunE: a.runE(func(cmd *cobra.Command, _ []string) error {
			return a.devKafka(cmd.Context(), o)
		}),
	}
	f := cmd.Flags()
	f.IntVar(&o.port, "port", DefaultDevKafkaPort, "port to listen on at 127.0.0.1 (0: any free port)")
	f.IntVar(&o.partitions, "partitions", DefaultDevKafkaPartitions, "partitions of each topic created on first use or by --seed-topics")
	f.StringSliceVar(&o.seedTopics, "seed-topics", nil, "topics to create at start (comma-separated)")
	return cmd
}

func (o devKafkaOptions) validate() error {
	if o.port < 0 || o.port > 65535 {
		return usagef("--port: %d is not a TCP port (0-65535)", o.port)
	}
	if o.partitions < 1 {
		return usagef("--partitions: must be at least 1, got %d", o.partitions)
	}
	for i, t := range o.seedTopics {
		if t == "" {
			return usagef("--seed-topics: topic %d is empty", i+1)
		}
	}
	return nil
}

// devKafka serves an in-process Kafka until ctx ends or the process is
// interrupted.
func (a *app) devKafka(ctx context.Context, o devKafkaOptions) error {
	if err := o.validate(); err != nil {
		return err
	}
	opts := []kfake.Opt{
		kfake.NumBrokers(1),
		kfake.Ports(o.port),
		kfake.AllowAutoTopicCreation(),
		kfake.DefaultNumPartitions(o.partitions),
	}
	if len(o.seedTopics) > 0 {
		opts = append(opts, kfake.SeedTopics(int32(o.partitions), o.seedTopics...))
	}
	cluster, err := kfake.NewCluster(opts...)
	if err != nil {
		return fmt.Errorf("start in-process Kafka on 127.0.0.1:%d: %w", o.port, err)
	}
	defer cluster.Close()

	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	brokers := strings.Join(cluster.ListenAddrs(), ",")
	fmt.Fprintf(a.stdout, "in-process Kafka (kfake) listening on %s\n", brokers)
	fmt.Fprintf(a.stdout, "point omnibus at it with:\n  %s=%s %s=%s\n",
		bus.EnvName("broker"), kafka.Name, bus.EnvName("kafka.brokers"), brokers)
	if len(o.seedTopics) > 0 {
		fmt.Fprintf(a.stdout, "topics created: %s (%d partitions each)\n", strings.Join(o.seedTopics, ", "), o.partitions)
	}
	fmt.Fprintf(a.stdout, "topics are created on first use with %d partitions; records live in memory. Ctrl-C stops it.\n", o.partitions)

	<-ctx.Done()
	fmt.Fprintln(a.stdout, "stopping the in-process Kafka")
	return nil
}
