package console_test

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/console"
	"github.com/stepwise-go/stepwise/internal/outbox"
	"github.com/stepwise-go/stepwise/internal/reconcile"
	"github.com/stepwise-go/stepwise/internal/workflow"
)

// TestEveryPageAndFilter: every page answers 200 and shows what its filter selects, and
// nothing else.
func TestEveryPageAndFilter(t *testing.T) {
	t.Parallel()
	f := newFixture(t, func(c *console.Config) {
		c.Statements = map[string]reconcile.Statement{"payout": reconcile.StatementFunc(func(context.Context, time.Time, time.Time) ([]reconcile.StatementEntry, error) {
			return []reconcile.StatementEntry{{Key: "not-ours", ExternalRef: "b-1", Amount: 77, Currency: "EUR", At: time.Now()}}, nil
		})}
	})
	ctx := context.Background()
	f.addRun(t, "settle/2026-03-01/0", "settle", workflow.RunStatusRunning, "daily")
	f.addRun(t, "settle/2026-03-01/1", "settle", workflow.RunStatusFailed, "daily")
	f.addRun(t, "adhoc/1", "backfill", workflow.RunStatusSucceeded, "")
	f.enqueue(t, "a", "settle/2026-03-01/0", 3)
	f.enqueue(t, "b", "settle/2026-03-01/1", 2)
	f.setState(t, "a-0", outbox.StateManual, "mismatch: the bank holds 990 EUR")
	f.setState(t, "a-1", outbox.StateUnknownExternal, "")
	f.setState(t, "b-0", outbox.StateSucceeded, "")
	_, err := f.pool.Exec(ctx, `INSERT INTO stepwise_schedule (name, spec, zone, gap, misfire, overlap, shards, watermark)
		VALUES ('daily', '0 2 * * *', 'UTC', 'run_after', '{}', 'skip', 2, '2026-03-01')`)
	require.NoError(t, err)
	_, err = f.pool.Exec(ctx, `INSERT INTO stepwise_schedule_slot (schedule, slot, status, shards, version, materialized_at)
		VALUES ('daily', '2026-03-01 00:00Z', 'materialized', 2, 1, now())`)
	require.NoError(t, err)
	_, err = f.pool.Exec(ctx, `INSERT INTO stepwise_event (subject, kind, actor, token) VALUES ('settle/2026-03-01/0', 'run.takeover', 'worker-2', 4)`)
	require.NoError(t, err)

	body := f.get(t, "/console/")
	require.Contains(t, body, "daily")
	require.Regexp(t, `slot-status">FAILED<`, body, "a failed shard run makes the slot FAILED")
	require.Regexp(t, `id="count-payout-MANUAL">1<`, body)
	require.Regexp(t, `id="count-payout-PENDING">2<`, body)
	require.Contains(t, body, "run.takeover")

	runKeys := func(q string) []string {
		var out []string
		for _, m := range regexp.MustCompile(`class="run-link" href="[^"]*">([^<]+)<`).FindAllStringSubmatch(f.get(t, "/console/runs"+q), -1) {
			out = append(out, m[1])
		}
		return out
	}
	require.ElementsMatch(t, []string{"settle/2026-03-01/0", "settle/2026-03-01/1", "adhoc/1"}, runKeys(""))
	require.Equal(t, []string{"settle/2026-03-01/1"}, runKeys("?status=failed"))
	require.Equal(t, []string{"adhoc/1"}, runKeys("?workflow=backfill"))
	require.ElementsMatch(t, []string{"settle/2026-03-01/0", "settle/2026-03-01/1"}, runKeys("?schedule=daily"))
	require.Empty(t, runKeys("?status=cancelled"))

	body = f.get(t, "/console/run?key="+url.QueryEscape("settle/2026-03-01/0"))
	for _, want := range []string{`id="run-status">running<`, `{&#34;next&#34;: 7}`, "lease.claim", "worker-1", "run.takeover", `id="cancel-form"`} {
		require.Contains(t, body, want)
	}
	require.NotContains(t, body, "resume-form", "Resume is hidden without the adapter")

	opKeys := func(q string) []string {
		var out []string
		body := f.get(t, "/console/operations"+q)
		for _, m := range regexp.MustCompile(`</td><td>payout</td><td>([^<]+)</td>`).FindAllStringSubmatch(body, -1) {
			out = append(out, m[1])
		}
		return out
	}
	require.ElementsMatch(t, []string{"a-0", "a-1", "a-2", "b-0", "b-1"}, opKeys(""))
	require.Equal(t, []string{"b-1", "b-0", "a-2", "a-1", "a-0"}, opKeys(""), "newest first")
	require.ElementsMatch(t, []string{"a-0", "a-1", "a-2", "b-0", "b-1"}, opKeys("?kind=payout"))
	require.Equal(t, []string{"a-0"}, opKeys("?state=MANUAL"))
	require.Equal(t, []string{"a-0"}, opKeys("?state=MANUAL&kind=payout"))
	require.Equal(t, []string{"b-1", "a-2"}, opKeys("?state=PENDING"))
	require.Equal(t, []string{"a-2", "a-1", "a-0"}, opKeys("?run="+url.QueryEscape("settle/2026-03-01/0")))
	require.Equal(t, []string{"a-2"}, opKeys("?run="+url.QueryEscape("settle/2026-03-01/0")+"&state=PENDING"))
	require.Equal(t, []string{"b-0"}, opKeys("?business_key=b-0"))
	require.Equal(t, []string{"b-0"}, opKeys("?business_key=b-0&kind=payout"))
	require.Empty(t, opKeys("?business_key=b-0&state=MANUAL"))
	require.Empty(t, opKeys("?kind=refund"))

	id := outbox.OperationID("payout", "a-0")
	body = f.get(t, "/console/operation?id="+id.String())
	for _, want := range []string{`id="op-state">MANUAL<`, "mismatch: the bank holds 990 EUR", `id="resolve-form"`, "10.00 EUR", "<dt>sends begun (attempts)</dt><dd>1</dd>", `id="requests"`} {
		require.Contains(t, body, want)
	}
	body = f.get(t, "/console/operation?id="+outbox.OperationID("payout", "b-0").String())
	require.NotContains(t, body, "resolve-form", "only MANUAL operations offer Resolve")

	require.Contains(t, f.get(t, "/console/totals"), `name="date"`)
	body = f.get(t, "/console/totals?kind=payout&date=2026-03-01")
	require.Contains(t, body, `id="totals-differ">1 differences<`)
	require.Contains(t, body, "only_there")
	require.Contains(t, f.get(t, "/console/audit"), "no action yet")
}

