package console

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/transports/postgres"
)

// DefaultRefreshInterval is how often the overview refreshes itself.
const DefaultRefreshInterval = 5 * time.Second

// DefaultListen is where `omnibus console` listens: loopback only.
const DefaultListen = "127.0.0.1:8090"

// csrfCookie holds the browser's random CSRF secret; forms carry its HMAC.
const csrfCookie = "omnibus_console_csrf"

//go:embed assets
var assetsFS embed.FS

//go:embed templates
var templatesFS embed.FS

// Config configures a Console.
type Config struct {
	// Tables are the outbox and inbox tables shown, one Admin each, not
	// restricted to a consumer group (the console lists an inbox's groups by
	// itself). At least one is required; table names must be distinct.
	Tables []*postgres.Admin
	// ReadOnly hides every action and refuses every POST.
	ReadOnly bool
	// Token, when set, must come with every request: as a bearer token
	// (Authorization: Bearer …) or as the password of HTTP basic auth (any
	// user name, so a browser can send it).
	Token string
	// BasicAuthUser and BasicAuthPassword, when set (both or neither), must
	// come with every request as HTTP basic auth.
	BasicAuthUser, BasicAuthPassword string
	// RefreshInterval is how often the overview reloads its figures in the
	// browser. Default DefaultRefreshInterval.
	RefreshInterval time.Duration
}

// HasAuth reports whether requests must authenticate (a token or basic auth
// is configured).
func (c Config) HasAuth() bool { return c.Token != "" || c.BasicAuthUser != "" }

// Validate reports the first invalid field.
func (c Config) Validate() error {
	if len(c.Tables) == 0 {
		return errors.New("invalid config: Tables: at least one table is required")
	}
	seen := map[string]bool{}
	for i, a := range c.Tables {
		switch {
		case a == nil:
			return fmt.Errorf("invalid config: Tables[%d]: nil Admin", i)
		case a.ConsumerGroup() != "":
			return fmt.Errorf("invalid config: Tables[%d]: Admin of %q is restricted to group %q; pass the table's Admin",
				i, a.Table().Name, a.ConsumerGroup())
		case seen[a.Table().Name]:
			return fmt.Errorf("invalid config: Tables[%d]: table %q appears twice", i, a.Table().Name)
		}
		seen[a.Table().Name] = true
	}
	if (c.BasicAuthUser == "") != (c.BasicAuthPassword == "") {
		return errors.New("invalid config: BasicAuthUser, BasicAuthPassword: set both or neither")
	}
	if c.RefreshInterval < 0 {
		return fmt.Errorf("invalid config: RefreshInterval: must not be negative, got %s", c.RefreshInterval)
	}
	return nil
}

// ValidateListen refuses a listen address that is not loopback when no
// token or basic auth is configured: the console can requeue and delete
// rows, so it is never open to the network by accident.
func (c Config) ValidateListen(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("listen address %q: %w", addr, err)
	}
	if isLoopback(host) || c.HasAuth() {
		return nil
	}
	return fmt.Errorf("listen address %q is not a loopback address: the console needs a token or basic auth to listen there", addr)
}

func isLoopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Console is the admin web console: an http.Handler serving server-rendered
// pages over the tables' postgres.Admin. It is safe for concurrent use.
type Console struct {
	cfg     Config
	log     *slog.Logger
	tables  []*postgres.Admin
	pages   map[string]*pageTemplate
	csrfKey []byte
	handler http.Handler

	// Sparklines are computed in the background, at most once per bucket.
	sparkMu sync.Mutex
	sparks  map[string]*sparkEntry
	ctx     context.Context // ends at Close
	cancel  context.CancelFunc
	wg      sync.WaitGroup
}

