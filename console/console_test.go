package console_test

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omnibus-go/omnibus/console"
	"github.com/omnibus-go/omnibus/internal/testenv"
	"github.com/omnibus-go/omnibus/middleware"
	"github.com/omnibus-go/omnibus/transports/postgres"
)

func TestOverview_CountsEveryTableAndConsumerGroup(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	ctx := context.Background()
	f.failedRows("orders", "o-1", postgres.FailedSkip, "poison-1")
	f.enqueue("orders", msg("o-2", "due", 0))
	later := msg("o-3", "later", 0)
	postgres.SetDeliverAt(later, time.Now().Add(time.Hour))
	f.enqueue("orders", later)
	_, err := f.in.StoreWith(ctx, f.pool, postgres.StoreOptions{Group: "billing", Topic: "orders"}, msg("k", "in-1", 0), msg("k", "in-2", 0))
	require.NoError(t, err)

	code, body := f.get("/")
	require.Equal(t, http.StatusOK, code, body)
	for class, want := range map[string]string{"pending": "2", "due": "1", "delayed": "1", "failed": "1", "completed": "0", "leased": "0"} {
		assert.Equal(t, want, cell(t, body, f.outbox, "", class), "outbox %s", class)
	}
	assert.Equal(t, "2", cell(t, body, f.inbox, "", "pending"), "inbox, every group")
	assert.Equal(t, "2", cell(t, body, f.inbox, "billing", "pending"), "inbox group billing is listed with its rows")
	assert.Equal(t, "–", cell(t, body, f.inbox, "billing", "completed"), "a group's completed rows are not counted")
	assert.Contains(t, body, `data-live="/live"`, "the overview refreshes itself from /live")
	testenv.Eventually(t, 30*time.Second, func() bool {
		_, body := f.get("/live")
		return strings.Contains(body, "<polyline")
	}, "a throughput sparkline to be drawn")
}

func TestOverviewLive_ServesTheFiguresAsTheyAreNow(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	_, body := f.get("/live")
	assert.Equal(t, "0", cell(t, body, f.outbox, "", "pending"))
	assert.NotContains(t, body, "<html", "the refresh is a fragment, not a page")

	f.enqueue("orders", msg("k", "one", 0))
	_, body = f.get("/live")
	assert.Equal(t, "1", cell(t, body, f.outbox, "", "pending"), "a row written since is counted")
}

func TestOverview_CompletedRowsAndThroughputCountDeliveries(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	tgt := &target{}
	f.relay(tgt, postgres.FailedSkip, middleware.NoDelay)
	f.enqueue("orders", msg("a", "1", 0), msg("a", "2", 0), msg("b", "3", 0))
	testenv.Eventually(t, 30*time.Second, func() bool { return f.overview(f.outAdm).Completed == 3 }, "3 rows completed")
	_, body := f.get("/")
	assert.Equal(t, "3", cell(t, body, f.outbox, "", "completed"))
	// The sparkline is computed in the background, then shown.
	testenv.Eventually(t, 30*time.Second, func() bool {
		_, body := f.get("/live")
		return cell(t, body, f.outbox, "", "spark") == "3"
	}, "the last hour's sparkline to total the 3 deliveries")
}

func TestHeldKeys_ListsRetryingAndBlockedKeysWithTheirHeadRow(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	blockedID, _ := f.blockedKey("payments", "acct-1")
	// A key whose head fails and waits an hour for its retry.
	f.enqueue("orders", msg("o-9", "poison-retrying", 5))
	stop := f.relay(&target{fail: failing}, postgres.FailedBlock, time.Hour)
	testenv.Eventually(t, 30*time.Second, func() bool { return f.overview(f.outAdm).HeldKeys == 1 }, "the orders key to be held")
	stop()

	code, body := f.get("/held")
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, `data-key="acct-1"`)
	assert.Contains(t, body, "blocked (Block policy)")
	assert.Contains(t, body, fmt.Sprintf(`href="/row?id=%d&amp;t=%s"`, blockedID, f.outbox), "the blocked key links to its failed head row")
	assert.Contains(t, body, `data-key="o-9"`)
	assert.Contains(t, body, "retrying")
	assert.Contains(t, body, "broker refused poison-retrying", "the head&#39;s last error is shown")
	assert.Less(t, strings.Index(body, `data-key="acct-1"`), strings.Index(body, `data-key="o-9"`), "the key held longest comes first")

	_, body = f.get("/held?topic=orders")
	assert.Contains(t, body, `data-key="o-9"`)
	assert.NotContains(t, body, `data-key="acct-1"`, "the topic filter keeps other topics' keys out")
}