// TestKeysetPagination: following Next shows every row once, in order, for the merged
// unfiltered list, a filtered one and the runs; and a row inserted meanwhile does not shift
// the pages (no OFFSET).
func TestKeysetPagination(t *testing.T) {
	t.Parallel()
	f := newFixture(t, func(c *console.Config) { c.PageSize = 2 })
	f.enqueue(t, "p", "run-a", 7)
	for _, k := range []string{"p-1", "p-4"} {
		f.setState(t, k, outbox.StateSucceeded, "")
	}
	for i, st := range []workflow.RunStatus{workflow.RunStatusPending, workflow.RunStatusRunning, workflow.RunStatusFailed, workflow.RunStatusSucceeded, workflow.RunStatusRunning} {
		f.addRun(t, "r/"+string(rune('a'+i)), "wf", st, "")
	}
	nextRE := regexp.MustCompile(`id="next" href="/console/([^"]+)"`)
	walk := func(start string, itemRE *regexp.Regexp, insert func(page int)) []string {
		var seen []string
		target := start
		for page := 0; ; page++ {
			body := f.get(t, "/console/"+strings.ReplaceAll(target, "&amp;", "&"))
			for _, m := range itemRE.FindAllStringSubmatch(body, -1) {
				seen = append(seen, m[1])
			}
			if insert != nil {
				insert(page)
			}
			m := nextRE.FindStringSubmatch(body)
			if m == nil {
				return seen
			}
			target = m[1]
			require.Less(t, page, 20, "pagination does not end")
		}
	}
	opRE := regexp.MustCompile(`</td><td>payout</td><td>([^<]+)</td>`)
	inserted := false
	all := walk("operations", opRE, func(page int) {
		if page == 0 && !inserted {
			inserted = true
			f.enqueue(t, "late", "run-a", 1) // newer than every row: belongs before page 1
		}
	})
	require.Equal(t, []string{"p-6", "p-5", "p-4", "p-3", "p-2", "p-1", "p-0"}, all)
	require.Equal(t, []string{"late-0", "p-6", "p-5", "p-3", "p-2", "p-0"}, walk("operations?state=PENDING", opRE, nil))
	require.Equal(t, []string{"late-0", "p-6", "p-5", "p-4", "p-3", "p-2", "p-1", "p-0"}, walk("operations?run=run-a", opRE, nil))
	require.Equal(t, []string{"late-0", "p-6", "p-5", "p-4", "p-3", "p-2", "p-1", "p-0"}, walk("operations?kind=payout", opRE, nil))
	runRE := regexp.MustCompile(`class="run-link" href="[^"]*">([^<]+)<`)
	require.Equal(t, []string{"r/e", "r/d", "r/c", "r/b", "r/a"}, walk("runs", runRE, nil))
	require.Equal(t, []string{"r/e", "r/b"}, walk("runs?status=running", runRE, nil))
}

