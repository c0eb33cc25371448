// Package kafkabench measures the Kafka transport of omnibus against
// watermill-kafka v3, in one run, on one Kafka cluster: the in-process kfake
// cluster of internal/testenv (real TCP), or the brokers in
// OMNIBUS_TEST_KAFKA_BROKERS.
//
// Each benchmark runs a whole scenario once per iteration for both
// implementations, alternating which goes first, and reports the messages
// per second of each and their ratio with b.ReportMetric:
//
//	cd bench && go test -run '^$' -bench . -benchtime 3x ./kafka/
//
// Both sides use their own defaults unless a scenario says otherwise (ours:
// idempotent producer, acks from all in-sync replicas; watermill-kafka: a
// synchronous producer, leader acks). Every topic and group is new. Timings
// decide nothing; docs/benchmarks.md records the figures.
package kafkabench
