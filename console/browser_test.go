package console_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omnibus-go/omnibus/console"
	"github.com/omnibus-go/omnibus/internal/testenv"
	"github.com/omnibus-go/omnibus/middleware"
	"github.com/omnibus-go/omnibus/transports/postgres"
)

// screenshotsEnv names the directory browser tests save page screenshots
// into; unset, a temporary directory of the test.
const screenshotsEnv = "OMNIBUS_CONSOLE_SCREENSHOTS"

// browser starts Debian's headless chromium for the test. A missing
// chromium fails the test: `make services` installs it.
func browser(t *testing.T) context.Context {
	t.Helper()
	path, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatalf("chromium is not installed (%v): the console's browser tests drive Debian's headless chromium.\n"+
			"Install it with `make services` (or `bash scripts/services.sh chromium`).", err)
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.NoSandbox, // tests run as root in CI
		chromedp.DisableGPU,
		chromedp.WindowSize(1400, 1000),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelTab := chromedp.NewContext(actx)
	t.Cleanup(func() { cancelTab(); cancelAlloc() })
	// The first run starts the browser; it must not carry the deadline.
	require.NoError(t, chromedp.Do(ctx), "start chromium at %s", path)
	ctx, cancelTime := context.WithTimeout(ctx, 2*time.Minute)
	t.Cleanup(cancelTime)
	return ctx
}

// clickNow clicks the element sel selects in one step inside the page, so
// a live refresh that replaces the element between finding and clicking it
// (chromedp.Click is several protocol calls) cannot make the click miss.
func clickNow(sel string) chromedp.Action[chromedp.Void] {
	return chromedp.Evaluate[chromedp.Void](fmt.Sprintf(`document.querySelector(%q).click()`, sel))
}

// do runs browser steps, failing the test on an error.
func do(t *testing.T, ctx context.Context, what string, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	require.NoError(t, chromedp.Do(ctx, steps...), what)
}

// shot saves a full-page screenshot of the current page as name.png.
func shot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	dir := os.Getenv(screenshotsEnv)
	if dir == "" {
		dir = t.TempDir()
	}
	require.NoError(t, os.MkdirAll(dir, 0o755))
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	require.NoError(t, err, "screenshot %s", name)
	require.NoError(t, os.WriteFile(filepath.Join(dir, name+".png"), png, 0o644))
}

// textOf reads the text of the first element matching the CSS selector
// sel; ok is false when there is none.
func textOf(ctx context.Context, sel string) (s string, ok bool, err error) {
	q, _ := json.Marshal(sel)
	var v *string
	v, err = chromedp.Run(ctx, chromedp.Evaluate[*string](
		fmt.Sprintf("(function(){ const e = document.querySelector(%s); return e ? e.textContent : null; })()", q)))
	if err != nil || v == nil {
		return "", false, err
	}
	return strings.TrimSpace(*v), true, nil
}

// text reads the text of the first element matching sel.
func text(t *testing.T, ctx context.Context, sel string) string {
	t.Helper()
	s, ok, err := textOf(ctx, sel)
	require.NoError(t, err, "read %s", sel)
	require.True(t, ok, "no element matches %s", sel)
	return s
}

// waitText polls the page (without reloading it) until sel's text is want.
func waitText(t *testing.T, ctx context.Context, sel, want, what string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		got, _, err := textOf(ctx, sel)
		if err == nil && got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %s reads %q, want %q (err %v)", what, sel, got, want, err)
		}
		time.Sleep(50 * time.Millisecond) // polling with a deadline
	}
}

// count evaluates a JavaScript expression that gives a number.
func count(t *testing.T, ctx context.Context, expr string) int {
	t.Helper()
	n, err := chromedp.Run(ctx, chromedp.Evaluate[int](expr))
	require.NoError(t, err, expr)
	return n
}