func TestFailed_FiltersByTopicKeyErrorAndTime(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	f.failedRows("orders", "o-1", postgres.FailedSkip, "poison-a")
	f.failedRows("payments", "p-1", postgres.FailedSkip, "poison-b")
	tbl := "t=" + f.outbox

	for _, tc := range []struct {
		name, query string
		want        []string
		notWant     []string
	}{
		{"no filter", "", []string{"poison-a", "poison-b"}, nil},
		{"topic", "&topic=orders", []string{"poison-a"}, []string{"poison-b"}},
		{"key", "&key=p-1", []string{"poison-b"}, []string{"poison-a"}},
		{"error text, any case", "&error=REFUSED+POISON-B", []string{"poison-b"}, []string{"poison-a"}},
		{"created before a past time", "&to=2000-01-01T00:00", nil, []string{"poison-a", "poison-b"}},
		{"created from a past time", "&from=2000-01-01T00:00", []string{"poison-a", "poison-b"}, nil},
	} {
		code, body := f.get("/failed?" + tbl + tc.query)
		require.Equal(t, http.StatusOK, code, tc.name)
		for _, w := range tc.want {
			assert.Contains(t, body, "broker refused "+w, tc.name)
		}
		for _, w := range tc.notWant {
			assert.NotContains(t, body, "broker refused "+w, tc.name)
		}
		assert.Contains(t, body, fmt.Sprintf(`<p id="matching">%d failed row(s)`, len(tc.want)), tc.name)
	}

	code, body := f.get("/failed?" + tbl + "&from=yesterday")
	assert.Equal(t, http.StatusBadRequest, code)
	assert.Contains(t, body, "from: not a time like 2006-01-02T15:04 (UTC)")
	code, body = f.get("/failed?t=nope")
	assert.Equal(t, http.StatusBadRequest, code)
	assert.Contains(t, body, `no table &#34;nope&#34; in this console`)
}

func TestFailed_PagesFiftyRowsAtATime(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	payloads := make([]string, 51)
	for i := range payloads {
		payloads[i] = fmt.Sprintf("poison-%02d", i)
	}
	ids := f.failedRows("orders", "", postgres.FailedSkip, payloads...)
	require.Len(t, ids, 51)

	_, body := f.get("/failed?t=" + f.outbox)
	assert.Equal(t, 50, strings.Count(body, `class="failed-row"`))
	next := fmt.Sprintf(`after=%d`, ids[49])
	require.Contains(t, body, next, "a next page link starts after the page's last row")
	_, body = f.get("/failed?t=" + f.outbox + "&" + next)
	assert.Equal(t, 1, strings.Count(body, `class="failed-row"`))
	assert.Contains(t, body, fmt.Sprintf(`data-id="%d"`, ids[50]))
	assert.NotContains(t, body, `id="next-page"`)
}

func TestRow_ShowsColumnsPrettyPayloadAndTheBlock(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	f.enqueue("payments", msg("acct-1", `{"amount":12,"currency":"EUR"}`, 1), msg("acct-1", "\x00raw\xff", 0))
	stop := f.relay(&target{fail: func(p string) error {
		if strings.HasPrefix(p, "{") {
			return fmt.Errorf("broker <b>down</b>")
		}
		return nil
	}}, postgres.FailedBlock, middleware.NoDelay)
	testenv.Eventually(t, 30*time.Second, func() bool { return f.overview(f.outAdm).BlockedKeys == 1 }, "the key to be blocked")
	stop()
	failedID, pendingID := f.idOf(`{"amount":12,"currency":"EUR"}`), f.idOf("\x00raw\xff")

	code, body := f.get(fmt.Sprintf("/row?t=%s&id=%d", f.outbox, failedID))
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, "{\n  &#34;amount&#34;: 12,\n  &#34;currency&#34;: &#34;EUR&#34;\n}", "a JSON payload is indented")
	assert.Contains(t, body, "broker &lt;b&gt;down&lt;/b&gt;", "the error text is escaped, never markup")
	assert.Contains(t, body, `id="blocked"`, "a key blocked behind the row says so")
	assert.Contains(t, body, "requeueing it lifts the block")
	assert.Contains(t, body, `id="requeue"`)
	assert.Contains(t, body, `id="discard"`)

	code, body = f.get(fmt.Sprintf("/row?t=%s&id=%d", f.outbox, pendingID))
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, `\x00raw\xff`, "bytes that are not text are shown escaped")
	assert.NotContains(t, body, `id="requeue"`, "a pending row offers no requeue")

	code, body = f.get(fmt.Sprintf("/row?t=%s&id=%d", f.outbox, pendingID+100))
	assert.Equal(t, http.StatusNotFound, code)
	assert.Contains(t, body, fmt.Sprintf("no row %d in %s", pendingID+100, f.outbox))
	code, _ = f.get(fmt.Sprintf("/row?t=%s&id=x", f.outbox))
	assert.Equal(t, http.StatusBadRequest, code)
}

