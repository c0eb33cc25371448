package console_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/console"
	"github.com/omnibus-go/omnibus/internal/testenv"
	"github.com/omnibus-go/omnibus/middleware"
	"github.com/omnibus-go/omnibus/processors"
	"github.com/omnibus-go/omnibus/transports/postgres"
)

// fixture is an outbox and an inbox table of the test's own, their Admins
// and a console serving them.
type fixture struct {
	t             *testing.T
	pool          *pgxpool.Pool
	outbox, inbox string
	ob            *postgres.Outbox
	in            *postgres.Inbox
	outAdm, inAdm *postgres.Admin
	srv           *httptest.Server
	client        *http.Client
	logs          *testenv.LogBuffer
}

func newFixture(t *testing.T, configure func(*console.Config)) *fixture {
	t.Helper()
	f := &fixture{t: t, pool: testenv.Postgres(t), logs: &testenv.LogBuffer{}}
	name := testenv.Name(t)
	if len(name) > 34 { // leave room for the suffixes within PostgreSQL's name limit
		name = "c" + name[len(name)-33:]
	}
	testenv.DropPostgresPrefix(t, name)
	f.outbox, f.inbox = name+"_out", name+"_in"
	ctx := context.Background()
	require.NoError(t, postgres.Migrate(ctx, f.pool, postgres.OutboxTable(f.outbox), postgres.InboxTable(f.inbox)))
	var err error
	f.ob, err = postgres.NewOutbox(postgres.OutboxConfig{Table: f.outbox})
	require.NoError(t, err)
	f.in, err = postgres.NewInbox(postgres.InboxConfig{Table: f.inbox})
	require.NoError(t, err)
	f.outAdm, err = postgres.NewAdmin(f.pool, postgres.OutboxTable(f.outbox))
	require.NoError(t, err)
	f.inAdm, err = postgres.NewAdmin(f.pool, postgres.InboxTable(f.inbox))
	require.NoError(t, err)
	cfg := console.Config{Tables: []*postgres.Admin{f.outAdm, f.inAdm}, RefreshInterval: 200 * time.Millisecond}
	if configure != nil {
		configure(&cfg)
	}
	c, err := console.New(cfg, slog.New(slog.NewTextHandler(f.logs, nil)))
	require.NoError(t, err)
	f.srv = httptest.NewServer(c)
	t.Cleanup(func() { f.srv.Close(); _ = c.Close() })
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	f.client = &http.Client{Jar: jar}
	return f
}

// enqueue writes messages to the outbox under topic.
func (f *fixture) enqueue(topic string, msgs ...*message.Message) {
	f.t.Helper()
	require.NoError(f.t, f.ob.Enqueue(context.Background(), f.pool, topic, msgs...))
}

// msg builds a message with payload p, key (may be empty) and max attempts
// (0: the default).
func msg(key, payload string, maxAttempts int) *message.Message {
	m := message.NewMessage(watermill.NewUUID(), []byte(payload))
	if key != "" {
		bus.SetPartitionKey(m, key)
	}
	if maxAttempts > 0 {
		postgres.SetMaxAttempts(m, maxAttempts)
	}
	return m
}

// target is a publisher that fails the payloads fail says and records the
// others.
type target struct {
	mu        sync.Mutex
	fail      func(payload string) error
	delivered []string
}

func (p *target) Publish(_ string, msgs ...*message.Message) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, m := range msgs {
		if p.fail != nil {
			if err := p.fail(string(m.Payload)); err != nil {
				return err
			}
		}
		p.delivered = append(p.delivered, string(m.Payload))
	}
	return nil
}

func (p *target) Close() error { return nil }

func (p *target) setFail(fail func(string) error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.fail = fail
}

func (p *target) got(payload string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, d := range p.delivered {
		if d == payload {
			return true
		}
	}
	return false
}

// failing fails every payload that starts with "poison".
func failing(payload string) error {
	if strings.HasPrefix(payload, "poison") {
		return errors.New("broker refused " + payload)
	}
	return nil
}

// relay runs an OutboxRelay over the fixture's outbox until the test ends or
// stop is called. Retries wait retryBase (NoDelay: none).
func (f *fixture) relay(tgt *target, policy postgres.FailedPolicy, retryBase time.Duration) (stop func()) {
	f.t.Helper()
	r, err := processors.NewOutboxRelay(f.pool, processors.OutboxRelayConfig{
		Publisher: tgt,
		Subscriber: postgres.SubscriberConfig{Table: f.outbox, FailedPolicy: policy, PollInterval: 50 * time.Millisecond,
			CloseTimeout: 5 * time.Second, WorkerID: "relay-" + f.outbox},
		Retry: middleware.RetryConfig{Base: retryBase, Cap: time.Hour},
		// Tests fail rows on purpose: keep the breaker from turning their
		// failures into transient ones.
		Breaker: middleware.CircuitBreakerConfig{FailureThreshold: 1 << 20},
	}, nil)
	require.NoError(f.t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				f.t.Errorf("relay: %v", err)
			}
		})
	}
	f.t.Cleanup(stop)
	return stop
}

