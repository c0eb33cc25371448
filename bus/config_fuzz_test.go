package bus

import (
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// alnumRunRE finds the pieces of a secret that must not show on their own.
var alnumRunRE = regexp.MustCompile(`[A-Za-z0-9]{6,}`)

// leaked returns the part of secret that out shows and template (the text
// around the secret) does not explain, or "".
func leaked(out, secret, template string) string {
	if len(secret) >= 4 && strings.Contains(out, secret) && !strings.Contains(template, secret) && !strings.Contains(Redacted, secret) {
		return secret
	}
	for _, piece := range alnumRunRE.FindAllString(secret, -1) {
		if strings.Contains(out, piece) && !strings.Contains(template, piece) && !strings.Contains(Redacted, piece) {
			return piece
		}
	}
	return ""
}

// quoteKeyValue writes s as a single-quoted libpq value.
func quoteKeyValue(s string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(s) + "'"
}

// escapeKeyValueWord writes s as an unquoted libpq value: a backslash before
// every space, quote and backslash.
func escapeKeyValueWord(s string) string {
	var b strings.Builder
	for i := range len(s) {
		if isKVSpace(s[i]) || s[i] == '\'' || s[i] == '\\' {
			b.WriteByte('\\')
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// FuzzRedactDSN_KnownPasswordNeverSurvives writes a password into a
// connection string in every syntax the config accepts (escaped and, as
// users do by mistake, raw) and checks that RedactDSN shows neither the
// password nor any run of six letters or digits of it.
func FuzzRedactDSN_KnownPasswordNeverSurvives(f *testing.F) {
	for _, seed := range []string{
		"s3cret", "p@ss@word", "pa/ss?wo#rd", "it's a secret", `back\slash`, "x?password=y@z", "secretpart?password=x@y",
		"semi;colon&amp=1", "%zz%41", "new\nline", "héllo wörld", "null", "", "1234?tail5678", "a://b@c",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, pw string) {
		for _, form := range []struct{ syntax, before, inserted, after string }{
			{"URL user info, escaped", "postgres://app:", url.UserPassword("app", pw).String()[len("app:"):], "@db:5432/app?sslmode=require"},
			{"URL user info, raw", "postgres://app:", pw, "@db:5432/app?sslmode=require"},
			{"URL query", "postgres://db:5432/app?sslmode=disable&password=", url.QueryEscape(pw), "&application_name=svc"},
			{"URL sslpassword", "postgresql://app@db/app?sslpassword=", url.QueryEscape(pw), ""},
			{"key=value quoted", "host=db user=app password=", quoteKeyValue(pw), " dbname=app application_name=svc://worker"},
			{"key=value word", "host=db password = ", escapeKeyValueWord(pw), " dbname=app"},
			{"OTLP user info", "https://tenant:", url.UserPassword("tenant", pw).String()[len("tenant:"):], "@collector:4318/v1/traces"},
			{"OTLP token", "https://collector:4318/v1/traces?api_key=", url.QueryEscape(pw), ""},
		} {
			dsn := form.before + form.inserted + form.after
			out := RedactDSN(dsn)
			template := form.before + form.after
			for _, secret := range []string{pw, form.inserted} {
				if piece := leaked(out, secret, template); piece != "" {
					t.Fatalf("%s: RedactDSN(%q) = %q shows %q of the password %q", form.syntax, dsn, out, piece, pw)
				}
			}
		}
	})
}

// FuzzRedactDSN_AgreesWithTheDriver feeds any string to RedactDSN (it must
// not panic) and compares with the driver's parser (pgconn.ParseConfig):
// when the driver finds a password, the redacted string carries none but
// REDACTED, and when the driver accepts a connection string, so does
// postgres.url validation (except an '@' in a host or database name, and a
// URL of another scheme, which validation refuses on purpose).
func FuzzRedactDSN_AgreesWithTheDriver(f *testing.F) {
	isolateLibpqEnv(f)
	for _, seed := range []string{
		"postgres://u:pw@h:5432/db?sslmode=disable", "postgres://u:p@ss@h/db", "postgres://u:1?x@h/db",
		"postgres://h/db?pass%77ord=x", "postgres://u:pw@[::1]:5432,[::2]:5433/db", "postgresql://u:p#ss@h/db",
		"host=db password=s3cret application_name=svc://worker", `password='it\'s' host=h`, `password=a\ b`,
		"host=h password= dbname=d", "password=a b c=d", "hunter2", "", " ", "postgres://", "postgres://@",
		"cannot parse `host=h password=xxxxx`: invalid", "https://t:tok@collector/v1?api_key=k",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, s string) {
		out, _ := redactDSN(s)
		cfg, err := pgconn.ParseConfig(s)
		if err != nil {
			return
		}
		if cfg.Password != "" {
			if rcfg, rerr := pgconn.ParseConfig(out); rerr == nil && rcfg.Password != "" && rcfg.Password != Redacted {
				t.Fatalf("RedactDSN(%q) = %q: the driver reads the password %q from it", s, out, rcfg.Password)
			}
			if strings.Contains(out, cfg.Password) && len(cfg.Password) >= 6 && !strings.Contains(Redacted, cfg.Password) &&
				strings.Count(out, cfg.Password) >= strings.Count(s, cfg.Password) {
				t.Fatalf("RedactDSN(%q) = %q still shows the password %q", s, out, cfg.Password)
			}
		}
		atInName := strings.Contains(cfg.Host, "@") || strings.Contains(cfg.Database, "@")
		for _, fb := range cfg.Fallbacks {
			atInName = atInName || strings.Contains(fb.Host, "@")
		}
		// The driver reads "https://x?a=b" as a key=value pair named
		// "https://x?a"; validation refuses a URL of another scheme on purpose.
		otherScheme := schemeRE.MatchString(s) && !strings.HasPrefix(s, "postgres://") && !strings.HasPrefix(s, "postgresql://")
		if verr := checkPostgresURL(s); verr != nil && !atInName && !otherScheme {
			t.Fatalf("the driver accepts %q but validation refuses it: %v", s, verr)
		}
	})
}

// FuzzLoadConfig loads any YAML with a secret in the environment (in
// OMNIBUS_*_PASSWORD, in the postgres URL, and in DB_PASSWORD for ${...}
// references): loading never panics, and neither its error nor the printed
// config ever shows the secret.
func FuzzLoadConfig(f *testing.F) {
	for _, seed := range []struct{ yaml, secret string }{
		{"broker: kafka\n", "s3cret"},
		{"postgres:\n  url: postgres://u:${DB_PASSWORD}@db/app\n", "pw"},
		{"postgres:\n  max_conns: ${DB_PASSWORD}\n", "hunter2"},
		{"broker: ${DB_PASSWORD}\n", "hunter2"},
		{"redis:\n  addr: $DB_PASSWORD\n", "x"},
		{"kafka:\n  sasl:\n    password: *a\n", "a"},
		{"inbox:\n  topics: &t [a, $$b]\npostgres:\n  queue_groups: *t\n", "q"},
		{"relay: {lease: ${DB_PASSWORD}}\nbrokr: 1\n", "30s"},
		{"observability:\n  otlp_endpoint: ${DB_PASSWORD}\n", "ftp://u:p@h"},
		{"- a\n- b\n", "z"},
		{"redis: [${X\n", "z"},
	} {
		f.Add([]byte(seed.yaml), seed.secret)
	}
	f.Fuzz(func(t *testing.T, data []byte, fuzzed string) {
		secret := "Zq9x" + fuzzed
		if strings.Contains(string(data), secret) {
			return // the file holds the secret as plain text: not a secret value
		}
		vars := map[string]string{
			"DB_PASSWORD":                 secret,
			"OMNIBUS_REDIS_PASSWORD":      secret,
			"OMNIBUS_KAFKA_SASL_PASSWORD": secret,
			"OMNIBUS_POSTGRES_URL":        "postgres://app:" + url.PathEscape(secret) + "@db/app",
		}
		cfg, err := loadConfigData("omnibus.yaml", data, env(vars))
		out := ""
		if err != nil {
			out = err.Error()
		} else {
			out = cfg.String() + cfg.GoString()
		}
		for _, s := range []string{secret, url.PathEscape(secret)} {
			if strings.Contains(out, s) {
				t.Fatalf("loading %q shows the secret %q:\n%s", data, s, out)
			}
		}
	})
}
