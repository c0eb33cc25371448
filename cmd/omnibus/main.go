// Command omnibus runs omnibus's processors and admin operations from a
// configuration file, without writing code:
//
//	omnibus migrate [--print]          create or upgrade the outbox and inbox tables
//	omnibus relay                      outbox → broker, with /metrics, /healthz and /readyz (127.0.0.1:9464)
//	omnibus ingest                     broker → inbox, with /metrics, /healthz and /readyz (127.0.0.1:9465)
//	omnibus outbox stats|failed|show|requeue|cleanup|release-leases|sweep-lanes
//	omnibus inbox  stats|failed|show|requeue|cleanup|release-leases|sweep-lanes
//	omnibus console [--read-only]      admin web console on 127.0.0.1:8090 (docs/console.md)
//	omnibus config check               load, validate and print the config (secrets redacted)
//	omnibus demo [--keep]              the whole pipeline end to end, with a summary
//	omnibus dev kafka [--port 9092]    an in-process Kafka (kfake) for local work, until Ctrl-C
//	omnibus --version                  module version, commit and Go version
//
// The configuration comes from --config (or OMNIBUS_CONFIG) and the OMNIBUS_*
// environment variables; see docs/configuration.md. Exit status: 0 success,
// 1 runtime failure, 2 bad usage or bad configuration.
package main

import (
	"context"
	"os"
)

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}
