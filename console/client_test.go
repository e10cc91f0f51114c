package console_test

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise"
	"github.com/stepwise-go/stepwise/console"
	"github.com/stepwise-go/stepwise/internal/outbox"
	"github.com/stepwise-go/stepwise/workflow"
)

// TestConsoleWithClient: with Config.Client the console cancels, resumes and resolves through
// the client's methods, with no adapter: a form on a stale version is refused and changes
// nothing; an action's console audit row commits with it; a kind the client has no config
// for is not resolved (its callback cannot run here); the requests are listed.
func TestConsoleWithClient(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t, nil)
	client, err := stepwise.NewOperatorClient(f.pool)
	require.NoError(t, err)
	f.cfg.Client = client
	f.h, err = console.New(f.pool, f.cfg)
	require.NoError(t, err)
	f.addRun(t, "r/live", "wf", workflow.RunStatusRunning, "")
	f.addRun(t, "r/failed", "wf", workflow.RunStatusFailed, "")

	// Cancel: the form carries the version seen; a run that moved since is refused.
	page := f.get(t, "/console/run?key=r/live")
	cancel := form(page, "cancel-form")
	require.Equal(t, "1", cancel.Get("seen_version"))
	_, err = f.pool.Exec(ctx, `UPDATE stepwise_run SET status = 'pending' WHERE key = 'r/live'`)
	require.NoError(t, err)
	_, err = f.pool.Exec(ctx, `UPDATE stepwise_run SET status = 'running' WHERE key = 'r/live'`)
	require.NoError(t, err)
	cancel.Set("reason", "wrong date")
	res := f.post(t, "/console/run/cancel", cancel)
	require.Equal(t, http.StatusConflict, res.status, res.body)
	require.Contains(t, res.text, "it is running now, at version 3")
	require.Equal(t, []string{"lease.claim worker-1 >"}, f.events(t, "r/live"), "nothing was done")
	cancel = form(f.get(t, "/console/run?key=r/live"), "cancel-form")
	cancel.Set("reason", "wrong date")
	res = f.post(t, "/console/run/cancel", cancel)
	require.Equal(t, http.StatusSeeOther, res.status, res.body)
	require.Equal(t, []string{"lease.claim worker-1 >", "run.cancel_requested  >", "console.action alice running>cancel_requested"}, f.events(t, "r/live"))

	// Resume through the client, with the console's audit row in the same transaction.
	page = f.get(t, "/console/run?key=r/failed")
	resume := form(page, "resume-form")
	require.NotNil(t, resume, "Resume is offered with the client, without an adapter")
	resume.Set("reason", "bank back up")
	stale := url.Values{}
	for k, v := range resume {
		stale[k] = v
	}
	stale.Set("seen_version", "7")
	res = f.post(t, "/console/run/resume", stale)
	require.Equal(t, http.StatusConflict, res.status, res.body)
	require.Contains(t, res.text, "you saw it failed at version 7; it is failed now, at version 1")
	require.Len(t, f.events(t, "r/failed"), 1, "nothing was done")
	res = f.post(t, "/console/run/resume", resume)
	require.Equal(t, http.StatusSeeOther, res.status, res.body)
	require.Equal(t, []string{"lease.claim worker-1 >", "run.resume alice failed>pending", "console.action alice failed>resumed"}, f.events(t, "r/failed"))

	// Resolve: this client has no config for "payout": not offered, and refused if posted.
	f.enqueue(t, "c", "r/live", 1)
	f.setState(t, "c-0", outbox.StateManual, "gave up")
	id := outbox.OperationID("payout", "c-0")
	page = f.get(t, "/console/operation?id="+id.String())
	require.Contains(t, page, "<h2>Requests</h2>", "the requests are listed through the client")
	require.Nil(t, form(page, "resolve-form"), "no Resolve on a kind whose callback the client cannot run")
	op, err := outbox.Get(ctx, f.pool, id)
	require.NoError(t, err)
	resolve := url.Values{"csrf": {cancel.Get("csrf")}, "id": {id.String()}, "seen": {"MANUAL"}, "seen_version": {strconv.FormatInt(op.Version, 10)},
		"outcome": {"SUCCEEDED"}, "reason": {"the bank paid"}}
	res = f.post(t, "/console/operation/resolve", resolve)
	require.Equal(t, http.StatusNotFound, res.status, res.body)
	require.Contains(t, res.text, "resolving is not available here")

	// A client that knows the kind (here: without callback, as the operator declared).
	withKind, err := stepwise.NewOperatorClient(f.pool, "payout")
	require.NoError(t, err)
	f.cfg.Client = withKind
	f.h, err = console.New(f.pool, f.cfg)
	require.NoError(t, err)
	page = f.get(t, "/console/operation?id="+id.String())
	resolve = form(page, "resolve-form")
	require.NotNil(t, resolve, "Resolve is offered on the kinds the client has")
	resolve.Set("outcome", "SUCCEEDED")
	resolve.Set("reason", "the bank paid")
	stale = url.Values{}
	for k, v := range resolve {
		stale[k] = v
	}
	stale.Set("seen_version", "9")
	before := f.events(t, "op:"+id.String())
	res = f.post(t, "/console/operation/resolve", stale)
	require.Equal(t, http.StatusConflict, res.status, res.body)
	require.Equal(t, before, f.events(t, "op:"+id.String()), "nothing was done")
	res = f.post(t, "/console/operation/resolve", resolve)
	require.Equal(t, http.StatusSeeOther, res.status, res.body)
	op, err = outbox.Get(ctx, f.pool, id)
	require.NoError(t, err)
	require.Equal(t, outbox.StateSucceeded, op.State)
	require.Contains(t, f.events(t, "op:"+id.String()), "console.action alice MANUAL>SUCCEEDED")

}