func TestAction_RequeueOneConfirmsThenRequeuesAndTheRelayDelivers(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	failedID, _ := f.blockedKey("payments", "acct-1")
	form := url.Values{"csrf": {f.csrf()}, "action": {"requeue"}, "t": {f.outbox}, "id": {strconv.FormatInt(failedID, 10)}, "back": {"/failed"}}

	code, body := f.post(form)
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, `id="confirm"`, "an action asks for confirmation first")
	assert.Contains(t, body, "requeueing row "+strconv.FormatInt(failedID, 10)+" lifts the block", "a blocked key's note says requeueing lifts the block")
	assert.EqualValues(t, 1, f.overview(f.outAdm).Failed, "nothing happens before the confirmation")

	form.Set("confirm", "yes")
	code, body = f.post(form)
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, "Requeued 1 of 1 row(s) of "+f.outbox)
	o := f.overview(f.outAdm)
	assert.EqualValues(t, 0, o.Failed)
	assert.EqualValues(t, 2, o.Pending, "the requeued row and the one behind it")

	tgt := &target{}
	f.relay(tgt, postgres.FailedBlock, middleware.NoDelay)
	testenv.Eventually(t, 30*time.Second, func() bool { return tgt.got("poison") && tgt.got("behind") }, "the requeued row and the one behind it to be delivered")

	code, body = f.post(form)
	require.Equal(t, http.StatusOK, code)
	assert.Contains(t, body, "no failed row has this id", "requeueing it again reports that it is no longer failed")
}

func TestAction_RequeueSelectionAndAllMatching(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	a := f.failedRows("orders", "o-1", postgres.FailedSkip, "poison-1", "poison-2")
	b := f.failedRows("payments", "p-1", postgres.FailedSkip, "poison-3")
	f.failedRows("payments", "p-2", postgres.FailedSkip, "poison-4")
	token := f.csrf()

	code, body := f.post(url.Values{"csrf": {token}, "action": {"requeue"}, "confirm": {"yes"}, "t": {f.outbox},
		"id": {strconv.FormatInt(a[0], 10), strconv.FormatInt(b[0], 10)}})
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, "Requeued 2 of 2 row(s)")
	assert.EqualValues(t, 2, f.overview(f.outAdm).Failed)

	code, body = f.post(url.Values{"csrf": {token}, "action": {"requeue-matching"}, "t": {f.outbox}, "topic": {"orders"}})
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, "Requeue the 1 failed row(s) of "+f.outbox+" that match topic &#34;orders&#34;")
	code, body = f.post(url.Values{"csrf": {token}, "action": {"requeue-matching"}, "confirm": {"yes"}, "t": {f.outbox}, "topic": {"orders"}})
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, "Requeued 1 failed row(s)")
	rows, err := f.outAdm.ListFailed(context.Background(), 10, 0)
	require.NoError(t, err)
	require.Len(t, rows, 1, "the filter kept the payments row failed")
	assert.Equal(t, "p-2", rows[0].PartitionKey)

	code, body = f.post(url.Values{"csrf": {token}, "action": {"requeue-matching"}, "confirm": {"yes"}, "t": {f.outbox}})
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, "Requeued 1 failed row(s)")
	assert.EqualValues(t, 0, f.overview(f.outAdm).Failed)

	code, body = f.post(url.Values{"csrf": {token}, "action": {"requeue"}, "t": {f.outbox}})
	assert.Equal(t, http.StatusBadRequest, code)
	assert.Contains(t, body, "requeue: select at least one row")
	code, body = f.post(url.Values{"csrf": {token}, "action": {"requeue"}, "t": {f.outbox}, "id": {"x"}})
	assert.Equal(t, http.StatusBadRequest, code)
	assert.Contains(t, body, "requeue: &#34;x&#34; is not a row id")
	code, _ = f.post(url.Values{"csrf": {token}, "action": {"explode"}, "t": {f.outbox}})
	assert.Equal(t, http.StatusBadRequest, code)
}