// TestBadInputIsAClearClientError: unknown ids, bad filters and malformed cursors get a 4xx
// that names the parameter and the fix, never a 500 and never the database's own words.
func TestBadInputIsAClearClientError(t *testing.T) {
	t.Parallel()
	f := newFixture(t, func(c *console.Config) {
		c.Statements = map[string]reconcile.Statement{"payout": reconcile.StatementFunc(func(context.Context, time.Time, time.Time) ([]reconcile.StatementEntry, error) {
			return nil, errors.New("dial tcp 10.1.2.3:443: bank statement host unreachable")
		})}
	})
	f.enqueue(t, "x", "", 1)
	cases := []struct {
		target string
		status int
		want   string
	}{
		{"/console/nope", 404, "no such page"},
		{"/elsewhere", 404, "outside the console's prefix"},
		{"/console/run", 400, "key is required"},
		{"/console/run?key=no-such-run", 404, `no run with key "no-such-run"`},
		{"/console/run?key=" + url.QueryEscape("a\nb"), 400, "control characters"},
		{"/console/run?key=r&before=-3", 400, "before="},
		{"/console/operation?id=42", 400, "want an operation_id (a UUID)"},
		{"/console/operation", 400, "want an operation_id"},
		{"/console/operation?id=6f1c1c1e-0000-4000-8000-000000000000", 404, "no operation 6f1c1c1e-0000-4000-8000-000000000000"},
		{"/console/operations?state=DONE", 400, "state=\"DONE\": want one of PENDING"},
		{"/console/operations?state=manual", 400, "want one of"},
		{"/console/operations?kind=Pay%20Out", 400, "a kind is lower-case letters"},
		{"/console/operations?kind=" + strings.Repeat("k", 49), 400, "at most 48"},
		{"/console/operations?stat=MANUAL", 400, "unknown parameter \"stat\""},
		{"/console/operations?state=MANUAL&state=PENDING", 400, "given 2 times"},
		{"/console/operations?after=%%%", 400, "malformed query string"},
		{"/console/operations?after=bm90LWEtY3Vyc29y", 400, "not a page cursor"},
		{"/console/operations?after=MTcwMDAwMDAwMDAwMDAwMDAwMABub3QtYS11dWlk", 400, "not a cursor of the operations list"},
		{"/console/operations?business_key=" + strings.Repeat("b", 256), 400, "at most 255"},
		{"/console/operations?run=%ff%fe", 400, "not valid UTF-8"},
		{"/console/runs?status=FAILED", 400, "status=\"FAILED\": want one of pending"},
		{"/console/runs?after=zzz", 400, "not a page cursor"},
		{"/console/totals?kind=refund&date=2026-03-01", 400, "has no statement configured: want one of payout"},
		{"/console/totals?kind=payout&date=yesterday", 400, "want a day as YYYY-MM-DD"},
		{"/console/totals?kind=payout&date=2026-03-01", 502, "statement or the ledger could not be read"},
		{"/console/audit?before=x", 400, "want an event id"},
		{"/console/?x=1", 400, "unknown parameter"},
	}
	for _, c := range cases {
		res := f.do(t, request{target: c.target, auth: true})
		require.Equal(t, c.status, res.status, "%s: %s", c.target, res.body)
		require.Contains(t, res.text, c.want, c.target)
		requireNoInternals(t, res.body)
		require.NotContains(t, res.body, "10.1.2.3", "the statement's failure detail stays in the log")
	}
	// Methods other than GET and POST.
	res := f.do(t, request{method: http.MethodDelete, target: "/console/", auth: true})
	require.Equal(t, http.StatusMethodNotAllowed, res.status)

	// Bad action input, with valid credentials, origin and token.
	tok := csrfOf(t, f)
	id := outbox.OperationID("payout", "x-0").String()
	actions := []struct {
		path   string
		form   url.Values
		status int
		want   string
	}{
		{"/console/operation/resolve", url.Values{"id": {"nope"}}, 400, "want the operation_id"},
		{"/console/operation/resolve", url.Values{"id": {id}, "seen": {"PENDING"}, "outcome": {"SUCCEEDED"}, "reason": {"r"}}, 400, "resolves MANUAL operations"},
		{"/console/operation/resolve", url.Values{"id": {id}, "seen": {"MANUAL"}, "outcome": {"SUCCEEDED"}, "reason": {"r"}}, 400, "seen_version"},
		{"/console/operation/resolve", url.Values{"id": {id}, "seen": {"MANUAL"}, "seen_version": {"0"}, "outcome": {"SUCCEEDED"}, "reason": {"r"}}, 400, "seen_version"},
		{"/console/operation/resolve", url.Values{"id": {id}, "seen": {"MANUAL"}, "seen_version": {"1"}, "outcome": {"PENDING"}, "reason": {"r"}}, 400, "want SUCCEEDED"},
		{"/console/operation/resolve", url.Values{"id": {id}, "seen": {"MANUAL"}, "seen_version": {"1"}, "outcome": {"SUCCEEDED"}}, 400, "reason is required"},
		{"/console/operation/resolve", url.Values{"id": {id}, "seen": {"MANUAL"}, "seen_version": {"1"}, "outcome": {"SUCCEEDED"}, "reason": {"a\nb"}}, 400, "U+000A (a control character)"},
		{"/console/operation/resolve", url.Values{"id": {id}, "seen": {"MANUAL"}, "seen_version": {"1"}, "outcome": {"SUCCEEDED"}, "reason": {strings.Repeat("r", 501)}}, 400, "at most 500"},
		{"/console/operation/resolve", url.Values{"id": {"6f1c1c1e-0000-4000-8000-000000000000"}, "seen": {"MANUAL"}, "seen_version": {"1"}, "outcome": {"SUCCEEDED"}, "reason": {"r"}}, 404, "no operation"},
		{"/console/operation/resolve", url.Values{"id": {id}, "seen": {"MANUAL"}, "seen_version": {"1"}, "outcome": {"SUCCEEDED"}, "reason": {"r"}}, 409, "is no longer the MANUAL you saw"},
		{"/console/run/cancel", url.Values{"key": {"nope"}, "seen": {"running"}, "reason": {"r"}}, 404, "no run with key"},
		{"/console/run/cancel", url.Values{"key": {"nope"}, "seen": {"failed"}, "reason": {"r"}}, 400, "only a pending or running run"},
		{"/console/run/resume", url.Values{"key": {"nope"}, "reason": {"r"}}, 400, "only a failed or cancelled run can be resumed"},
		{"/console/run/resume", url.Values{"key": {"nope"}, "seen": {"failed"}, "seen_version": {"1"}, "reason": {"r"}}, 404, "nope"},
		{"/console/run/explode", url.Values{}, 404, "no such action"},
	}
	for _, a := range actions {
		a.form.Set("csrf", tok)
		res := f.post(t, a.path, a.form)
		require.Equal(t, a.status, res.status, "%s %v: %s", a.path, a.form, res.body)
		require.Contains(t, res.text, a.want)
		requireNoInternals(t, res.body)
	}
	big := url.Values{"csrf": {tok}, "reason": {strings.Repeat("x", 20<<10)}}
	res = f.post(t, "/console/run/cancel", big)
	require.Equal(t, http.StatusBadRequest, res.status, res.body)
	require.Contains(t, res.body, "unreadable form")
	require.Equal(t, 0, countEvents(t, f, console.ActionEvent), "no refused action left an audit row")
}

