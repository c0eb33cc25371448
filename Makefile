# omnibus — see README.md. `make demo` runs the main job end to end,
# `make test` runs the whole suite.
GO ?= go
TEST_TIMEOUT ?= 9m

.PHONY: all demo test test-short services lint fmt vet bench soak soak-horizon build fuzz install examples

all: build

build:
	$(GO) build ./...

## install: the omnibus command into $(go env GOBIN) (or GOPATH/bin), from this clone
install:
	$(GO) install ./cmd/omnibus

## services: start PostgreSQL, Redis, a 3-node Redis Cluster (127.0.0.1:7001-7003), RabbitMQ and NATS (JetStream) when they are not reachable
services:
	@bash scripts/services.sh

## demo: orders and events written in transactions, relayed through a broker, ingested,
## deduplicated and dispatched in order; prints a summary (BROKER=memory|postgres|kafka|redis|rabbitmq|nats)
BROKER ?= memory
demo:
	@bash scripts/services.sh postgres
	@if [ "$(BROKER)" = redis ] || [ "$(BROKER)" = rabbitmq ] || [ "$(BROKER)" = nats ]; then bash scripts/services.sh $(BROKER); fi
	$(GO) run ./cmd/omnibus demo --broker $(BROKER)

## test: the whole suite against real PostgreSQL, Redis and an in-process Kafka (kfake),
## and the data-layer module (examples/datalayers: database/sql, lib/pq, sqlx, GORM, bun, ent)
# The PostgreSQL transport's suites run twice: on the single table, with
# everything else, and at the same time on the partitioned layout
# (OMNIBUS_TEST_LAYOUT=partitioned; docs/operations.md, "Partitions"). The
# second pass changes only the SQL the tests run against, so it runs without
# the race detector (the first pass covers the same Go code with it), and
# skips the longest tests of what the layout does not change: fuzzing of
# names, the Watermill suite of the queue broker (the keyed and unkeyed
# suites run), and the 10,000 multi-key writer transactions (writers take
# the same advisory locks on both layouts; the dedup table adds one insert
# per distinct event, which no other transaction waits for).
PARTITIONED_SKIP = Fuzz|TestUniversal_QueueBroker|TestEnqueue_MultiKeyTransactionsNeverDeadlock
test: services
	@OMNIBUS_TEST_LAYOUT=partitioned $(GO) test -count=1 -timeout $(TEST_TIMEOUT) -skip '$(PARTITIONED_SKIP)' ./transports/postgres/ \
		> .partitioned-test.log 2>&1 & part=$$!; \
	$(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) ./...; all=$$?; \
	wait $$part; rc=$$?; \
	echo "--- the PostgreSQL transport on the partitioned layout:"; \
	if [ $$rc -ne 0 ]; then cat .partitioned-test.log; else tail -1 .partitioned-test.log; fi; \
	rm -f .partitioned-test.log; \
	[ $$all -eq 0 ] && [ $$rc -eq 0 ]
	cd examples/datalayers && $(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) ./...

## examples: run every example program against the local services and check what it prints
examples: services
	$(GO) test -count=1 -timeout $(TEST_TIMEOUT) ./examples/
	cd examples/datalayers && $(GO) test -count=1 -timeout $(TEST_TIMEOUT) -run TestExamples ./...

## lint: formatting and vet
lint: vet
	@out=$$(gofmt -l . bench); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet ./...
	$(GO) vet -tags soak ./...
	cd bench && $(GO) vet ./...
	cd examples/datalayers && $(GO) vet ./...

fmt:
	gofmt -w .

## bench: benchmarks of our transports and processors against their peers (prints numbers)
bench:
	@bash scripts/services.sh
	cd bench && $(GO) test -run '^$$' -bench . -benchtime 1x -timeout 30m ./...

## soak-horizon: the outbox under writers at capacity for 20 minutes with the xmin horizon pinned
## (OMNIBUS_HORIZON_DURATION, OMNIBUS_HORIZON_PIN=off for the same without); prints per-minute figures
soak-horizon: services
	$(GO) test -count=1 -tags soak -run PinnedHorizonStand -timeout 60m -v ./transports/postgres/

## soak: long-running stand tests (build tag soak; OMNIBUS_SOAK_DURATION, default 3m)
soak: services
	$(GO) test -race -count=1 -tags soak -run Soak -timeout 60m -v ./...

## fuzz: every Fuzz* target of every package (discovered with go test -list), each for
## FUZZ_TIME (default 1m); FUZZ_PKGS narrows the packages (default ./...)
FUZZ_TIME ?= 1m
FUZZ_PKGS ?= ./...
fuzz:
	FUZZ_TIME=$(FUZZ_TIME) GO=$(GO) bash scripts/fuzz.sh $(FUZZ_PKGS)
