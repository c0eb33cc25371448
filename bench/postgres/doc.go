// Package postgresbench measures the PostgreSQL outbox transport and the
// outbox relay of omnibus against raw-SQL floors, in one run, on one server.
//
// The benchmarks live in the _test.go files of this package and each runs a
// whole scenario once per iteration (seed, run, measure, drop), reporting its
// figures with b.ReportMetric:
//
//	cd bench && go test -run '^$' -bench . -benchtime 1x ./postgres/
//
// They need a PostgreSQL server at OMNIBUS_TEST_POSTGRES_URL (default
// postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable). Every table
// they create is named bench_<scenario>_<random> and dropped at the end.
// docs/benchmarks.md records the figures and what each one means.
package postgresbench
