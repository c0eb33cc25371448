// Package inboxbench measures the receiving side of omnibus against floors
// measured in the same run, on the same PostgreSQL server:
//
//   - BenchmarkInboxIngest: 100k messages consumed from Kafka (an in-process
//     kfake cluster, or OMNIBUS_TEST_KAFKA_BROKERS) by a processors.InboxIngest
//     into an inbox table with dedup (ON CONFLICT DO NOTHING), beside the floor:
//     the same messages inserted with raw batched
//     INSERT … SELECT unnest(…) ON CONFLICT DO NOTHING statements of the same
//     batch size on as many connections as the ingest has writers.
//   - BenchmarkInboxDispatch: 100k stored rows over 10k keys dispatched by a
//     processors.Dispatcher to a no-op typed handler, beside an OutboxRelay
//     draining the same shape of outbox into an in-memory sink (both with
//     their default configuration).
//
// Run them with:
//
//	cd bench && go test -run '^$' -bench . -benchtime 1x ./inbox/
//
// Metrics are reported with b.ReportMetric; timings decide nothing, and
// docs/benchmarks.md records the figures.
package inboxbench
