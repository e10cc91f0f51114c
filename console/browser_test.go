package console_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/cmd/sample-settlement/bankfake"
	"github.com/stepwise-go/stepwise/cmd/sample-settlement/settlement"
	"github.com/stepwise-go/stepwise/console"
	"github.com/stepwise-go/stepwise/internal/reconcile"
	"github.com/stepwise-go/stepwise/internal/testkit"
	"github.com/stepwise-go/stepwise/workflowtest/fakebank"
)

// chromium finds a Chromium or Chrome binary ($STEPWISE_CHROMIUM first), or "" if none.
func chromium() string {
	if p := os.Getenv("STEPWISE_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "headless-shell"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// newBrowser starts a headless Chromium for the test, or skips the test when there is none.
func newBrowser(t *testing.T) context.Context {
	t.Helper()
	path := chromium()
	if path == "" {
		t.Skip("no chromium binary on PATH (nor $STEPWISE_CHROMIUM): install Debian's chromium (apt-get install -y chromium) to run the browser tests")
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.NoSandbox, // tests run as root in CI containers, where Chromium's sandbox cannot start
		chromedp.DisableGPU,
		chromedp.WindowSize(1400, 1000),
	)
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancelAlloc)
	ctx, cancel := chromedp.NewContext(allocCtx)
	t.Cleanup(cancel)
	require.NoError(t, chromedp.Run(ctx), "starting %s", path)
	return ctx
}

// corruptingBank is a bank whose first n payment requests are applied with an amount one
// cent off and answered 503: the payout is UNKNOWN_EXTERNAL, and the reconciler's lookup finds
// another amount than the ledger's, which only a person can settle (MANUAL, "mismatch").
type corruptingBank struct {
	next http.Handler
	left atomic.Int64
}

func (c *corruptingBank) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/payments" || c.left.Add(-1) < 0 {
		c.next.ServeHTTP(w, r)
		return
	}
	body, _ := io.ReadAll(r.Body)
	var req map[string]any
	if err := json.Unmarshal(body, &req); err == nil {
		if a, ok := req["amount"].(float64); ok {
			req["amount"] = a + 1
		}
		body, _ = json.Marshal(req)
	}
	r2 := r.Clone(r.Context())
	r2.Body, r2.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
	c.next.ServeHTTP(httptest.NewRecorder(), r2)
	http.Error(w, "upstream unavailable", http.StatusServiceUnavailable)
}

var browserDate = time.Date(2026, 3, 2, 0, 0, 0, 0, time.UTC)

// settleFixture is a seeded sample settlement database, its service on a corrupting bank,
// and the console on it over real HTTP.
type settleFixture struct {
	pool    *pgxpool.Pool
	svc     *settlement.Service
	console *httptest.Server
	slot    time.Time
}

