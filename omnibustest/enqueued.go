package omnibustest

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/omnibus-go/omnibus/transports/postgres"
)

// Event is an event in the outbox.
type Event struct {
	ID       string
	Topic    string
	Key      string // partition key; "" when none
	Type     string // event type; "" when none
	Payload  []byte
	Metadata map[string]string
}

func (e Event) String() string {
	return fmt.Sprintf("topic=%q key=%q type=%q payload=%s", e.Topic, e.Key, e.Type, short(e.Payload))
}

// short is a payload as a failure message shows it.
func short(p []byte) string {
	const max = 200
	if len(p) > max {
		return fmt.Sprintf("%q… (%d bytes)", p[:max], len(p))
	}
	return fmt.Sprintf("%q", p)
}

// Match selects events: each set field must equal the event's, and Payload,
// when set, must accept its payload. The zero Match matches every event.
type Match struct {
	Topic   string
	Key     string
	Type    string
	Payload func(payload []byte) bool
}

func (m Match) String() string {
	var parts []string
	for _, f := range []struct{ name, v string }{{"topic", m.Topic}, {"key", m.Key}, {"type", m.Type}} {
		if f.v != "" {
			parts = append(parts, fmt.Sprintf("%s=%q", f.name, f.v))
		}
	}
	if m.Payload != nil {
		parts = append(parts, "payload accepted by the matcher")
	}
	if len(parts) == 0 {
		return "any event"
	}
	return strings.Join(parts, " ")
}

func (m Match) matches(e Event) bool {
	return (m.Topic == "" || m.Topic == e.Topic) &&
		(m.Key == "" || m.Key == e.Key) &&
		(m.Type == "" || m.Type == e.Type) &&
		(m.Payload == nil || m.Payload(e.Payload))
}

// JSONPayload is a payload matcher: the payload is JSON equal to want (a
// value marshalled to JSON, or a string or []byte of JSON), regardless of
// key order and spacing.
func JSONPayload(want any) func([]byte) bool {
	var raw []byte
	switch w := want.(type) {
	case string:
		raw = []byte(w)
	case []byte:
		raw = w
	default:
		var err error
		if raw, err = json.Marshal(w); err != nil {
			return func([]byte) bool { return false }
		}
	}
	var wantV any
	if json.Unmarshal(raw, &wantV) != nil {
		return func(p []byte) bool { return bytes.Equal(p, raw) }
	}
	return func(p []byte) bool {
		var got any
		if json.Unmarshal(p, &got) != nil {
			return false
		}
		a, _ := json.Marshal(got)
		b, _ := json.Marshal(wantV)
		return bytes.Equal(a, b)
	}
}

// Querier is what Enqueued reads with: a postgres.DB (a pgx.Tx, pool or
// connection) or a SQLQuerier (a *sql.Tx, *sql.DB, *sqlx.Tx, GORM's
// tx.Statement.ConnPool, bun's tx.Tx). A transaction sees its own
// uncommitted events.
type Querier any

// SQLQuerier is the database/sql side of Querier.
type SQLQuerier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// Enqueued returns the events in env's outbox that db sees, in the order
// they were enqueued.
func (env *Env) Enqueued(t TB, db Querier) []Event {
	t.Helper()
	const cols = `event_id::text, topic, coalesce(partition_key, ''), coalesce(event_type, ''), payload, metadata::text`
	query := `SELECT ` + cols + ` FROM ` + quoted(env.Outbox.Table()) + ` ORDER BY id`
	ctx := context.Background()
	var out []Event
	scan := func(scan func(dest ...any) error) error {
		var e Event
		var meta string
		if err := scan(&e.ID, &e.Topic, &e.Key, &e.Type, &e.Payload, &meta); err != nil {
			return err
		}
		if err := json.Unmarshal([]byte(meta), &e.Metadata); err != nil {
			return err
		}
		out = append(out, e)
		return nil
	}
	var err error
	switch q := db.(type) {
	case postgres.DB:
		rows, qerr := q.Query(ctx, query)
		if err = qerr; err == nil {
			for rows.Next() && err == nil {
				err = scan(rows.Scan)
			}
			rows.Close()
			if err == nil {
				err = rows.Err()
			}
		}
	case SQLQuerier:
		rows, qerr := q.QueryContext(ctx, query)
		if err = qerr; err == nil {
			for rows.Next() && err == nil {
				err = scan(rows.Scan)
			}
			if cerr := rows.Close(); err == nil {
				err = cerr
			}
			if err == nil {
				err = rows.Err()
			}
		}
	default:
		t.Fatalf("omnibustest: Enqueued: %T is neither a postgres.DB (pgx) nor has database/sql's QueryContext", db)
		return nil
	}
	if err != nil {
		t.Fatalf("omnibustest: read the outbox %s: %v", env.Outbox.Table(), err)
	}
	return out
}

// RequireEnqueued fails the test unless exactly one event db sees in the
// outbox matches m, and returns it. The failure lists the events there are.
func (env *Env) RequireEnqueued(t TB, db Querier, m Match) Event {
	t.Helper()
	all := env.Enqueued(t, db)
	var found []Event
	for _, e := range all {
		if m.matches(e) {
			found = append(found, e)
		}
	}
	switch len(found) {
	case 1:
		return found[0]
	case 0:
		t.Fatalf("omnibustest: no event enqueued matching %s; enqueued: %s", m, describe(all))
	default:
		t.Fatalf("omnibustest: %d events enqueued matching %s, want exactly one: %s", len(found), m, describe(found))
	}
	return Event{}
}

// RequireNoneEnqueued fails the test if any event db sees in the outbox
// matches one of ms (any event at all when ms is empty).
func (env *Env) RequireNoneEnqueued(t TB, db Querier, ms ...Match) {
	t.Helper()
	if len(ms) == 0 {
		ms = []Match{{}}
	}
	all := env.Enqueued(t, db)
	for _, m := range ms {
		var found []Event
		for _, e := range all {
			if m.matches(e) {
				found = append(found, e)
			}
		}
		if len(found) > 0 {
			t.Fatalf("omnibustest: want no event enqueued matching %s, found %d: %s", m, len(found), describe(found))
		}
	}
}
