// Command omnibus runs omnibus's processors and admin operations from a
// configuration file, without writing code:
//
//	omnibus migrate [--print]          create or upgrade the outbox and inbox tables
//	omnibus relay                      outbox → broker, with /metrics and /healthz
//	omnibus ingest                     broker → inbox, with /metrics and /healthz
//	omnibus outbox stats|failed|requeue|cleanup
//	omnibus inbox  stats|failed|requeue|cleanup
//	omnibus config check               load, validate and print the config (secrets redacted)
//	omnibus demo                       the whole pipeline end to end, with a summary
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