func csrfOf(t testing.TB, f *fixture) string {
	t.Helper()
	f.enqueue(t, "csrf-probe", "", 1)
	f.setState(t, "csrf-probe-0", outbox.StateManual, "probe")
	body := f.get(t, "/console/operation?id="+outbox.OperationID("payout", "csrf-probe-0").String())
	return csrf(t, body)
}

func countEvents(t testing.TB, f *fixture, kind string) int {
	t.Helper()
	var n int
	require.NoError(t, f.pool.QueryRow(context.Background(), `SELECT count(*) FROM stepwise_event WHERE kind = $1`, kind).Scan(&n))
	return n
}

// TestResolveFromTheConsole: the decision is recorded as the authenticated user, only if the
// operation is still in the state the operator saw, with the outbox's audit row and the
// console's in the same transaction.
func TestResolveFromTheConsole(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	f.enqueue(t, "m", "", 2)
	f.setState(t, "m-0", outbox.StateManual, "gave up: 5 checks")
	f.setState(t, "m-1", outbox.StateManual, "gave up: 5 checks")
	id := outbox.OperationID("payout", "m-0")
	page := f.get(t, "/console/operation?id="+id.String())
	form := url.Values{"csrf": {csrf(t, page)}, "id": {id.String()}, "seen": {"MANUAL"}, "seen_version": {form(page, "resolve-form").Get("seen_version")}, "outcome": {"SUCCEEDED"},
		"reason": {"TICKET-7: the bank confirms the payment"}, "external_ref": {"bank-77"}, "actor": {"mallory"}}
	res := f.post(t, "/console/operation/resolve", form)
	require.Equal(t, http.StatusSeeOther, res.status, res.body)
	require.Equal(t, "/console/operation?id="+id.String(), res.header.Get("Location"))

	op, err := outbox.Get(context.Background(), f.pool, id)
	require.NoError(t, err)
	require.Equal(t, outbox.StateSucceeded, op.State)
	require.Equal(t, "bank-77", op.ExternalRef)
	require.Equal(t, []string{"op.transition alice MANUAL>SUCCEEDED", "console.action alice MANUAL>SUCCEEDED"}, f.events(t, "op:"+id.String()),
		"the actor is the authenticated user, not the form's 'actor' field")
	body := f.get(t, "/console/operation?id="+id.String())
	require.Contains(t, body, `id="op-state">SUCCEEDED<`)
	require.Contains(t, body, "TICKET-7: the bank confirms the payment")

	// The same form again: the operation moved since the operator saw it; nothing happens.
	res = f.post(t, "/console/operation/resolve", form)
	require.Equal(t, http.StatusConflict, res.status)
	require.Contains(t, res.text, "is no longer the MANUAL you saw")
	require.Contains(t, res.text, "it is SUCCEEDED now")
	require.Len(t, f.events(t, "op:"+id.String()), 2)
	require.Contains(t, f.get(t, "/console/audit"), "TICKET-7")
}

