package console_test

import (
	"context"
	"encoding/base64"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/console"
	"github.com/stepwise-go/stepwise/internal/outbox"
	"github.com/stepwise-go/stepwise/workflow"
)

// TestResumeHidesInternalErrors: an error that is not one of Resume's refusals (the database
// refusing the new River job, say) names tables, users or hosts; the page says what failed and
// where the details are, and only the log has them.
func TestResumeHidesInternalErrors(t *testing.T) {
	t.Parallel()
	var logged syncLog
	f := newFixture(t, func(c *console.Config) { c.Logger = slog.New(slog.NewTextHandler(&logged, nil)) })
	f.addRun(t, "r/failed", "wf", workflow.RunStatusFailed, "")
	page := f.get(t, "/console/run?key=r/failed")
	fm := url.Values{"csrf": {csrf(t, page)}, "key": {"r/failed"}, "reason": {"bank back up"}}
	for k, v := range form(page, "resume-form") {
		fm[k] = v
	}
	fm.Set("reason", "bank back up")
	// River's table is gone: the resume's insert fails naming the relation.
	_, err := f.pool.Exec(context.Background(), `ALTER TABLE river_job RENAME TO river_job_moved_by_a_dba`)
	require.NoError(t, err)
	res := f.post(t, "/console/run/resume", fm)
	require.GreaterOrEqual(t, res.status, 500, res.body)
	require.NotContains(t, res.body, "river_job", "the page shows the database's error")
	require.Contains(t, res.text, "reference")
	require.Contains(t, logged.String(), "river_job", "the log has the details")
	require.Zero(t, countEvents(t, f, console.ActionEvent), "nothing resumed, nothing audited")
}

// TestReasonRefusesInvisibleAndBidiCharacters: a reason with a right-to-left override or a
// zero-width character reads differently in the audit trail than what was typed ("refund
// 100" shown as "001 dnufer"): refused, naming the character.
func TestReasonRefusesInvisibleAndBidiCharacters(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	f.enqueue(t, "bidi", "", 1)
	f.setState(t, "bidi-0", outbox.StateManual, "gave up")
	id := outbox.OperationID("payout", "bidi-0")
	page := f.get(t, "/console/operation?id="+id.String())
	for _, tc := range []struct{ reason, want string }{
		{"TICKET-1 \u202eDENIED\u202c by the bank", "U+202E"},
		{"TICKET-\u200b1 confirmed", "U+200B"},
		{"TICKET-1\u2028second line", "U+2028"},
		{"\ufeffTICKET-1", "U+FEFF"},
	} {
		fm := form(page, "resolve-form")
		fm.Set("outcome", "SUCCEEDED")
		fm.Set("reason", tc.reason)
		res := f.post(t, "/console/operation/resolve", fm)
		require.Equal(t, http.StatusBadRequest, res.status, "%q: %s", tc.reason, res.body)
		require.Contains(t, res.text, tc.want)
		require.Contains(t, res.text, "reason")
	}
	op, err := outbox.Get(context.Background(), f.pool, id)
	require.NoError(t, err)
	require.Equal(t, outbox.StateManual, op.State)
	require.Zero(t, countEvents(t, f, console.ActionEvent))
}

// TestCursorWithNULIsABadRequest: a page cursor is the browser's to send back; one that
// decodes to a NUL in the key is the client's mistake (400), not a server error.
func TestCursorWithNULIsABadRequest(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	f.addRun(t, "r/1", "wf", workflow.RunStatusFailed, "")
	for _, raw := range []string{"1700000000000000000\x00a\x00b", "1700000000000000000\x00a\x01b"} {
		after := base64.RawURLEncoding.EncodeToString([]byte(raw))
		res := f.do(t, request{target: "/console/runs?after=" + after, auth: true})
		require.Equal(t, http.StatusBadRequest, res.status, res.body)
		require.Contains(t, res.text, "after=")
		requireNoInternals(t, res.body)
		require.False(t, strings.Contains(res.text, "internal error"), res.text)
	}
}

// TestCSRFTokenRotates: the token of a page is good for the hour it was issued in and the
// next (a grace for a page rendered just before the rotation), then refused: a token that
// leaked is not good until the next restart. A fresh page carries the new token.
func TestCSRFTokenRotates(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	var now atomic.Int64
	now.Store(time.Date(2026, 3, 1, 9, 10, 0, 0, time.UTC).UnixNano())
	console.SetClock(f.h, func() time.Time { return time.Unix(0, now.Load()) })
	advance := func(d time.Duration) { now.Add(int64(d)) }
	f.enqueue(t, "rot", "", 3)
	for i := range 3 {
		f.setState(t, "rot-"+strconv.Itoa(i), outbox.StateManual, "gave up")
	}
	resolve := func(i int, tok string) response {
		id := outbox.OperationID("payout", "rot-"+strconv.Itoa(i))
		fm := form(f.get(t, "/console/operation?id="+id.String()), "resolve-form")
		fm.Set("csrf", tok)
		fm.Set("outcome", "SUCCEEDED")
		fm.Set("reason", "TICKET-5: confirmed")
		return f.post(t, "/console/operation/resolve", fm)
	}
	first := csrfOf(t, f)

	advance(time.Hour) // the next window: a new token, the first one still good
	second := csrfOf(t, f)
	require.NotEqual(t, first, second, "the token rotates")
	res := resolve(0, first)
	require.Equal(t, http.StatusSeeOther, res.status, "the previous window's token is accepted: %s", res.body)

	advance(time.Hour) // two windows on: the first token is refused, the second still good
	res = resolve(1, first)
	require.Equal(t, http.StatusForbidden, res.status, res.body)
	require.Contains(t, res.text, "stale CSRF token: reload the page")
	res = resolve(1, second)
	require.Equal(t, http.StatusSeeOther, res.status, res.body)

	advance(3 * time.Hour)
	third := csrfOf(t, f)
	require.NotContains(t, []string{first, second}, third)
	res = resolve(2, third)
	require.Equal(t, http.StatusSeeOther, res.status, res.body)
}

// TestActorWithBidiCharactersCannotAct: the signed-in user's name goes into the audit rows
// as the reason does, under the same rule.
func TestActorWithBidiCharactersCannotAct(t *testing.T) {
	t.Parallel()
	f := newFixture(t, func(c *console.Config) {
		c.Authenticate = func(*http.Request) (string, bool) { return "alice\u202e", true }
	})
	f.enqueue(t, "actor", "", 1)
	f.setState(t, "actor-0", outbox.StateManual, "gave up")
	id := outbox.OperationID("payout", "actor-0")
	fm := form(f.get(t, "/console/operation?id="+id.String()), "resolve-form")
	fm.Set("outcome", "SUCCEEDED")
	fm.Set("reason", "TICKET-6")
	res := f.post(t, "/console/operation/resolve", fm)
	require.Equal(t, http.StatusForbidden, res.status, res.body)
	require.Contains(t, res.text, "U+202E")
	require.Zero(t, countEvents(t, f, console.ActionEvent))
}
