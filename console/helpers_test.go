package console_test

import (
	"context"
	"fmt"
	"html"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise"
	"github.com/stepwise-go/stepwise/console"
	"github.com/stepwise-go/stepwise/internal/outbox"
	"github.com/stepwise-go/stepwise/internal/reconcile"
	"github.com/stepwise-go/stepwise/internal/testkit"
	"github.com/stepwise-go/stepwise/workflow"
)

func TestMain(m *testing.M) { os.Exit(testkit.Main(m)) }

// fixture is a database with an outbox and reconciler for kind "payout" and the console on it,
// acting through an operator client (payout has no outcome callback).
type fixture struct {
	pool   *pgxpool.Pool
	rec    *reconcile.Reconciler
	client *stepwise.Client
	h      http.Handler
	cfg    *console.Config
}

const (
	testUser     = "alice"
	testPassword = "s3cret-for-tests"
)

func newReconciler(t testing.TB, pool *pgxpool.Pool) *reconcile.Reconciler {
	t.Helper()
	discard := slog.New(slog.DiscardHandler)
	ob, err := outbox.New(pool, &outbox.Config{ID: "test", Logger: discard, Kinds: map[string]*outbox.KindConfig{
		"payout": {Sender: outbox.SendFunc(func(context.Context, *outbox.Operation) (outbox.Receipt, error) {
			return outbox.Receipt{}, nil
		})},
	}})
	require.NoError(t, err)
	// The fixtures enqueue payouts: the kind must be registered, as a service's outbox does.
	require.NoError(t, ob.Register(context.Background()))
	rec, err := reconcile.New(pool, &reconcile.Config{Outbox: ob, Logger: discard, Kinds: map[string]*reconcile.KindConfig{
		"payout": {Checker: reconcile.CheckerFunc(func(context.Context, *outbox.Operation) (reconcile.LookupResult, error) {
			return reconcile.LookupResult{Status: reconcile.LookupNotFound}, nil
		})},
	}})
	require.NoError(t, err)
	return rec
}

// newFixture builds the console with credentials, a reconciler and a statement; mod adjusts
// the config first.
func newFixture(t testing.TB, mod func(*console.Config)) *fixture {
	t.Helper()
	pool := testkit.DB(t)
	client, err := stepwise.NewOperatorClient(pool, "payout")
	require.NoError(t, err)
	f := &fixture{pool: pool, rec: newReconciler(t, pool), client: client}
	f.cfg = &console.Config{
		Prefix:       "/console",
		Authenticate: console.BasicAuth(testUser, testPassword),
		Client:       f.client,
		Logger:       slog.New(slog.DiscardHandler),
	}
	if mod != nil {
		mod(f.cfg)
	}
	h, err := console.New(pool, f.cfg)
	require.NoError(t, err)
	f.h = h
	return f
}

// enqueue writes payouts "<prefix>-0".."<prefix>-(n-1)" for run, committed one by one so
// that created_at orders them.
func (f *fixture) enqueue(t testing.TB, prefix, run string, n int) {
	t.Helper()
	ctx := context.Background()
	for i := range n {
		require.NoError(t, pgx.BeginFunc(ctx, f.pool, func(tx pgx.Tx) error {
			_, err := outbox.Enqueue(ctx, tx, outbox.EnqueueParams{Kind: "payout", BusinessKey: fmt.Sprintf("%s-%d", prefix, i),
				Payload: []byte(`{"account":"acct"}`), Amount: int64(1000 + i), Currency: "EUR", RunKey: run})
			return err
		}))
	}
}

// setState puts an operation in a state as the outbox would have (test data, not a
// transition under test).
func (f *fixture) setState(t testing.TB, businessKey string, state outbox.State, reason string) {
	t.Helper()
	_, err := f.pool.Exec(context.Background(), `UPDATE stepwise_operation SET state = $2,
			manual_reason = nullif($3, ''), attempts = 1, last_sent_at = now(),
			next_check_at = CASE WHEN $2 = 'UNKNOWN_EXTERNAL' THEN now() END,
			unknown_since = CASE WHEN $2 = 'UNKNOWN_EXTERNAL' THEN now() END,
			finished_at = CASE WHEN $2 IN ('SUCCEEDED', 'FAILED_PERMANENT') THEN now() END
		WHERE kind = 'payout' AND business_key = $1`, businessKey, string(state), reason)
	require.NoError(t, err)
}