// TestCancelAndResumeFromTheConsole: Cancel requests cancellation only of a run still in the
// status the operator saw, audited with the user; Resume resumes through the client.
func TestCancelAndResumeFromTheConsole(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	f.addRun(t, "r/live", "wf", workflow.RunStatusRunning, "")
	f.addRun(t, "r/failed", "wf", workflow.RunStatusFailed, "")
	f.addRun(t, "r/done", "wf", workflow.RunStatusSucceeded, "")
	page := f.get(t, "/console/run?key=r/live")
	tok := csrf(t, page)
	require.NotContains(t, page, "resume-form")

	res := f.post(t, "/console/run/cancel", url.Values{"csrf": {tok}, "key": {"r/live"}, "seen": {"pending"}, "reason": {"wrong date"}})
	require.Equal(t, http.StatusConflict, res.status, "the operator saw it pending; it is running")
	require.Contains(t, res.body, "is running now, not pending")

	res = f.post(t, "/console/run/cancel", url.Values{"csrf": {tok}, "key": {"r/live"}, "seen": {"running"}, "reason": {"wrong date"}})
	require.Equal(t, http.StatusSeeOther, res.status, res.body)
	run, err := workflow.GetRun(context.Background(), f.pool, "r/live")
	require.NoError(t, err)
	require.NotNil(t, run.CancelRequestedAt)
	require.Equal(t, []string{"lease.claim worker-1 >", "run.cancel_requested  >", "console.action alice running>cancel_requested"}, f.events(t, "r/live"))
	require.NotContains(t, f.get(t, "/console/run?key=r/live"), "cancel-form", "cancel is requested already")

	page = f.get(t, "/console/run?key=r/failed")
	require.Contains(t, page, "resume-form")
	res = f.post(t, "/console/run/resume", url.Values{"csrf": {tok}, "key": {"r/failed"}, "seen": {"failed"}, "seen_version": {"1"}, "reason": {"bank back up"}})
	require.Equal(t, http.StatusSeeOther, res.status, res.body)
	resumed, err := workflow.GetRun(context.Background(), f.pool, "r/failed")
	require.NoError(t, err)
	require.Equal(t, workflow.RunStatusPending, resumed.Status)
	require.Equal(t, []string{"lease.claim worker-1 >", "run.resume alice failed>pending", "console.action alice failed>resumed"}, f.events(t, "r/failed"))

	res = f.post(t, "/console/run/resume", url.Values{"csrf": {tok}, "key": {"r/done"}, "seen": {"failed"}, "seen_version": {"1"}, "reason": {"why not"}})
	require.Equal(t, http.StatusConflict, res.status)
	require.Contains(t, res.text, "it is succeeded now", "the refusal says what the run is, from the database")
}