// TestResumeShowsWhatItLeft: resuming a parent through the console resumes the child that
// ended with it and leaves the one that failed after the parent ended (news the operator had
// not seen); the run page the operator lands on names the left one, with its status, at once,
// and not the one resumed. Guards against an operator believing the whole tree runs again.
func TestResumeShowsWhatItLeft(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t, nil)
	f.addRun(t, "p", "wf", workflow.RunStatusFailed, "")
	f.addRun(t, "p/with", "wf", workflow.RunStatusFailed, "")
	f.addRun(t, "p/after", "wf", workflow.RunStatusFailed, "")
	_, err := f.pool.Exec(ctx, `UPDATE stepwise_run SET
		parent_key = CASE WHEN key = 'p' THEN NULL ELSE 'p' END,
		finished_at = now() - CASE key WHEN 'p' THEN interval '1 hour' WHEN 'p/with' THEN interval '2 hours' ELSE interval '1 minute' END
		WHERE key LIKE 'p%'`)
	require.NoError(t, err)
	page := f.get(t, "/console/run?key=p")
	require.NotContains(t, page, `id="run-left"`, "no resume yet, nothing left")
	resume := form(page, "resume-form")
	require.NotNil(t, resume)
	resume.Set("reason", "INC-7: bank back")
	res := f.post(t, "/console/run/resume", resume)
	require.Equal(t, http.StatusSeeOther, res.status, res.body)
	require.Equal(t, "/console/run?key=p", res.header.Get("Location"))

	page = f.get(t, "/console/run?key=p")
	left := between(page, `id="run-left"`, "</p>")
	require.Contains(t, left, `href="/console/run?key=p%2fafter"`)
	require.Contains(t, left, `<span class="st st-failed">failed</span>`, "with its status now")
	require.NotContains(t, left, "p/with", "the child that ended with its parent was resumed with it")
	var with, after string
	require.NoError(t, f.pool.QueryRow(ctx, `SELECT (SELECT status FROM stepwise_run WHERE key = 'p/with'), (SELECT status FROM stepwise_run WHERE key = 'p/after')`).Scan(&with, &after))
	require.Equal(t, []string{"pending", "failed"}, []string{with, after})
	require.NotContains(t, f.get(t, "/console/run?key=p/with"), `id="run-left"`, "a run's page names only what its own resume left")
}

// between is the part of s from the first from to the next to after it ("" if none).
func between(s, from, to string) string {
	i := strings.Index(s, from)
	if i < 0 {
		return ""
	}
	j := strings.Index(s[i:], to)
	if j < 0 {
		return s[i:]
	}
	return s[i : i+j]
}
