// Package ident holds the one rule for the SQL identifiers omnibus splices
// into statements (table and schema names): package bus checks the
// configured tables with it, transports/postgres the tables it is given.
package ident

import (
	"regexp"
	"strings"
)

// MaxLen is PostgreSQL's identifier limit (NAMEDATALEN-1), in bytes.
const MaxLen = 63

// MaxTableNameLen is the longest table name omnibus accepts: MaxLen less the
// longest suffix of the objects named after a table ("_lanes_ready_idx").
const MaxTableNameLen = MaxLen - len("_lanes_ready_idx")

var plainRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// Plain reports whether s is a plain identifier: letters, digits and
// underscores, not starting with a digit.
func Plain(s string) bool { return plainRE.MatchString(s) }

// Table reports whether s is a table name: a plain identifier, optionally
// qualified by a plain schema name (schema.table).
func Table(s string) bool {
	parts := strings.Split(s, ".")
	if len(parts) > 2 {
		return false
	}
	for _, p := range parts {
		if !Plain(p) {
			return false
		}
	}
	return true
}