// TestSecurity: who may read, who may act, and from where.
func TestSecurity(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	f.enqueue(t, "s", "", 1)
	f.setState(t, "s-0", outbox.StateManual, "gave up")
	id := outbox.OperationID("payout", "s-0")
	page := f.get(t, "/console/operation?id="+id.String())
	tok, version := csrf(t, page), form(page, "resolve-form").Get("seen_version")
	form := func() url.Values {
		return url.Values{"csrf": {tok}, "id": {id.String()}, "seen": {"MANUAL"}, "seen_version": {version}, "outcome": {"FAILED_PERMANENT"}, "reason": {"x"}}
	}
	sameOrigin := map[string]string{"Origin": "http://console.test", "Sec-Fetch-Site": "same-origin"}

	// With credentials configured, reads need them too, even from loopback.
	res := f.do(t, request{target: "/console/"})
	require.Equal(t, http.StatusUnauthorized, res.status)
	require.Contains(t, res.header.Get("WWW-Authenticate"), "Basic")
	res = f.do(t, request{target: "/console/", header: map[string]string{"Authorization": "Basic YWxpY2U6d3Jvbmc="}})
	require.Equal(t, http.StatusUnauthorized, res.status, "wrong password")

	refused := []struct {
		name   string
		rq     request
		status int
		want   string
	}{
		{"no credentials", request{form: form(), header: sameOrigin}, 401, "credentials required"},
		{"cross-origin", request{form: form(), auth: true, header: map[string]string{"Origin": "http://evil.test"}}, 403, "cross-origin request refused"},
		{"cross-site fetch", request{form: form(), auth: true, header: map[string]string{"Origin": "http://console.test", "Sec-Fetch-Site": "cross-site"}}, 403, "cross-origin"},
		{"same-site other app", request{form: form(), auth: true, header: map[string]string{"Sec-Fetch-Site": "same-site"}}, 403, "cross-origin"},
		{"null origin", request{form: form(), auth: true, header: map[string]string{"Origin": "null"}}, 403, "cross-origin"},
		{"no origin headers", request{form: form(), auth: true}, 403, "cross-origin"},
		{"no csrf token", request{form: url.Values{"id": {id.String()}, "seen": {"MANUAL"}, "outcome": {"SUCCEEDED"}, "reason": {"x"}}, auth: true, header: sameOrigin}, 403, "CSRF token"},
		{"another key's token", request{form: func() url.Values { v := form(); v.Set("csrf", strings.Repeat("ab", 32)); return v }(), auth: true, header: sameOrigin}, 403, "CSRF token"},
	}
	for _, c := range refused {
		c.rq.method, c.rq.target = http.MethodPost, "/console/operation/resolve"
		res := f.do(t, c.rq)
		require.Equal(t, c.status, res.status, "%s: %s", c.name, res.body)
		require.Contains(t, res.text, c.want, c.name)
	}
	op, err := outbox.Get(context.Background(), f.pool, id)
	require.NoError(t, err)
	require.Equal(t, outbox.StateManual, op.State, "no refused request acted")
	require.Equal(t, 0, countEvents(t, f, console.ActionEvent))

	// A token of this user from another console process (another key) is refused; the
	// token of the page works, through a proxy-free loopback or not.
	res = f.do(t, request{method: http.MethodPost, target: "/console/operation/resolve", form: form(), auth: true, remote: "203.0.113.9:5000", header: sameOrigin})
	require.Equal(t, http.StatusSeeOther, res.status, res.body)
	require.Equal(t, 1, countEvents(t, f, console.ActionEvent))

	// Security headers: no script, no framing.
	res = f.do(t, request{target: "/console/", auth: true})
	require.Contains(t, res.header.Get("Content-Security-Policy"), "default-src 'none'")
	require.Contains(t, res.header.Get("Content-Security-Policy"), "frame-ancestors 'none'")
	require.Equal(t, "DENY", res.header.Get("X-Frame-Options"))
}