func TestAction_DiscardDeletesTheFailedRowAndLiftsTheBlock(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	failedID, behindID := f.blockedKey("payments", "acct-1")
	token := f.csrf()

	// A pending row is never discarded.
	code, body := f.post(url.Values{"csrf": {token}, "action": {"discard"}, "confirm": {"yes"}, "t": {f.outbox},
		"id": {strconv.FormatInt(behindID, 10)}})
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, "Discarded 0 of 1 row(s)")
	assert.Contains(t, body, "no failed row has this id")
	row, err := f.outAdm.Row(context.Background(), behindID)
	require.NoError(t, err)
	assert.Equal(t, "pending", row.Status)

	form := url.Values{"csrf": {token}, "action": {"discard"}, "t": {f.outbox}, "id": {strconv.FormatInt(failedID, 10)}}

	code, body = f.post(form)
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, "deleted for good")
	assert.Contains(t, body, "discarding row "+strconv.FormatInt(failedID, 10)+" lifts the block")
	form.Set("confirm", "yes")
	code, body = f.post(form)
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, "Discarded 1 of 1 row(s)")
	assert.Contains(t, f.logs.String(), "discarded a failed row", "a discard is logged with the row's event id")

	_, err = f.outAdm.Row(context.Background(), failedID)
	assert.ErrorIs(t, err, postgres.ErrNotFound, "the row is gone")
	tgt := &target{}
	f.relay(tgt, postgres.FailedBlock, middleware.NoDelay)
	testenv.Eventually(t, 30*time.Second, func() bool { return tgt.got("behind") }, "the row behind the discarded one to be delivered")
}

func TestAction_RefusedWithoutAValidCSRFToken(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	ids := f.failedRows("orders", "o-1", postgres.FailedSkip, "poison-1")
	form := url.Values{"action": {"requeue"}, "confirm": {"yes"}, "t": {f.outbox}, "id": {strconv.FormatInt(ids[0], 10)}}
	_ = f.csrf() // the browser has its cookie

	for name, token := range map[string]string{"missing": "", "forged": strings.Repeat("ab", 32)} {
		form.Set("csrf", token)
		code, body := f.post(form)
		assert.Equal(t, http.StatusForbidden, code, name)
		assert.Contains(t, body, "invalid or missing CSRF token", name)
	}
	// A token from another browser (another cookie) is refused as well.
	other := newFixtureClient(t, f)
	form.Set("csrf", f.csrf())
	resp, err := other.PostForm(f.srv.URL+"/action", form)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusForbidden, resp.StatusCode, "a token is good only with its own cookie")

	assert.EqualValues(t, 1, f.overview(f.outAdm).Failed, "no refused action changed anything")
}

func TestReadOnly_HidesEveryActionAndRefusesPosts(t *testing.T) {
	t.Parallel()
	f := newFixture(t, func(c *console.Config) { c.ReadOnly = true })
	ids := f.failedRows("payments", "acct-1", postgres.FailedBlock, "poison-1")
	id := strconv.FormatInt(ids[0], 10)

	for _, path := range []string{"/", "/held", "/failed?t=" + f.outbox, "/row?t=" + f.outbox + "&id=" + id, "/relays"} {
		code, body := f.get(path)
		require.Equal(t, http.StatusOK, code, path)
		assert.NotContains(t, body, "<form method=\"post\"", "%s shows no action", path)
		assert.NotContains(t, body, `type="checkbox"`, path)
		assert.Contains(t, body, `id="read-only"`, path)
	}
	code, body := f.post(url.Values{"action": {"requeue"}, "confirm": {"yes"}, "t": {f.outbox}, "id": {id}})
	assert.Equal(t, http.StatusForbidden, code)
	assert.Contains(t, body, "the console is read-only")
	assert.EqualValues(t, 1, f.overview(f.outAdm).Failed)
}

func TestRelays_ListsLeaseHoldersAndRunsTheirActions(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	release := make(chan struct{})
	held := &target{fail: func(string) error { <-release; return nil }}
	f.enqueue("orders", msg("o-1", "slow", 0))
	f.relay(held, postgres.FailedSkip, middleware.NoDelay)
	testenv.Eventually(t, 30*time.Second, func() bool { return f.overview(f.outAdm).Leased == 1 }, "the relay to lease the row")

	code, body := f.get("/relays")
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, "relay-"+f.outbox, "the relay instance holding the lease is listed")
	assert.Contains(t, body, "live")
	close(release)

	token := f.csrf()
	for action, want := range map[string]string{
		"release-leases": "Released the expired leases of 0 row(s) and 0 lane(s) of " + f.outbox,
		"sweep-lanes":    "Created 0 missing lane(s) in " + f.outbox,
	} {
		code, body := f.post(url.Values{"csrf": {token}, "action": {action}, "confirm": {"yes"}, "t": {f.outbox}})
		require.Equal(t, http.StatusOK, code, body)
		assert.Contains(t, body, want, action)
	}
}

