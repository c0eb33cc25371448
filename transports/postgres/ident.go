package postgres

import (
	"fmt"
	"hash/fnv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/omnibus-go/omnibus/internal/ident"
)

// maxIdentLen is PostgreSQL's NAMEDATALEN-1. Derived names (lanes table,
// indexes) append suffixes, so table names get a smaller budget.
const maxIdentLen = ident.MaxLen

// maxTableNameLen leaves room for the longest suffix we derive ("_lanes_ready_idx").
const maxTableNameLen = ident.MaxTableNameLen

// tableName is a validated, optionally schema-qualified table name.
type tableName struct {
	schema string // "" when unqualified
	name   string
}

// parseTableName validates s ("table" or "schema.table"). Every part must be
// a plain identifier: letters, digits and underscores, not starting with a
// digit. Nothing user-given is ever spliced into SQL unvalidated.
func parseTableName(s string) (tableName, error) {
	parts := strings.Split(s, ".")
	if len(parts) > 2 || s == "" {
		return tableName{}, fmt.Errorf("%q is not a table name (want table or schema.table)", s)
	}
	for _, p := range parts {
		if !ident.Plain(p) {
			return tableName{}, fmt.Errorf("%q is not a valid identifier (letters, digits, underscores; not starting with a digit)", p)
		}
	}
	if len(parts) == 2 {
		if len(parts[0]) > maxIdentLen {
			return tableName{}, fmt.Errorf("schema name %q is longer than %d bytes", parts[0], maxIdentLen)
		}
		if len(parts[1]) > maxTableNameLen {
			return tableName{}, fmt.Errorf("table name %q is longer than %d bytes", parts[1], maxTableNameLen)
		}
		return tableName{schema: parts[0], name: parts[1]}, nil
	}
	if len(parts[0]) > maxTableNameLen {
		return tableName{}, fmt.Errorf("table name %q is longer than %d bytes", parts[0], maxTableNameLen)
	}
	return tableName{name: parts[0]}, nil
}

// String is the name as given: schema.table or table.
func (t tableName) String() string {
	if t.schema == "" {
		return t.name
	}
	return t.schema + "." + t.name
}

// quoted is the name quoted for SQL.
func (t tableName) quoted() string {
	if t.schema == "" {
		return pgx.Identifier{t.name}.Sanitize()
	}
	return pgx.Identifier{t.schema, t.name}.Sanitize()
}

// quoteIdent quotes one identifier derived from a validated name (a schema,
// a channel).
func quoteIdent(s string) string { return pgx.Identifier{s}.Sanitize() }

// derived returns a table in the same schema whose name has suffix appended.
func (t tableName) derived(suffix string) tableName {
	return tableName{schema: t.schema, name: t.name + suffix}
}

// ident quotes a bare identifier derived from the table name (index,
// trigger, function names never carry a schema of their own).
func (t tableName) ident(suffix string) string {
	return pgx.Identifier{t.name + suffix}.Sanitize()
}

// qualifiedIdent quotes a derived object name in the table's schema.
func (t tableName) qualifiedIdent(suffix string) string {
	return t.derived(suffix).quoted()
}

// channel is the LISTEN/NOTIFY channel of the table: a plain string, used
// quoted in LISTEN and as a text argument to pg_notify.
func (t tableName) channel() string {
	ch := "omnibus_" + strings.ReplaceAll(t.String(), ".", "_")
	if len(ch) <= maxIdentLen {
		return ch
	}
	// PostgreSQL truncates longer channel names; keep them distinct instead.
	h := fnv.New64a()
	_, _ = h.Write([]byte(t.String()))
	return fmt.Sprintf("%s_%016x", ch[:maxIdentLen-17], h.Sum64())
}
