package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/cmd/sample-settlement/settlement"
)

// statement-arrived stores the statement signal for the date's reconciliation run, which
// need not exist yet (the date is not closed): it is kept. Sent again with the same --id (a
// retried command) it is one signal; another id is another statement.
func TestStatementArrivedCommand(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := seededDBURL(t)
	for range 2 {
		// README: sample-settlement statement-arrived --date 2026-03-01 --id stmt-0001
		r := runCLI(t, "statement-arrived", "--date", testDateText, "--id", "stmt-0001", "--database-url", dbURL)
		require.Equal(t, 0, r.code, r.stderr)
		require.Contains(t, r.stdout, "statement for "+testDateText+" sent to run reconcile/"+testDateText)
		require.Contains(t, r.stdout, "the run does not exist yet (the date is not closed): the statement is kept for it")
	}
	pool, err := openPool(ctx, dbURL, 4)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	ids := func() []string {
		var ids []string
		require.NoError(t, pool.QueryRow(ctx, `SELECT coalesce(array_agg(signal_id ORDER BY signal_id), '{}') FROM stepwise_signal WHERE run_key = $1 AND name = 'statement'`,
			"reconcile/"+testDateText).Scan(&ids))
		return ids
	}
	require.Equal(t, []string{"stmt-0001"}, ids(), "sent twice with one id: one signal")
	r := runCLI(t, "statement-arrived", "--date", testDateText, "--database-url", dbURL)
	require.Equal(t, 0, r.code, r.stderr)
	require.Equal(t, []string{"bank-statement/" + testDateText, "stmt-0001"}, ids())
}

// serve's POST /ops/statement is statement-arrived over HTTP: refused without the operators'
// credentials configured, refused without them sent, and a retried request (same id, in the
// body or as Idempotency-Key) stores one signal.
func TestServeStatementEndpoint(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	pool, err := openPool(ctx, seededDBURL(t), 0)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	svc, err := settlement.NewService(pool, &settlement.ServiceConfig{Bank: dialBank("http://127.0.0.1:1", time.Second), Logger: quietLogger()})
	require.NoError(t, err)
	post := func(h http.Handler, body string, header map[string]string, user string) (int, string) {
		req := httptest.NewRequest(http.MethodPost, "/ops/statement", strings.NewReader(body))
		req.RemoteAddr = "127.0.0.1:5000"
		req.Host = "127.0.0.1:8080"
		req.Header.Set("Content-Type", "application/json")
		for k, v := range header {
			req.Header.Set(k, v)
		}
		if user != "" {
			req.SetBasicAuth(user, "pw-for-tests")
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Code, rec.Body.String()
	}
	t.Setenv("CONSOLE_USER", "")
	t.Setenv("CONSOLE_PASSWORD", "")
	ops := serveOps{metricsInterval: time.Second, maxScrapes: 4, maxUIRequests: 4}
	ops.auth = &operatorAuth{}
	h, err := serveHandler(ctx, svc, &readiness{}, ops, quietLogger())
	require.NoError(t, err)
	code, body := post(h, `{"date": "2026-03-01", "id": "s1"}`, nil, "ops")
	require.Equal(t, http.StatusForbidden, code, body)
	require.Contains(t, body, "RIVERUI_USER and RIVERUI_PASSWORD")

	ops.auth = &operatorAuth{RiverUser: "ops", RiverPassword: "pw-for-tests"}
	h, err = serveHandler(ctx, svc, &readiness{}, ops, quietLogger())
	require.NoError(t, err)
	code, _ = post(h, `{"date": "2026-03-01", "id": "s1"}`, nil, "")
	require.Equal(t, http.StatusUnauthorized, code)
	for _, bad := range []string{`{"date": "2026-02-30"}`, `{"date": "2026-03-01", "id": "a\u001b[2Jb"}`, `{"date": "2026-03-01", "extra": 1}`, `not json`} {
		code, body = post(h, bad, nil, "ops")
		require.Equal(t, http.StatusBadRequest, code, "%s: %s", bad, body)
	}
	for range 2 {
		code, body = post(h, `{"date": "2026-03-01", "id": "s1"}`, nil, "ops")
		require.Equal(t, http.StatusAccepted, code, body)
		require.Contains(t, body, `"run":"reconcile/2026-03-01"`)
		code, body = post(h, `{"date": "2026-03-01"}`, map[string]string{"Idempotency-Key": "s2"}, "ops")
		require.Equal(t, http.StatusAccepted, code, body)
	}
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM stepwise_signal WHERE run_key = 'reconcile/2026-03-01'`).Scan(&n))
	require.Equal(t, 2, n, "four requests, two statement ids: two signals")
}
