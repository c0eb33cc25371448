package omnibus_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/internal/testenv"
)

// TestOpen_PostgresTLS runs omnibus.Open against a private PostgreSQL that
// accepts TCP connections over TLS only (testenv.StartTLSPostgres), with
// the TLS settings in postgres.url as pgx reads them: sslmode, sslrootcert,
// sslcert and sslkey. Accepted settings connect over TLS and can Migrate
// and Enqueue; refused ones fail with an error that names the problem,
// that waiting would not fix (not bus.Transient), and that, like the
// printed config, never shows the password.
func TestOpen_PostgresTLS(t *testing.T) {
	t.Parallel()
	pg := testenv.StartTLSPostgres(t)
	ca := "sslrootcert=" + url.QueryEscape(pg.CAFile)
	otherCA := "sslrootcert=" + url.QueryEscape(pg.OtherCAFile)
	clientCert := "sslcert=" + url.QueryEscape(pg.ClientCertFile) + "&sslkey=" + url.QueryEscape(pg.ClientKeyFile)
	wrongPassword := "wrong_" + pg.Password[3:]

	t.Run("accepted", func(t *testing.T) {
		t.Parallel()
		for _, tc := range []struct {
			name     string
			url      string
			wantUser string
			migrate  bool // the user owns the database: Migrate and Enqueue
		}{
			{"verify-full with the CA", pg.URL(pg.Host, pg.User, pg.Password, "sslmode=verify-full&"+ca), pg.User, true},
			{"verify-full with the CA to localhost", pg.URL("localhost", pg.User, pg.Password, "sslmode=verify-full&"+ca), pg.User, true},
			{"verify-full with the CA in key=value form", fmt.Sprintf("host=%s port=%d dbname=%s user=%s password=%s sslmode=verify-full sslrootcert=%s",
				pg.Host, pg.Port, pg.Database, pg.User, pg.Password, pg.CAFile), pg.User, true},
			{"verify-ca with the CA to a host the certificate does not name", pg.URL(pg.OtherHost, pg.User, pg.Password, "sslmode=verify-ca&"+ca), pg.User, true},
			{"require without a CA encrypts without verifying", pg.URL(pg.Host, pg.User, pg.Password, "sslmode=require"), pg.User, true},
			{"no sslmode (prefer) uses TLS when the server offers it", pg.URL(pg.Host, pg.User, pg.Password, ""), pg.User, true},
			{"client certificate instead of a password", pg.URL(pg.Host, pg.CertUser, "", "sslmode=verify-full&"+ca+"&"+clientCert), pg.CertUser, false},
		} {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
				defer cancel()
				full := testenv.Name(t)
				name := "tls_" + full[len(full)-10:] // the random suffix: table names have a length limit
				cfg := bus.Config{
					Postgres: bus.PostgresConfig{URL: tc.url},
					Outbox:   bus.OutboxConfig{Table: name + "_out"},
					Inbox:    bus.InboxConfig{Table: name + "_in", ConsumerGroup: "test"},
				}
				assertNoSecret(t, cfg, nil, pg.Password)
				b, err := omnibus.Open(ctx, cfg)
				require.NoError(t, err, "Open with postgres.url %s", cfg.Redacted().Postgres.URL)
				defer func() { require.NoError(t, b.Close()) }()

				var ssl bool
				var user string
				require.NoError(t, b.Pool().QueryRow(ctx,
					`SELECT s.ssl, current_user FROM pg_stat_ssl s WHERE s.pid = pg_backend_pid()`).Scan(&ssl, &user))
				assert.True(t, ssl, "the connection must be encrypted")
				assert.Equal(t, tc.wantUser, user)
				if !tc.migrate {
					return
				}
				require.NoError(t, b.Migrate(ctx))
				msg := message.NewMessage(watermill.NewUUID(), []byte(`{"order":"o1"}`))
				require.NoError(t, b.Outbox().Enqueue(ctx, b.Pool(), "payments", msg))
				admin, err := b.OutboxAdmin()
				require.NoError(t, err)
				stats, err := admin.Stats(ctx)
				require.NoError(t, err)
				assert.Equal(t, int64(1), stats.Pending, "the enqueued event must be stored in the outbox")
			})
		}
	})

	t.Run("refused", func(t *testing.T) {
		t.Parallel()
		for _, tc := range []struct {
			name    string
			url     string
			wantErr []string // what the error must say
			config  bool     // an invalid postgres.url rather than a refused connection
		}{
			{
				name:    "sslmode=disable is rejected by the server",
				url:     pg.URL(pg.Host, pg.User, pg.Password, "sslmode=disable"),
				wantErr: []string{"pg_hba.conf rejects connection", "no encryption", "SQLSTATE 28000"},
			},
			{
				name:    "verify-full without the CA",
				url:     pg.URL(pg.Host, pg.User, pg.Password, "sslmode=verify-full"),
				wantErr: []string{"x509: certificate signed by unknown authority"},
			},
			{
				name:    "verify-full with a CA that did not sign the server certificate",
				url:     pg.URL(pg.Host, pg.User, pg.Password, "sslmode=verify-full&"+otherCA),
				wantErr: []string{"x509: certificate signed by unknown authority"},
			},
			{
				name:    "verify-ca with a CA that did not sign the server certificate",
				url:     pg.URL(pg.Host, pg.User, pg.Password, "sslmode=verify-ca&"+otherCA),
				wantErr: []string{"x509: certificate signed by unknown authority"},
			},
			{
				name:    "require with a CA file verifies like verify-ca",
				url:     pg.URL(pg.Host, pg.User, pg.Password, "sslmode=require&"+otherCA),
				wantErr: []string{"x509: certificate signed by unknown authority"},
			},
			{
				name:    "verify-full to a host the certificate does not name",
				url:     pg.URL(pg.OtherHost, pg.User, pg.Password, "sslmode=verify-full&"+ca),
				wantErr: []string{"x509: certificate is valid for", "not " + pg.OtherHost},
			},
			{
				name:    "wrong password",
				url:     pg.URL(pg.Host, pg.User, wrongPassword, "sslmode=verify-full&"+ca),
				wantErr: []string{"password authentication failed for user", "SQLSTATE 28P01"},
			},
			{
				name:    "certificate user without a client certificate",
				url:     pg.URL(pg.Host, pg.CertUser, "", "sslmode=verify-full&"+ca),
				wantErr: []string{"connection requires a valid client certificate", "SQLSTATE 28000"},
			},
			{
				name:    "sslrootcert names a missing file",
				url:     pg.URL(pg.Host, pg.User, pg.Password, "sslmode=verify-full&sslrootcert=%2Fnonexistent%2Fca.pem"),
				wantErr: []string{"postgres.url", "unable to read CA file", "/nonexistent/ca.pem"},
				config:  true,
			},
		} {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
				defer cancel()
				cfg := bus.Config{Postgres: bus.PostgresConfig{URL: tc.url}}
				b, err := omnibus.Open(ctx, cfg)
				if b != nil {
					_ = b.Close()
				}
				require.Error(t, err, "Open must fail")
				for _, want := range tc.wantErr {
					assert.Contains(t, err.Error(), want, "the error must name the problem")
				}
				assert.Equal(t, tc.config, errors.Is(err, bus.ErrInvalidConfig), "only a bad postgres.url is a config error: %v", err)
				assert.NotEqual(t, bus.ClassTransient, bus.ClassOf(err),
					"waiting will not fix this, so it must not be transient (the CLI would wait for ever): %v", err)
				assertNoSecret(t, cfg, err, pg.Password, wrongPassword)
			})
		}
	})
}

// assertNoSecret checks that none of secrets appears in err, in the config
// as printed (String, %v, %#v), redacted, or logged with slog.
func assertNoSecret(t *testing.T, cfg bus.Config, err error, secrets ...string) {
	t.Helper()
	var logged bytes.Buffer
	slog.New(slog.NewTextHandler(&logged, nil)).Info("config", "config", cfg)
	shown := map[string]string{
		"String":       cfg.String(),
		"%v":           fmt.Sprintf("%v", cfg),
		"%#v":          fmt.Sprintf("%#v", cfg),
		"Redacted URL": cfg.Redacted().Postgres.URL,
		"slog":         logged.String(),
	}
	if err != nil {
		shown["error"] = err.Error()
	}
	for where, text := range shown {
		for _, s := range secrets {
			assert.NotContains(t, text, s, "the password must not show in %s", where)
		}
	}
}