func startSettle(t *testing.T, manual int) *settleFixture {
	t.Helper()
	ctx := context.Background()
	dbURL := testkit.TemplateDBURL(t, "cs_"+settlement.SchemaID(), func(ctx context.Context, pool *pgxpool.Pool) error {
		if err := settlement.ApplySchema(ctx, pool); err != nil {
			return err
		}
		_, err := settlement.Seed(ctx, pool, &settlement.SeedConfig{Date: browserDate, Merchants: 300, Transactions: 3000, Seed: 11})
		return err
	})
	// Sized for the sample's service: its client refuses pgx's default pool.
	pcfg, err := pgxpool.ParseConfig(dbURL)
	require.NoError(t, err)
	pcfg.MaxConns = settlement.PoolConnsFor(0)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	bank := fakebank.New(&fakebank.Config{Seed: 5})
	cb := &corruptingBank{next: bank.Handler()}
	cb.left.Store(int64(manual))
	bankSrv := httptest.NewServer(cb)
	t.Cleanup(bankSrv.Close)
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.DisableKeepAlives = true
	client := fakebank.NewClient(bankSrv.URL, &http.Client{Timeout: 2 * time.Second, Transport: tr})

	quiet := slog.New(slog.DiscardHandler)
	svc, err := settlement.NewService(pool, &settlement.ServiceConfig{
		Bank: bankfake.New(client), Plan: settlement.Plan{Shards: 2}, BatchSize: 20, PayoutConcurrency: 8,
		PayoutTimeout: time.Second, ReconcileInterval: time.Second, ReconcileGrace: 2 * time.Second,
		ReconcileBackoff:  func(int) time.Duration { return 300 * time.Millisecond },
		FetchPollInterval: 100 * time.Millisecond, Logger: quiet,
	})
	require.NoError(t, err)
	runCtx, cancel := context.WithCancel(ctx)
	require.NoError(t, svc.Start(runCtx))
	t.Cleanup(func() {
		stopCtx, stop := context.WithTimeout(context.Background(), 10*time.Second)
		defer stop()
		_ = svc.Stop(stopCtx, 5*time.Second)
		cancel()
	})

	// The daily schedule as its first tick would have recorded it, so the overview lists it;
	// the date's slot is recorded by StartDate (StartSlot records a hand-started slot's
	// decision with its runs), and the overview shows its evidence-based status.
	slot, err := svc.Plan.Slot(browserDate)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO stepwise_schedule (name, spec, zone, gap, misfire, overlap, shards, watermark)
		VALUES ($1, $2, 'UTC', 'run_after', '{}', 'skip', 2, $3)`, settlement.ScheduleName, svc.Plan.Spec, slot)
	require.NoError(t, err)

	h, err := console.New(pool, &console.Config{
		Prefix: "/console", Authenticate: console.BasicAuth(testUser, testPassword), Client: svc.Client,
		Statements: map[string]reconcile.Statement{settlement.PayoutKind: fakebank.Statement(client)}, Logger: quiet,
	})
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.Handle("/console/", h)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return &settleFixture{pool: pool, svc: svc, console: srv, slot: slot}
}

func authHeader() network.Headers {
	return network.Headers{"Authorization": "Basic " + base64.StdEncoding.EncodeToString([]byte(testUser+":"+testPassword))}
}

// shoot saves a full-page screenshot into $STEPWISE_CONSOLE_SCREENSHOTS, when set (how
// docs/console-*.png are made).
func shoot(t *testing.T, ctx context.Context, name string) {
	dir := os.Getenv("STEPWISE_CONSOLE_SCREENSHOTS")
	if dir == "" {
		return
	}
	var png []byte
	require.NoError(t, chromedp.Run(ctx, chromedp.FullScreenshot(&png, 100)))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "console-"+name+".png"), png, 0o644))
}

func (f *settleFixture) count(t *testing.T, sql string) int {
	t.Helper()
	var n int
	require.NoError(t, f.pool.QueryRow(context.Background(), sql).Scan(&n))
	return n
}

// TestBrowserResolveManualPayoutDuringASettle: in a real headless Chromium, an operator
// opens the overview while a date settles, follows the MANUAL count to a payout the bank
// holds with another amount, resolves it with a reason, and sees the audit row and the new
// state; the slot's status goes from RUNNING through NEEDS_ATTENTION to COMPLETED. A form
// posted from another origin is refused, and a browser without credentials cannot act.
func TestBrowserResolveManualPayoutDuringASettle(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a browser and settles a date; run without -short")
	}
	browser := newBrowser(t)
	f := startSettle(t, 2)
	ctx, cancel := context.WithTimeout(browser, 3*time.Minute)
	defer cancel()
	base := f.console.URL + "/console"
	require.NoError(t, chromedp.Run(ctx, network.Enable(), network.SetExtraHTTPHeaders(authHeader())))

	// The overview during the settle.
	_, _, err := f.svc.StartDate(context.Background(), browserDate)
	require.NoError(t, err)
	var status string
	require.NoError(t, chromedp.Run(ctx,
		chromedp.Navigate(base+"/"),
		chromedp.Text(`.slot-status`, &status, chromedp.ByQuery),
	))
	statuses := []string{status}
	t.Logf("overview during the settle: slot %s", status)
	shoot(t, ctx, "overview")

	// Wait for both corrupted payouts to reach MANUAL and the runs to finish (the database
	// is the clock here; the browser only looks).
	deadline := time.Now().Add(90 * time.Second)
	for f.count(t, `SELECT count(*) FROM stepwise_operation WHERE state = 'MANUAL'`) < 2 ||
		f.count(t, `SELECT count(*) FROM stepwise_run WHERE status IN ('pending', 'running')`) > 0 ||
		f.count(t, `SELECT count(*) FROM stepwise_operation WHERE state NOT IN ('SUCCEEDED', 'FAILED_PERMANENT', 'MANUAL')`) > 0 {
		require.True(t, time.Now().Before(deadline), "the settle did not come to rest with 2 MANUAL payouts")
		time.Sleep(200 * time.Millisecond)
	}

	// From the overview to the MANUAL payouts.
	var manualCount string
	require.NoError(t, chromedp.Run(ctx,
		chromedp.Navigate(base+"/"),
		chromedp.Text(`.slot-status`, &status, chromedp.ByQuery),
		chromedp.Text(`#count-payout-MANUAL`, &manualCount, chromedp.ByID),
	))
	statuses = append(statuses, status)
	require.Equal(t, "NEEDS_ATTENTION", status, "runs done, payouts MANUAL: only a person can finish the batch")
	require.Equal(t, "2", manualCount)
	shoot(t, ctx, "overview-attention")
	var opURLs []string
	require.NoError(t, chromedp.Run(ctx,
		chromedp.Click(`#count-payout-MANUAL`, chromedp.ByID),
		chromedp.WaitVisible(`#operations`, chromedp.ByID),
		chromedp.Evaluate(`Array.from(document.querySelectorAll('a.op-link')).map(a => a.href)`, &opURLs),
	))
	require.Len(t, opURLs, 2)
	shoot(t, ctx, "operations")

	// The first: resolve it with a reason, see the state and the audit row.
	var state, why, audit string
	require.NoError(t, chromedp.Run(ctx,
		chromedp.Navigate(opURLs[0]),
		chromedp.Text(`#op-state`, &state, chromedp.ByID),
		chromedp.Text(`#manual-reason`, &why, chromedp.ByID),
	))
	require.Equal(t, "MANUAL", state)
	require.Contains(t, why, "mismatch")
	shoot(t, ctx, "operation-manual")
	require.NoError(t, chromedp.Run(ctx,
		chromedp.SetValue(`#outcome`, "SUCCEEDED", chromedp.ByID),
		chromedp.SendKeys(`#reason`, "OPS-1: the bank paid one cent more; accepted, difference booked by hand", chromedp.ByID),
		chromedp.Click(`#resolve`, chromedp.ByID),
		// The form is gone once the browser has followed the redirect to the resolved page
		// (or to an error page, which the checks below then report).
		chromedp.WaitNotPresent(`#resolve-form`, chromedp.ByID),
		chromedp.Text(`body`, &audit, chromedp.ByQuery),
	))
	require.NotContains(t, audit, "Bad Request")
	require.NoError(t, chromedp.Run(ctx, chromedp.Text(`#op-state`, &state, chromedp.ByID), chromedp.Text(`#audit`, &audit, chromedp.ByID)))
	require.Equal(t, "SUCCEEDED", state)
	require.Contains(t, audit, "console.action")
	require.Contains(t, audit, testUser)
	require.Contains(t, audit, "OPS-1: the bank paid one cent more")
	shoot(t, ctx, "operation-resolved")

	// A page of another origin (another port of this host: same site, other origin) posts
	// the resolve form of the second payout, with the user's credentials attached by the
	// browser and even a valid token: refused, the payout stays MANUAL.
	var token string
	require.NoError(t, chromedp.Run(ctx,
		chromedp.Navigate(opURLs[1]),
		chromedp.AttributeValue(`#resolve-form input[name=csrf]`, "value", &token, nil, chromedp.ByQuery),
	))
	id := strings.TrimPrefix(opURLs[1], base+"/operation?id=")
	evil := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		fmt.Fprintf(w, `<html><body><form id="f" method="post" action="%s/operation/resolve">
			<input name="csrf" value="%s"><input name="id" value="%s"><input name="seen" value="MANUAL">
			<input name="outcome" value="FAILED_PERMANENT"><input name="reason" value="free money"></form>
			<script>document.getElementById('f').submit()</script></body></html>`, base, token, id)
	}))
	defer evil.Close()
	var refused string
	require.NoError(t, chromedp.Run(ctx,
		chromedp.Navigate(evil.URL),
		chromedp.WaitVisible(`#error`, chromedp.ByID),
		chromedp.Text(`#error`, &refused, chromedp.ByID),
	))
	require.Contains(t, refused, "cross-origin request refused")
	require.Equal(t, 1, f.count(t, `SELECT count(*) FROM stepwise_operation WHERE state = 'MANUAL'`))

	// A browser without credentials (a fresh tab, no Authorization header): from a page of
	// the console's own origin (outside its prefix, so no challenge is met on the way), the
	// console's page answers 401 and the same-origin POST of the form, token and all, too.
	noCreds, cancelNoCreds := chromedp.NewContext(browser)
	defer cancelNoCreds()
	noCreds, cancelTimeout := context.WithTimeout(noCreds, time.Minute)
	defer cancelTimeout()
	var got []any
	require.NoError(t, chromedp.Run(noCreds,
		chromedp.Navigate(f.console.URL+"/not-the-console"),
		chromedp.Evaluate(fmt.Sprintf(`Promise.all([
				fetch(%q, {credentials: "omit"}).then(async r => r.status + " " + await r.text()),
				fetch(%q, {method: "POST", credentials: "omit", body: new URLSearchParams({csrf: %q, id: %q, seen: "MANUAL", outcome: "FAILED_PERMANENT", reason: "no"})}).then(r => r.status),
			])`, opURLs[1], base+"/operation/resolve", token, id),
			&got, func(p *runtime.EvaluateParams) *runtime.EvaluateParams { return p.WithAwaitPromise(true) }),
	))
	require.Len(t, got, 2)
	require.True(t, strings.HasPrefix(got[0].(string), "401 "), "GET without credentials: %.80s", got[0])
	require.Contains(t, got[0], "credentials required")
	require.NotContains(t, got[0], "resolve-form")
	require.Equal(t, float64(http.StatusUnauthorized), got[1], "POST without credentials")
	require.Equal(t, 1, f.count(t, `SELECT count(*) FROM stepwise_operation WHERE state = 'MANUAL'`))

	// The second, resolved properly: the slot completes.
	require.NoError(t, chromedp.Run(ctx,
		chromedp.Navigate(opURLs[1]),
		chromedp.SetValue(`#outcome`, "SUCCEEDED", chromedp.ByID),
		chromedp.SendKeys(`#reason`, "OPS-2: same as OPS-1", chromedp.ByID),
		chromedp.Click(`#resolve`, chromedp.ByID),
		chromedp.WaitNotPresent(`#resolve-form`, chromedp.ByID),
		chromedp.Text(`#op-state`, &state, chromedp.ByID),
		chromedp.Navigate(base+"/"),
		chromedp.Text(`.slot-status`, &status, chromedp.ByQuery),
	))
	require.Equal(t, "SUCCEEDED", state)
	statuses = append(statuses, status)
	require.Equal(t, "COMPLETED", status)
	t.Logf("slot status seen in the browser: %v", statuses)
	shoot(t, ctx, "overview-completed")
	require.Equal(t, 2, f.count(t, `SELECT count(*) FROM stepwise_event WHERE kind = 'console.action' AND actor = 'alice'`))

	// The rest of the pages, for the docs' screenshots.
	if os.Getenv("STEPWISE_CONSOLE_SCREENSHOTS") != "" {
		require.NoError(t, chromedp.Run(ctx, chromedp.Navigate(base+"/runs"), chromedp.WaitVisible(`#runs`, chromedp.ByID)))
		shoot(t, ctx, "runs")
		require.NoError(t, chromedp.Run(ctx, chromedp.Click(`a.run-link`, chromedp.ByQuery), chromedp.WaitVisible(`#events`, chromedp.ByID)))
		shoot(t, ctx, "run")
		require.NoError(t, chromedp.Run(ctx, chromedp.Navigate(base+"/totals?kind=payout&date="+time.Now().UTC().Format(time.DateOnly)), chromedp.WaitVisible(`#totals`, chromedp.ByID)))
		shoot(t, ctx, "totals")
	}
}