func TestAuth_TokenOrBasicAuthRequiredWhenConfigured(t *testing.T) {
	t.Parallel()
	f := newFixture(t, func(c *console.Config) {
		c.Token = "tok-secret"
		c.BasicAuthUser, c.BasicAuthPassword = "ops", "pw-secret"
	})
	for _, tc := range []struct {
		name string
		set  func(*http.Request)
		want int
	}{
		{"none", func(*http.Request) {}, http.StatusUnauthorized},
		{"bearer token", func(r *http.Request) { r.Header.Set("Authorization", "Bearer tok-secret") }, http.StatusOK},
		{"wrong bearer token", func(r *http.Request) { r.Header.Set("Authorization", "Bearer nope") }, http.StatusUnauthorized},
		{"token as basic auth password", func(r *http.Request) { r.SetBasicAuth("anyone", "tok-secret") }, http.StatusOK},
		{"basic auth", func(r *http.Request) { r.SetBasicAuth("ops", "pw-secret") }, http.StatusOK},
		{"basic auth, wrong user", func(r *http.Request) { r.SetBasicAuth("root", "pw-secret") }, http.StatusUnauthorized},
	} {
		req, err := http.NewRequest(http.MethodGet, f.srv.URL+"/", nil)
		require.NoError(t, err)
		tc.set(req)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, tc.want, resp.StatusCode, tc.name)
	}
}

func TestConfig_ValidateListenRefusesAnOpenBindWithoutAuth(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		addr string
		auth bool
		ok   bool
	}{
		{"127.0.0.1:8090", false, true},
		{"localhost:8090", false, true},
		{"[::1]:8090", false, true},
		{"0.0.0.0:8090", false, false},
		{":8090", false, false},
		{"10.1.2.3:8090", false, false},
		{"0.0.0.0:8090", true, true},
		{"no-port", false, false},
	} {
		cfg := console.Config{}
		if tc.auth {
			cfg.Token = "t"
		}
		err := cfg.ValidateListen(tc.addr)
		if tc.ok {
			assert.NoError(t, err, tc.addr)
		} else {
			assert.Error(t, err, tc.addr)
		}
	}
}

func TestNew_RefusesBadConfig(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	grouped, err := f.inAdm.WithConsumerGroup("billing")
	require.NoError(t, err)
	for name, cfg := range map[string]console.Config{
		"no tables":        {},
		"group admin":      {Tables: []*postgres.Admin{grouped}},
		"table twice":      {Tables: []*postgres.Admin{f.outAdm, f.outAdm}},
		"half basic auth":  {Tables: []*postgres.Admin{f.outAdm}, BasicAuthUser: "ops"},
		"negative refresh": {Tables: []*postgres.Admin{f.outAdm}, RefreshInterval: -time.Second},
	} {
		_, err := console.New(cfg, nil)
		assert.ErrorContains(t, err, "invalid config", name)
	}
}

func TestPages_ShowNoSecretAndHideDatabaseErrors(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	f.failedRows("orders", "o-1", postgres.FailedSkip, "poison-1")
	// An Admin of a table that does not exist: its queries fail.
	missing, err := postgres.NewAdmin(f.pool, postgres.OutboxTable(f.outbox+"_missing"))
	require.NoError(t, err)
	c, err := console.New(console.Config{Tables: []*postgres.Admin{missing, f.outAdm}}, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	srv := newServer(t, c)

	_, body := getURL(t, srv+"/")
	assert.Contains(t, body, "This table does not exist: run <code>omnibus migrate</code>.")
	code, body := getURL(t, srv+"/held")
	assert.Equal(t, http.StatusInternalServerError, code)
	assert.Contains(t, body, "the database query failed; see the console&#39;s log")
	assert.NotContains(t, body, "relation", "the database's error text is logged, not shown")

	dsn := f.pool.Config().ConnString()
	for _, path := range []string{"/", "/held", "/failed?t=" + f.outbox, "/relays", "/live"} {
		_, body := f.get(path)
		assert.NotContains(t, body, dsn, path)
		assert.NotContains(t, body, "postgres://", path)
	}
}