// New validates cfg and builds the console. A nil logger means no logging.
func New(cfg Config, logger *slog.Logger) (*Console, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.RefreshInterval == 0 {
		cfg.RefreshInterval = DefaultRefreshInterval
	}
	pages, err := parsePages()
	if err != nil {
		return nil, fmt.Errorf("console templates: %w", err)
	}
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return nil, fmt.Errorf("console CSRF key: %w", err)
	}
	c := &Console{cfg: cfg, log: bus.LoggerOrNop(logger), tables: cfg.Tables, pages: pages, csrfKey: key,
		sparks: map[string]*sparkEntry{}}
	c.ctx, c.cancel = context.WithCancel(context.Background())

	static, err := fs.Sub(assetsFS, "assets")
	if err != nil {
		return nil, fmt.Errorf("console assets: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	mux.HandleFunc("GET /{$}", c.overview)
	mux.HandleFunc("GET /live", c.overviewLive)
	mux.HandleFunc("GET /held", c.held)
	mux.HandleFunc("GET /failed", c.failed)
	mux.HandleFunc("GET /row", c.row)
	mux.HandleFunc("GET /relays", c.relays)
	mux.HandleFunc("POST /action", c.action)
	c.handler = c.secure(http.NewCrossOriginProtection().Handler(mux))
	return c, nil
}

// Close stops the console's background work (sparkline queries) and waits
// for it. It does not close the Admins' pool, which stays the caller's.
func (c *Console) Close() error {
	c.cancel()
	c.wg.Wait()
	return nil
}

// ServeHTTP serves the console's pages.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) { c.handler.ServeHTTP(w, r) }

// secure authenticates the request when auth is configured and sets the
// headers that keep pages from being framed or loading anything foreign.
func (c *Console) secure(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; form-action 'self'; base-uri 'none'")
		h.Set("X-Frame-Options", "DENY")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cache-Control", "no-store")
		if c.cfg.HasAuth() && !c.authenticated(r) {
			h.Set("WWW-Authenticate", `Basic realm="omnibus console", charset="UTF-8"`)
			http.Error(w, "authentication required", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}

func (c *Console) authenticated(r *http.Request) bool {
	if c.cfg.Token != "" {
		if tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok && equal(tok, c.cfg.Token) {
			return true
		}
		if _, pw, ok := r.BasicAuth(); ok && equal(pw, c.cfg.Token) {
			return true
		}
	}
	if c.cfg.BasicAuthUser != "" {
		user, pw, ok := r.BasicAuth()
		// Both compared, always, so the time taken tells nothing.
		u, p := equal(user, c.cfg.BasicAuthUser), equal(pw, c.cfg.BasicAuthPassword)
		if ok && u && p {
			return true
		}
	}
	return false
}

func equal(a, b string) bool {
	ha, hb := sha256.Sum256([]byte(a)), sha256.Sum256([]byte(b))
	return subtle.ConstantTimeCompare(ha[:], hb[:]) == 1
}

// csrfToken returns the token forms of this response carry, setting the
// browser's CSRF cookie when it has none.
func (c *Console) csrfToken(w http.ResponseWriter, r *http.Request) string {
	secret := ""
	if ck, err := r.Cookie(csrfCookie); err == nil && len(ck.Value) == 64 {
		secret = ck.Value
	} else {
		b := make([]byte, 32)
		_, _ = rand.Read(b)
		secret = hex.EncodeToString(b)
		http.SetCookie(w, &http.Cookie{Name: csrfCookie, Value: secret, Path: "/", HttpOnly: true,
			SameSite: http.SameSiteStrictMode})
	}
	return c.sign(secret)
}

func (c *Console) sign(secret string) string {
	m := hmac.New(sha256.New, c.csrfKey)
	m.Write([]byte(secret))
	return hex.EncodeToString(m.Sum(nil))
}

// checkCSRF reports whether the form's token matches the browser's cookie.
func (c *Console) checkCSRF(r *http.Request) bool {
	ck, err := r.Cookie(csrfCookie)
	if err != nil || ck.Value == "" {
		return false
	}
	return hmac.Equal([]byte(r.PostFormValue("csrf")), []byte(c.sign(ck.Value)))
}

// admin returns the Admin the request's t (table) and g (consumer group)
// name.
func (c *Console) admin(r *http.Request) (*postgres.Admin, error) {
	name, group := r.FormValue("t"), r.FormValue("g")
	for _, a := range c.tables {
		if a.Table().Name != name {
			continue
		}
		if group == "" {
			return a, nil
		}
		return a.WithConsumerGroup(group)
	}
	return nil, fmt.Errorf("no table %q in this console", name)
}