// TestWithoutCredentials: read-only, for loopback peers only, and never through a proxy.
func TestWithoutCredentials(t *testing.T) {
	t.Parallel()
	// console.test is this test's Host: without credentials only listed or loopback names
	// are answered (DNS rebinding; see TestHostsAnswered).
	f := newFixture(t, func(c *console.Config) { c.Authenticate = nil; c.Hosts = []string{"console.test"} })
	f.enqueue(t, "n", "", 1)
	f.setState(t, "n-0", outbox.StateManual, "gave up")
	id := outbox.OperationID("payout", "n-0")

	body := f.get(t, "/console/operation?id="+id.String())
	require.Contains(t, body, "read-only (no credentials)")
	require.NotContains(t, body, "resolve-form", "no action offered without credentials")
	require.Equal(t, http.StatusOK, f.do(t, request{target: "/console/", remote: "[::1]:4000"}).status)

	for _, rq := range []request{
		{target: "/console/", remote: "192.0.2.10:4000"},
		{target: "/console/", remote: "10.0.0.5:4000"},
		{target: "/console/", header: map[string]string{"X-Forwarded-For": "198.51.100.7"}},
		{target: "/console/", header: map[string]string{"Forwarded": "for=198.51.100.7"}},
	} {
		res := f.do(t, rq)
		require.Equal(t, http.StatusForbidden, res.status, "%+v", rq)
		require.Contains(t, res.body, "answers loopback only")
	}
	res := f.do(t, request{method: http.MethodPost, target: "/console/operation/resolve",
		form:   url.Values{"id": {id.String()}, "seen": {"MANUAL"}, "outcome": {"SUCCEEDED"}, "reason": {"x"}},
		header: map[string]string{"Origin": "http://console.test", "Sec-Fetch-Site": "same-origin"}})
	require.Equal(t, http.StatusForbidden, res.status)
	require.Contains(t, res.body, "read-only without credentials")
}

// TestNewRefusesBadConfig: each bad field is named with its fix.
func TestNewRefusesBadConfig(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	for _, c := range []struct {
		cfg  console.Config
		want string
	}{
		{console.Config{Prefix: "console"}, "leading slash"},
		{console.Config{Prefix: "/console/"}, "no trailing slash"},
		{console.Config{Prefix: "//evil.test"}, "leading slash"},
		{console.Config{PageSize: 501}, "want 1 to 500"},
		{console.Config{CSRFKey: []byte("short")}, "at least 16"},
		{console.Config{Statements: map[string]reconcile.Statement{"payout": nil}}, `Statements["payout"] is nil`},
	} {
		_, err := console.New(f.pool, &c.cfg)
		require.ErrorContains(t, err, c.want)
	}
	_, err := console.New(nil, nil)
	require.ErrorContains(t, err, "pool is nil; pass the pool your stepwise.Client uses")
	require.Panics(t, func() { console.BasicAuth("alice", "") })
}

// A ledger with no operation yet (a service before its first payout): the operations page
// lists none. Guards against: the empty query being sent with the page-size argument already
// bound, which the server refused ("expected 0 arguments, got 1") as a 500.
func TestOperationsPageOnAnEmptyLedger(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	body := f.get(t, "/console/operations")
	require.Contains(t, body, "Operations")
}