func TestBrowser_OperatorFollowsAHeldKeyRequeuesItAndSeesItDelivered(t *testing.T) {
	f := newFixture(t, nil)
	failedID, _ := f.blockedKey("payments", "acct-1")
	tgt := &target{}
	f.relay(tgt, postgres.FailedBlock, middleware.NoDelay) // delivers once the block is lifted
	ctx := browser(t)
	row := fmt.Sprintf(`tr[data-table=%q][data-group=""]`, f.outbox)

	do(t, ctx, "open the overview", chromedp.Navigate(f.srv.URL+"/"), chromedp.WaitVisible(chromedp.CSS("#live")))
	assert.Equal(t, "1", text(t, ctx, row+" td.failed"))
	assert.Equal(t, "1", text(t, ctx, row+" td.blocked"))
	assert.Equal(t, "1", text(t, ctx, row+" td.pending"), "the row behind the failed one waits")
	shot(t, ctx, "overview")

	// Overview → held keys → the key's failed head row.
	do(t, ctx, "browse",
		clickNow(row+" td.blocked a"), // the overview refreshes itself: find and click in one step
		chromedp.WaitVisible(chromedp.CSS(`tr.held-key[data-key="acct-1"]`)))
	assert.Contains(t, text(t, ctx, `tr.held-key[data-key="acct-1"]`), "blocked (Block policy)")
	shot(t, ctx, "held-keys")
	do(t, ctx, "browse",
		chromedp.Click(chromedp.CSS(`tr.held-key[data-key="acct-1"] a.head`)),
		chromedp.WaitVisible(chromedp.CSS("#status")))
	assert.Equal(t, "failed", text(t, ctx, "#status"))
	assert.Contains(t, text(t, ctx, "#blocked"), "requeueing it lifts the block")
	assert.Contains(t, text(t, ctx, "h1"), fmt.Sprintf("Row %d", failedID))
	shot(t, ctx, "row")

	// Requeue: confirmation, then the result.
	do(t, ctx, "browse",
		chromedp.Click(chromedp.CSS("#requeue")),
		chromedp.WaitVisible(chromedp.CSS("#confirm")))
	assert.Contains(t, text(t, ctx, "main"), "lifts the block")
	shot(t, ctx, "confirm")
	do(t, ctx, "browse",
		chromedp.Click(chromedp.CSS("#confirm")),
		chromedp.WaitVisible(chromedp.CSS("#message")))
	assert.Equal(t, fmt.Sprintf("Requeued 1 of 1 row(s) of %s.", f.outbox), text(t, ctx, "#message"))
	shot(t, ctx, "result")

	// The relay delivers the requeued row, then the one behind it; the
	// overview shows the counts change.
	testenv.Eventually(t, 30*time.Second, func() bool { return tgt.got("poison") && tgt.got("behind") }, "the relay to deliver both rows")
	tgt.mu.Lock()
	assert.Equal(t, []string{"poison", "behind"}, tgt.delivered, "the requeued head goes first, in key order")
	tgt.mu.Unlock()
	do(t, ctx, "open the overview", chromedp.Navigate(f.srv.URL+"/"), chromedp.WaitVisible(chromedp.CSS("#live")))
	waitText(t, ctx, row+" td.failed", "0", "failed count after the requeue")
	waitText(t, ctx, row+" td.completed", "2", "completed count after the delivery")
	waitText(t, ctx, row+" td.blocked", "0", "blocked keys after the requeue")

	// The overview refreshes itself: a row written now shows up without a
	// reload.
	later := msg("acct-2", "tomorrow", 0)
	postgres.SetDeliverAt(later, time.Now().Add(24*time.Hour))
	f.enqueue("payments", later)
	waitText(t, ctx, row+" td.delayed", "1", "the live overview counts the delayed row")
	updates, err := chromedp.Run(ctx, chromedp.AttributeValue(chromedp.CSS("#live"), "data-updates"))
	require.NoError(t, err)
	assert.NotEqual(t, "0", updates.Value, "the figures came from the page's own refresh")
	shot(t, ctx, "overview-after")

	// The failed rows and relays pages, for the record.
	do(t, ctx, "open the relays page", chromedp.Navigate(f.srv.URL+"/relays"), chromedp.WaitVisible(chromedp.CSS("main h1")))
	shot(t, ctx, "relays")
}

func TestBrowser_AForgedCSRFTokenIsRefused(t *testing.T) {
	f := newFixture(t, nil)
	ids := f.failedRows("orders", "o-1", postgres.FailedSkip, "poison-1")
	ctx := browser(t)

	do(t, ctx, "browse",
		chromedp.Navigate(f.srv.URL+"/failed?t="+f.outbox),
		chromedp.WaitVisible(chromedp.CSS("#selection")))
	shot(t, ctx, "failed")
	do(t, ctx, "browse",
		chromedp.Click(chromedp.CSS(fmt.Sprintf(`#selection input[name=id][value="%d"]`, ids[0]))),
		chromedp.SetValue(chromedp.CSS(`#selection input[name=csrf]`), strings.Repeat("0", 64)),
		chromedp.Click(chromedp.CSS("#requeue-selected")),
		chromedp.WaitVisible(chromedp.CSS("#error")))
	assert.Equal(t, "invalid or missing CSRF token: reload the page and try again", text(t, ctx, "#error"))
	shot(t, ctx, "csrf-refused")
	assert.EqualValues(t, 1, f.overview(f.outAdm).Failed, "the forged request changed nothing")
}

func TestBrowser_ReadOnlyShowsNoAction(t *testing.T) {
	f := newFixture(t, func(c *console.Config) { c.ReadOnly = true })
	ids := f.failedRows("orders", "o-1", postgres.FailedSkip, "poison-1")
	ctx := browser(t)

	for _, path := range []string{"/", "/held", "/failed?t=" + f.outbox, fmt.Sprintf("/row?t=%s&id=%d", f.outbox, ids[0]), "/relays"} {
		do(t, ctx, "open "+path, chromedp.Navigate(f.srv.URL+path), chromedp.WaitVisible(chromedp.CSS("#read-only")))
		posts := count(t, ctx, `document.querySelectorAll('form[method=post]').length`)
		boxes := count(t, ctx, `document.querySelectorAll('input[type=checkbox]').length`)
		assert.Zero(t, posts, "%s: no action form", path)
		assert.Zero(t, boxes, "%s: no selection", path)
	}
	do(t, ctx, "open the row", chromedp.Navigate(fmt.Sprintf("%s/row?t=%s&id=%d", f.srv.URL, f.outbox, ids[0])),
		chromedp.WaitVisible(chromedp.CSS("#status")))
	shot(t, ctx, "row-read-only")
}