// overview reads the outbox's (or a group's) overview through the Admin.
func (f *fixture) overview(a *postgres.Admin) postgres.Overview {
	f.t.Helper()
	o, err := a.Overview(context.Background())
	require.NoError(f.t, err)
	return o
}

// failedRows makes rows with these payloads fail for good through a relay
// (max attempts 1, Skip or Block policy), and returns their ids in order.
func (f *fixture) failedRows(topic, key string, policy postgres.FailedPolicy, payloads ...string) []int64 {
	f.t.Helper()
	before := f.overview(f.outAdm).Failed
	for _, p := range payloads {
		f.enqueue(topic, msg(key, p, 1))
	}
	stop := f.relay(&target{fail: func(p string) error { return errors.New("broker refused " + p) }}, policy, middleware.NoDelay)
	testenv.Eventually(f.t, 30*time.Second, func() bool { return f.overview(f.outAdm).Failed == before+int64(len(payloads)) }, "rows to fail")
	stop()
	rows, err := f.outAdm.ListFailedMatching(context.Background(), postgres.FailedFilter{Topic: topic, PartitionKey: key}, 1000, 0)
	require.NoError(f.t, err)
	var ids []int64
	for _, r := range rows {
		ids = append(ids, r.ID)
	}
	return ids
}

// blockedKey writes a row that fails for good and one behind it under key,
// and runs a relay with the Block policy until the key is blocked behind the
// failed row. It returns the two rows' ids.
func (f *fixture) blockedKey(topic, key string) (failedID, behindID int64) {
	f.t.Helper()
	f.enqueue(topic, msg(key, "poison", 1), msg(key, "behind", 0))
	stop := f.relay(&target{fail: failing}, postgres.FailedBlock, middleware.NoDelay)
	testenv.Eventually(f.t, 30*time.Second, func() bool {
		lane, ok, err := f.outAdm.Lane(context.Background(), "", topic, key)
		require.NoError(f.t, err)
		return ok && lane.Blocked
	}, "the key to be blocked")
	stop()
	return f.idOf("poison"), f.idOf("behind")
}

// idOf returns the id of the outbox row with payload p (test bookkeeping:
// the outbox API does not return ids).
func (f *fixture) idOf(p string) int64 {
	f.t.Helper()
	var id int64
	require.NoError(f.t, f.pool.QueryRow(context.Background(),
		`SELECT id FROM `+pgx.Identifier{f.outbox}.Sanitize()+` WHERE payload = $1`, []byte(p)).Scan(&id))
	return id
}

// get fetches path and returns the status and body.
func (f *fixture) get(path string) (int, string) {
	f.t.Helper()
	resp, err := f.client.Get(f.srv.URL + path)
	require.NoError(f.t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(f.t, err)
	return resp.StatusCode, string(b)
}

// post submits form to /action and returns the status and body.
func (f *fixture) post(form url.Values) (int, string) {
	f.t.Helper()
	resp, err := f.client.PostForm(f.srv.URL+"/action", form)
	require.NoError(f.t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(f.t, err)
	return resp.StatusCode, string(b)
}

var csrfRe = regexp.MustCompile(`name="csrf" value="([0-9a-f]+)"`)

// csrf loads a page with forms and returns the token they carry.
func (f *fixture) csrf() string {
	f.t.Helper()
	_, body := f.get("/relays")
	m := csrfRe.FindStringSubmatch(body)
	require.NotNil(f.t, m, "the relays page carries a CSRF token in its forms:\n%s", body)
	return m[1]
}

// cell returns the text of the cell class of the overview row of table and
// group in body.
func cell(t *testing.T, body, table, group, class string) string {
	t.Helper()
	start := strings.Index(body, `<tr data-table="`+table+`" data-group="`+group+`">`)
	require.GreaterOrEqual(t, start, 0, "no overview row for table %s group %q in:\n%s", table, group, body)
	row := body[start:]
	row = row[:strings.Index(row, "</tr>")]
	m := regexp.MustCompile(`<td class="` + class + `">(.*?)</td>`).FindStringSubmatch(row)
	require.NotNil(t, m, "no %s cell in row %s", class, row)
	return strings.TrimSpace(regexp.MustCompile(`<[^>]+>`).ReplaceAllString(m[1], ""))
}

// newFixtureClient is a second browser (its own cookies) on f's console.
func newFixtureClient(t *testing.T, f *fixture) *http.Client {
	t.Helper()
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	c := &http.Client{Jar: jar}
	resp, err := c.Get(f.srv.URL + "/relays")
	require.NoError(t, err)
	resp.Body.Close()
	return c
}

// newServer serves h for the test and returns its URL.
func newServer(t *testing.T, h http.Handler) string {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL
}

func getURL(t *testing.T, u string) (int, string) {
	t.Helper()
	resp, err := http.Get(u)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}