// addRun writes a run and its checkpoint as workflow.Start and a worker would leave them.
func (f *fixture) addRun(t testing.TB, key, wf string, status workflow.RunStatus, schedule string) {
	t.Helper()
	ctx := context.Background()
	_, err := f.pool.Exec(ctx, `INSERT INTO stepwise_checkpoint (key, cursor, fencing_token, steps) VALUES ($1, '{"next":7}', 3, 7)`, key)
	require.NoError(t, err)
	_, err = f.pool.Exec(ctx, `INSERT INTO stepwise_run (key, workflow, input, status, schedule, slot, shard)
		VALUES ($1, $2, '{}', $3, nullif($4, ''), CASE WHEN $4 <> '' THEN timestamptz '2026-03-01 00:00Z' END, CASE WHEN $4 <> '' THEN 0 END)`,
		key, wf, status, schedule)
	require.NoError(t, err)
	_, err = f.pool.Exec(ctx, `INSERT INTO stepwise_event (subject, kind, actor, token) VALUES ($1, 'lease.claim', 'worker-1', 3)`, key)
	require.NoError(t, err)
}

// request is one request to the console.
type request struct {
	method, target string
	form           url.Values
	auth           bool   // basic-auth as testUser
	remote         string // default 127.0.0.1
	header         map[string]string
}

type response struct {
	status int
	body   string
	text   string // body with HTML entities decoded, for messages
	header http.Header
}

func (f *fixture) do(t testing.TB, rq request) response {
	t.Helper()
	var body io.Reader
	if rq.form != nil {
		body = strings.NewReader(rq.form.Encode())
	}
	method := rq.method
	if method == "" {
		method = http.MethodGet
	}
	r := httptest.NewRequest(method, "http://console.test"+rq.target, body)
	r.RemoteAddr = "127.0.0.1:40000"
	if rq.remote != "" {
		r.RemoteAddr = rq.remote
	}
	if rq.form != nil {
		r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	if rq.auth {
		r.SetBasicAuth(testUser, testPassword)
	}
	for k, v := range rq.header {
		r.Header.Set(k, v)
	}
	w := httptest.NewRecorder()
	f.h.ServeHTTP(w, r)
	return response{status: w.Code, body: w.Body.String(), text: html.UnescapeString(w.Body.String()), header: w.Header()}
}

// get is an authenticated GET that must answer 200.
func (f *fixture) get(t testing.TB, target string) string {
	t.Helper()
	res := f.do(t, request{target: target, auth: true})
	require.Equal(t, http.StatusOK, res.status, "GET %s: %s", target, res.body)
	return res.body
}

var csrfRE = regexp.MustCompile(`name="csrf" value="([0-9a-f]+)"`)

// csrf reads the CSRF token from a page's form.
func csrf(t testing.TB, page string) string {
	t.Helper()
	m := csrfRE.FindStringSubmatch(page)
	require.NotNil(t, m, "no CSRF token on the page")
	return m[1]
}

// post is an authenticated same-origin form POST.
func (f *fixture) post(t testing.TB, target string, form url.Values) response {
	t.Helper()
	return f.do(t, request{method: http.MethodPost, target: target, form: form, auth: true,
		header: map[string]string{"Origin": "http://console.test", "Sec-Fetch-Site": "same-origin"}})
}

// events returns "kind actor from>to" of a subject's events, oldest first.
func (f *fixture) events(t testing.TB, subject string) []string {
	t.Helper()
	rows, err := f.pool.Query(context.Background(), `SELECT kind || ' ' || coalesce(actor, '') || ' ' || coalesce(from_state, '') || '>' || coalesce(to_state, '')
		FROM stepwise_event WHERE subject = $1 ORDER BY id`, subject)
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return out
}

// internals are strings a 4xx or 5xx body must never show: they name the database.
var internals = []string{"SQLSTATE", "pgx", "postgres", "stepwise_test_", "127.0.0.1:5432", "syntax error"}

func requireNoInternals(t testing.TB, body string) {
	t.Helper()
	for _, s := range internals {
		require.NotContains(t, body, s)
	}
}
