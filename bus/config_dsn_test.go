package bus

import (
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
)

// isolateLibpqEnv keeps the PG* variables and files of the machine out of
// pgconn.ParseConfig, which the tests use as the reference parser.
func isolateLibpqEnv(t testing.TB) {
	for _, name := range []string{"PGPASSWORD", "PGSERVICE", "PGHOST", "PGPORT", "PGUSER", "PGDATABASE", "PGSSLMODE", "PGSSLCERT", "PGSSLKEY", "PGSSLROOTCERT", "PGSSLPASSWORD", "PGOPTIONS", "PGAPPNAME", "PGCONNECT_TIMEOUT", "PGTARGETSESSIONATTRS", "PGSSLSNI", "PGSSLNEGOTIATION"} {
		t.Setenv(name, "")
	}
	t.Setenv("PGPASSFILE", "/nonexistent/omnibus-test-pgpass")
	t.Setenv("PGSERVICEFILE", "/nonexistent/omnibus-test-pgservice")
}

// TestCheckPostgresURL_AcceptsWhatTheDriverAccepts compares postgres.url
// validation with the driver's own parser (pgconn.ParseConfig): what it
// accepts is valid, what it refuses is invalid, except an '@' in a host or
// database name, which the driver takes but which is always the rest of a
// password with an unescaped '@'.
func TestCheckPostgresURL_AcceptsWhatTheDriverAccepts(t *testing.T) {
	isolateLibpqEnv(t)
	for _, tc := range []struct {
		dsn          string
		valid        bool
		driverAgrees bool
	}{
		{"postgres://u:pw@h:5432/db?sslmode=disable", true, true},
		{"postgresql://u:p%40ss@h/db", true, true},
		{"postgres://u:pw@[::1]:5432,[::2]:5433,h3/db?target_session_attrs=read-write", true, true},
		{"postgres://u:p#ss@h/db", true, true},
		{"postgres://u:p?ss@h/db?application_name=a@b", true, true},
		{"postgres:///db?host=/var/run/postgresql", true, true},
		{"host = db password = 'it\\'s a secret' application_name=svc://worker", true, true},
		{`host=db password=a\ b`, true, true},
		{"postgres://u:p@ss@h/db", false, false},
		{"postgres://u:12/p@h/db", false, false},
		{"postgres://u:pw@h1:5432,h2:x/db", false, true},
		{"postgres://u:pw@h:99999/db", false, true},
		{"postgres://[::1/db", false, true},
		{"postgres://h/db?sslmode", false, true},
		{"postgres://h/db?a=b=c", false, true},
		{"postgres://u:a%zz@h/db", false, true},
		{"host=h password=a b", false, true},
		{"host=h password='a b", false, true},
		{"host=h =x", false, true},
		{"hunter2", false, true},
	} {
		t.Run(tc.dsn, func(t *testing.T) {
			err := checkPostgresURL(tc.dsn)
			assert.Equal(t, tc.valid, err == nil, "checkPostgresURL: %v", err)
			_, derr := pgconn.ParseConfig(tc.dsn)
			assert.Equal(t, tc.valid == tc.driverAgrees, derr == nil, "pgconn.ParseConfig: %v", derr)
		})
	}
}
