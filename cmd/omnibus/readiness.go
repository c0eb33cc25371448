package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/transports/postgres"
)

// readyTimeout bounds one /readyz answer: every check shares it.
const readyTimeout = 2 * time.Second

// readiness is the list of checks /readyz runs: the command is ready when
// every one of them passes.
type readiness struct {
	checks []readyCheck
}

type readyCheck struct {
	name  string
	check func(context.Context) error
}

// add appends a named check; a nil check is ignored.
func (r *readiness) add(name string, check func(context.Context) error) {
	if check != nil {
		r.checks = append(r.checks, readyCheck{name, check})
	}
}

// problems runs every check and returns one "name: reason" line per failure.
func (r *readiness) problems(ctx context.Context) []string {
	var out []string
	for _, c := range r.checks {
		if err := c.check(ctx); err != nil {
			out = append(out, c.name+": "+oneLine(err.Error(), 500))
		}
	}
	return out
}

// ServeHTTP answers 200 "ok" when every check passes, else 503 with one line
// per failing check.
func (r *readiness) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	ctx, cancel := context.WithTimeout(req.Context(), readyTimeout)
	defer cancel()
	if p := r.problems(ctx); len(p) > 0 {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = fmt.Fprintf(w, "not ready\n%s\n", strings.Join(p, "\n"))
		return
	}
	_, _ = w.Write([]byte("ok\n"))
}

// schemaError says that a table of omnibus is missing or older than this
// build, and how to fix it.
type schemaError struct {
	table postgres.Table
	state postgres.SchemaState
	err   error // what the command ran into, if anything
}

func (e *schemaError) Error() string {
	if !e.state.Exists {
		return fmt.Sprintf("%s table %q does not exist: run `omnibus migrate` (with this configuration)", e.table.Kind, e.table.Name)
	}
	return fmt.Sprintf("%s table %q is at schema version %d, this omnibus needs %d: run `omnibus migrate` (with this configuration)",
		e.table.Kind, e.table.Name, e.state.Version, e.state.Latest)
}

func (e *schemaError) Unwrap() error { return e.err }

// schemaProblem is a *schemaError when st says adm's table is missing or
// behind, else nil.
func schemaProblem(adm *postgres.Admin, st postgres.SchemaState, cause error) error {
	if st.Exists && !st.Behind() {
		return nil
	}
	return &schemaError{table: adm.Table(), state: st, err: cause}
}

// schemaCheck is the readiness check of adm's table.
func schemaCheck(adm *postgres.Admin) func(context.Context) error {
	return func(ctx context.Context) error {
		st, err := adm.SchemaState(ctx)
		if err != nil {
			return err
		}
		return schemaProblem(adm, st, nil)
	}
}

// explainSchemaError turns err into a *schemaError when PostgreSQL rejected
// a statement for a missing relation, column or function (what an
// unmigrated or outdated schema causes) and adm's table is indeed missing or
// behind. Any other error is returned as it is.
func explainSchemaError(ctx context.Context, adm *postgres.Admin, err error) error {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return err
	}
	switch pe.Code {
	case "42P01", "42703", "42883": // undefined_table, undefined_column, undefined_function
	default:
		return err
	}
	st, serr := adm.SchemaState(ctx)
	if serr != nil {
		return err
	}
	if p := schemaProblem(adm, st, err); p != nil {
		return p
	}
	return err
}

// fetchHealth is a postgres.Observer that remembers whether a subscriber's
// last fetch failed, for /readyz, and passes every measurement on to next.
type fetchHealth struct {
	next postgres.Observer

	mu       sync.Mutex
	failures int // consecutive failed fetches
	lastErr  error
}

var (
	_ postgres.Observer      = (*fetchHealth)(nil)
	_ postgres.LeaseObserver = (*fetchHealth)(nil)
)

// ObserveFetch implements postgres.Observer.
func (f *fetchHealth) ObserveFetch(info postgres.FetchInfo) {
	f.mu.Lock()
	if info.Err != nil {
		f.failures++
		f.lastErr = info.Err
	} else {
		f.failures, f.lastErr = 0, nil
	}
	f.mu.Unlock()
	f.next.ObserveFetch(info)
}

// ObserveSettle implements postgres.Observer.
func (f *fetchHealth) ObserveSettle(info postgres.SettleInfo) { f.next.ObserveSettle(info) }

// ObserveLeaseLost implements postgres.LeaseObserver (the metric of lost
// leases must keep working behind this wrapper).
func (f *fetchHealth) ObserveLeaseLost(info postgres.LeaseLostInfo) {
	if lo, ok := f.next.(postgres.LeaseObserver); ok {
		lo.ObserveLeaseLost(info)
	}
}

// check fails while the last fetch failed.
func (f *fetchHealth) check(context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.lastErr == nil {
		return nil
	}
	if f.failures == 1 {
		return fmt.Errorf("the last fetch failed: %w", f.lastErr)
	}
	return fmt.Errorf("the last %d fetches failed: %w", f.failures, f.lastErr)
}

// brokerCheck probes that the broker cfg names accepts connections: a TCP
// connection to any of the addresses its transport names (bus.BrokerEndpoints).
// It returns nil (no check) for a broker without addresses: postgres, which
// the database check covers, and memory.
func brokerCheck(cfg bus.Config) func(context.Context) error {
	addrs := bus.BrokerEndpoints(cfg)
	if len(addrs) == 0 {
		return nil
	}
	return func(ctx context.Context) error { return dialAny(ctx, cfg.Broker, addrs) }
}

// dialAny connects to the first of addrs that answers and closes the
// connection at once.
func dialAny(ctx context.Context, broker string, addrs []string) error {
	var d net.Dialer
	var errs []error
	for _, addr := range addrs {
		conn, err := d.DialContext(ctx, "tcp", addr)
		if err == nil {
			_ = conn.Close()
			return nil
		}
		errs = append(errs, err)
	}
	return fmt.Errorf("%s broker unreachable at %s: %w", broker, strings.Join(addrs, ", "), errors.Join(errs...))
}
