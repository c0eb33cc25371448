// Package redisbench measures the Redis Streams transport of omnibus against
// watermill-redisstream, in one run, on one Redis server.
//
// Each benchmark runs a whole scenario once per iteration for both
// implementations (publish N messages from 64 goroutines; consume N messages
// through a new consumer group) and reports messages per second of each and
// their ratio with b.ReportMetric:
//
//	cd bench && go test -run '^$' -bench . -benchtime 1x ./redis/
//
// They need Redis at OMNIBUS_TEST_REDIS_ADDR (default 127.0.0.1:6379). Every
// stream they create is named omnibus:bench:<random>:… and deleted at the
// end. Timings decide nothing; docs/benchmarks.md records the figures.
package redisbench
