package console_test

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"html"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise"
	"github.com/stepwise-go/stepwise/console"
	"github.com/stepwise-go/stepwise/internal/outbox"
	"github.com/stepwise-go/stepwise/internal/reconcile"
	"github.com/stepwise-go/stepwise/internal/testkit"
	"github.com/stepwise-go/stepwise/internal/workflow"
)

// operators are the people of these tests: each signs in with their own name.
var operators = map[string]string{"alice": "alice-pw-for-tests", "bob": "bob-pw-for-tests"}

// desk is a console served over real HTTP on a real database, with an outbox and a reconciler
// whose external system the test steers: what a send does, and what a lookup finds.
type desk struct {
	pool *pgxpool.Pool
	ob   *outbox.Outbox
	rec  *reconcile.Reconciler
	srv  *httptest.Server
	// send: "notsent" (the bank refused the connection: RETRYABLE, MANUAL after one
	// attempt) or "ambiguous" (a timeout: UNKNOWN_EXTERNAL).
	send atomic.Value
	// found is the amount the bank holds for any payout the reconciler looks up.
	found atomic.Int64
}

func newDesk(t *testing.T) *desk {
	t.Helper()
	ctx := context.Background()
	d := &desk{pool: testkit.DB(t)}
	d.send.Store("notsent")
	d.found.Store(999)
	discard := slog.New(slog.DiscardHandler)
	ob, err := outbox.New(d.pool, &outbox.Config{ID: "desk", Logger: discard, Kinds: map[string]*outbox.KindConfig{
		"payout": {
			Sender: outbox.SendFunc(func(context.Context, *outbox.Operation) (outbox.Receipt, error) {
				if d.send.Load() == "notsent" {
					return outbox.Receipt{}, outbox.NotSent(errors.New("dial tcp: connection refused"))
				}
				return outbox.Receipt{}, errors.New("read: i/o timeout")
			}),
			MaxAttempts:  1,
			RetryBackoff: func(int) time.Duration { return 0 },
		},
	}})
	require.NoError(t, err)
	require.NoError(t, ob.Register(ctx))
	rec, err := reconcile.New(d.pool, &reconcile.Config{Outbox: ob, Logger: discard, Kinds: map[string]*reconcile.KindConfig{
		"payout": {
			Checker: reconcile.CheckerFunc(func(_ context.Context, op *outbox.Operation) (reconcile.LookupResult, error) {
				return reconcile.LookupResult{Status: reconcile.LookupFoundSucceeded, ExternalRef: "bank-" + op.ID.String()[:8],
					Amount: d.found.Load(), Currency: "EUR"}, nil
			}),
			CheckBackoff: func(int) time.Duration { return 0 },
		},
	}})
	require.NoError(t, err)
	d.ob, d.rec = ob, rec
	// The console acts through an operator client, as a console outside the service does:
	// "payout" has no outcome callback here.
	client, err := stepwise.NewOperatorClient(d.pool, "payout")
	require.NoError(t, err)
	cfg := &console.Config{
		Prefix: "/console",
		Client: client,
		Logger: discard,
		Authenticate: func(r *http.Request) (string, bool) {
			u, p, ok := r.BasicAuth()
			want, known := operators[u]
			return u, ok && known && subtle.ConstantTimeCompare([]byte(p), []byte(want)) == 1
		},
	}
	h, err := console.New(d.pool, cfg)
	require.NoError(t, err)
	d.srv = httptest.NewServer(h)
	t.Cleanup(d.srv.Close)
	return d
}

// enqueue writes payouts of 1000 EUR "<prefix>-0".. and sends them once: with send
// "notsent" and MaxAttempts 1 each is MANUAL ("gave up: not sent after 1 attempts").
func (d *desk) enqueue(t testing.TB, prefix string, n int) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, pgx.BeginFunc(ctx, d.pool, func(tx pgx.Tx) error {
		for i := range n {
			if _, err := outbox.Enqueue(ctx, tx, outbox.EnqueueParams{Kind: "payout", BusinessKey: fmt.Sprintf("%s-%d", prefix, i),
				Payload: []byte(`{"account":"acct"}`), Amount: 1000, Currency: "EUR"}); err != nil {
				return err
			}
		}
		return nil
	}))
	d.machines(t)
}

// machines is one round of what runs beside the operators: the dispatcher sends what is due,
// the reconciler looks up what is unknown.
func (d *desk) machines(t testing.TB) {
	t.Helper()
	ctx := context.Background()
	_, err := d.ob.Drain(ctx, "payout")
	require.NoError(t, err)
	_, err = d.rec.RunOnce(ctx, &reconcile.RunOpts{Force: true})
	require.NoError(t, err)
}

// operator is one person at the console, with their own HTTP client.
type operator struct {
	name string
	base string
	c    *http.Client
}

func (d *desk) operator(name string) *operator {
	return &operator{name: name, base: d.srv.URL, c: &http.Client{
		Timeout:       30 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}}
}

func (o *operator) do(method, path string, form url.Values) (int, string, error) {
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	r, err := http.NewRequest(method, o.base+path, body)
	if err != nil {
		return 0, "", err
	}
	r.SetBasicAuth(o.name, operators[o.name])
	if form != nil {
		r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		r.Header.Set("Origin", o.base)
		r.Header.Set("Sec-Fetch-Site", "same-origin")
	}
	res, err := o.c.Do(r)
	if err != nil {
		return 0, "", err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	return res.StatusCode, html.UnescapeString(string(b)), err
}

func (o *operator) get(t testing.TB, path string) string {
	t.Helper()
	status, body, err := o.do(http.MethodGet, path, nil)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, status, "%s GET %s: %s", o.name, path, body)
	return body
}

var (
	hiddenRE = regexp.MustCompile(`<input type="hidden" name="([a-z_]+)" value="([^"]*)">`)
	formRE   = regexp.MustCompile(`(?s)<form class="act" id="([a-z]+-form)".*?</form>`)
)

// form returns the hidden fields of the page's form with that id, exactly as the browser
// would post them; nil when the page has no such form.
func form(page, id string) url.Values {
	for _, m := range formRE.FindAllStringSubmatch(page, -1) {
		if m[1] != id {
			continue
		}
		v := url.Values{}
		for _, f := range hiddenRE.FindAllStringSubmatch(m[0], -1) {
			v.Set(f[1], f[2])
		}
		return v
	}
	return nil
}

func (d *desk) op(t testing.TB, key string) *outbox.Operation {
	t.Helper()
	op, err := outbox.Get(context.Background(), d.pool, outbox.OperationID("payout", key))
	require.NoError(t, err)
	return op
}

// TestStaleResolveFormIsRefused (ABA): alice reads a payout MANUAL because it was never sent
// and decides FAILED_PERMANENT. Before she submits, bob sends it again (RETRYABLE), the send
// times out, and the reconciler finds the bank holds 999 EUR: MANUAL again, for another reason.
// Her form, decided on "never sent", must not be recorded: the bank paid.
func TestStaleResolveFormIsRefused(t *testing.T) {
	t.Parallel()
	d := newDesk(t)
	d.enqueue(t, "aba", 1)
	op := d.op(t, "aba-0")
	require.Equal(t, outbox.StateManual, op.State)
	require.Contains(t, op.ManualReason, "not sent")
	path := "/console/operation?id=" + op.ID.String()

	alice, bob := d.operator("alice"), d.operator("bob")
	aliceForm := form(alice.get(t, path), "resolve-form")
	require.NotNil(t, aliceForm)

	bobForm := form(bob.get(t, path), "resolve-form")
	bobForm.Set("outcome", "RETRYABLE")
	bobForm.Set("reason", "TICKET-1: the bank's outage is over, send it again")
	status, body, err := bob.do(http.MethodPost, "/console/operation/resolve", bobForm)
	require.NoError(t, err)
	require.Equal(t, http.StatusSeeOther, status, body)
	d.send.Store("ambiguous")
	d.machines(t) // sent again: timeout, UNKNOWN_EXTERNAL
	d.machines(t) // the reconciler: the bank holds 999 EUR, MANUAL
	op = d.op(t, "aba-0")
	require.Equal(t, outbox.StateManual, op.State)
	require.Contains(t, op.ManualReason, "999 EUR")

	aliceForm.Set("outcome", "FAILED_PERMANENT")
	aliceForm.Set("reason", "TICKET-2: never sent, the bank confirms")
	status, body, err = alice.do(http.MethodPost, "/console/operation/resolve", aliceForm)
	require.NoError(t, err)
	require.Equal(t, http.StatusConflict, status, "a decision on the MANUAL episode alice saw was recorded on another one: %s", body)
	require.Contains(t, body, "999 EUR", "the refusal shows the new evidence")
	require.Equal(t, outbox.StateManual, d.op(t, "aba-0").State)
	var actions int
	require.NoError(t, d.pool.QueryRow(context.Background(), `SELECT count(*) FROM stepwise_event WHERE kind = $1 AND actor = 'alice'`, console.ActionEvent).Scan(&actions))
	require.Zero(t, actions, "nothing of alice's stale decision is in the audit trail")
}

// addFailedRun writes a run with its checkpoint, claimed and failed as a worker leaves it.
func (d *desk) addFailedRun(t testing.TB, key, lastError string) {
	t.Helper()
	ctx := context.Background()
	_, err := d.pool.Exec(ctx, `INSERT INTO stepwise_checkpoint (key, cursor, fencing_token, steps) VALUES ($1, '{"next":7}', 3, 7)`, key)
	require.NoError(t, err)
	_, err = d.pool.Exec(ctx, `INSERT INTO stepwise_run (key, workflow, input) VALUES ($1, 'settle', '{}')`, key)
	require.NoError(t, err)
	d.workerMoves(t, key, workflow.RunStatusRunning, "")
	d.workerMoves(t, key, workflow.RunStatusFailed, lastError)
}

// workerMoves moves a run as a worker does (claim: running; a step error on its last attempt:
// failed), with the event a test can find. The worker itself is workflow's to test; here it
// is the thing that moves runs while operators look at them.
func (d *desk) workerMoves(t testing.TB, key string, to workflow.RunStatus, lastError string) {
	t.Helper()
	require.NoError(t, d.moveRun(context.Background(), key, to, lastError))
}

func (d *desk) moveRun(ctx context.Context, key string, to workflow.RunStatus, lastError string) error {
	return pgx.BeginFunc(ctx, d.pool, func(tx pgx.Tx) error {
		var from string
		if err := tx.QueryRow(ctx, `SELECT status FROM stepwise_run WHERE key = $1 FOR UPDATE`, key).Scan(&from); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `UPDATE stepwise_run SET status = $2, last_error = coalesce(nullif($3, ''), last_error),
				finished_at = CASE WHEN $2 IN ('failed', 'cancelled', 'succeeded') THEN now() END, updated_at = now() WHERE key = $1`,
			key, string(to), lastError); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO stepwise_event (subject, kind, from_state, to_state, actor, detail)
			VALUES ($1, 'test.worker', $2, $3, 'worker-1', jsonb_build_object('error', $4::text))`, key, from, string(to), lastError)
		return err
	})
}

// TestStaleResumeFormIsRefused (ABA): alice reads a run failed on a bank outage and decides to
// resume it. Before she submits, bob resumes it, it runs and fails again, now on a bank
// refusal nobody should retry blindly. Her form, decided on the outage, must not resume it.
func TestStaleResumeFormIsRefused(t *testing.T) {
	t.Parallel()
	d := newDesk(t)
	d.addFailedRun(t, "settle/aba", "bank outage: 503")
	alice, bob := d.operator("alice"), d.operator("bob")
	path := "/console/run?key=settle/aba"
	aliceForm := form(alice.get(t, path), "resume-form")
	require.NotNil(t, aliceForm)

	bobForm := form(bob.get(t, path), "resume-form")
	bobForm.Set("reason", "INC-1: the bank is back")
	status, body, err := bob.do(http.MethodPost, "/console/run/resume", bobForm)
	require.NoError(t, err)
	require.Equal(t, http.StatusSeeOther, status, body)
	d.workerMoves(t, "settle/aba", workflow.RunStatusRunning, "")
	d.workerMoves(t, "settle/aba", workflow.RunStatusFailed, "bank refuses account acct-9: frozen by compliance")

	aliceForm.Set("reason", "INC-1: the bank is back")
	status, body, err = alice.do(http.MethodPost, "/console/run/resume", aliceForm)
	require.NoError(t, err)
	require.Equal(t, http.StatusConflict, status, "a resume decided on the first failure was applied to the second: %s", body)
	require.Contains(t, body, "frozen by compliance", "the refusal shows the new evidence")
	run, err := workflow.GetRun(context.Background(), d.pool, "settle/aba")
	require.NoError(t, err)
	require.Equal(t, workflow.RunStatusFailed, run.Status)
}

// daySize is the number of payouts and runs of TestOperatorsDay: small in CI, larger with
// STEPWISE_OPERATORS_DAY=N.
func daySize() (payouts, runs int, budget time.Duration) {
	if n, err := strconv.Atoi(os.Getenv("STEPWISE_OPERATORS_DAY")); err == nil && n > 0 {
		return n, n / 4, time.Duration(n) * 300 * time.Millisecond
	}
	return 24, 6, 8 * time.Second
}

// sameRows: each operator picks among the first rows of a list, as people work the top of a
// queue, so the two of them meet on the same payouts and runs at any size.
const sameRows = 4

// decision is one form an operator submitted, with what they saw when they filled it.
type decision struct {
	who, subject string
	seenEvents   int64 // payouts: op.transition rows on the page; runs: the newest event id shown
	status       int
	aba          bool // refused although the state was the one seen: it had moved and come back
}

var auditRowRE = regexp.MustCompile(`<tr class="audit-row"><td>\d+</td><td>[^<]*</td><td>op\.transition</td>`)
var eventIDRE = regexp.MustCompile(`<table id="events">\s*<tr>.*?</tr>\s*<tr><td>(\d+)</td>`)

// TestOperatorsDay: two operators work the same MANUAL payouts and failed runs at once over
// HTTP while the dispatcher, the reconciler and the workers move them. Every decision the
// console records was taken on the evidence that was current when it was recorded: for a
// payout, no transition between the page the operator read and the decision; for a run, no
// status change. Stale forms are refused, and the refusals include ABA cases (the payout MANUAL
// again, for another reason).
func TestOperatorsDay(t *testing.T) {
	t.Parallel()
	nPayouts, nRuns, budget := daySize()
	d := newDesk(t)
	d.enqueue(t, "day", nPayouts)
	d.send.Store("ambiguous") // every resend times out; the reconciler finds 999 EUR: MANUAL again
	for i := range nRuns {
		d.addFailedRun(t, fmt.Sprintf("settle/day-%d", i), "bank outage: 503")
	}
	// An operator thinks (reads the trail, calls the bank) up to think between the page and the
	// form: long enough, at any size, for the machines to move a payout and bring it back.
	think := budget / 400
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()

	var wg sync.WaitGroup
	// The machines: send, reconcile, and run resumed runs into a new failure.
	var machineErr atomic.Value
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			if _, err := d.ob.Drain(ctx, "payout"); err != nil && ctx.Err() == nil {
				machineErr.Store(err)
				return
			}
			if _, err := d.rec.RunOnce(ctx, &reconcile.RunOpts{Force: true}); err != nil && ctx.Err() == nil {
				machineErr.Store(err)
				return
			}
			rows, err := d.pool.Query(ctx, `SELECT key, status FROM stepwise_run WHERE status IN ('pending', 'running')`)
			if err != nil {
				continue
			}
			type kv struct{ k, s string }
			live, _ := pgx.CollectRows(rows, func(r pgx.CollectableRow) (kv, error) {
				var x kv
				err := r.Scan(&x.k, &x.s)
				return x, err
			})
			for _, r := range live {
				to, msg := workflow.RunStatusRunning, ""
				if r.s == "running" {
					to, msg = workflow.RunStatusFailed, "bank refuses: attempt "+strconv.Itoa(rand.IntN(1000))
				}
				if err := d.moveRun(ctx, r.k, to, msg); err != nil && ctx.Err() == nil {
					machineErr.Store(err)
					return
				}
			}
			time.Sleep(time.Duration(rand.IntN(5)) * time.Millisecond)
		}
	}()

	var mu sync.Mutex
	var decisions []decision
	linkRE := regexp.MustCompile(`href="/console/operation\?id=([0-9a-f-]{36})"`)
	runRE := regexp.MustCompile(`href="/console/run\?key=([^"]+)"`)
	for name := range operators {
		o := d.operator(name)
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(len(name)), 7))
			for ctx.Err() == nil {
				if rng.IntN(4) == 0 {
					_, list, err := o.do(http.MethodGet, "/console/runs?status=failed", nil)
					if err != nil {
						continue
					}
					keys := runRE.FindAllStringSubmatch(list, -1)
					if len(keys) == 0 {
						continue
					}
					key, err := url.QueryUnescape(keys[rng.IntN(min(len(keys), sameRows))][1])
					if err != nil {
						continue
					}
					_, page, err := o.do(http.MethodGet, "/console/run?key="+url.QueryEscape(key), nil)
					f := form(page, "resume-form")
					m := eventIDRE.FindStringSubmatch(page)
					if err != nil || f == nil || m == nil {
						continue
					}
					seen, _ := strconv.ParseInt(m[1], 10, 64)
					time.Sleep(time.Duration(rng.Int64N(int64(think)))) // reading the trail
					f.Set("reason", "INC-7: "+name+" resumes after reading the trail")
					status, body, err := o.do(http.MethodPost, "/console/run/resume", f)
					if err == nil {
						mu.Lock()
						decisions = append(decisions, decision{who: name, subject: key, seenEvents: seen, status: status, aba: strings.Contains(body, "came back to")})
						mu.Unlock()
					}
					continue
				}
				_, list, err := o.do(http.MethodGet, "/console/operations?state=MANUAL", nil)
				if err != nil {
					continue
				}
				ids := linkRE.FindAllStringSubmatch(list, -1)
				if len(ids) == 0 {
					continue
				}
				id := ids[rng.IntN(min(len(ids), sameRows))][1]
				_, page, err := o.do(http.MethodGet, "/console/operation?id="+id, nil)
				f := form(page, "resolve-form")
				if err != nil || f == nil {
					continue
				}
				seen := int64(len(auditRowRE.FindAllString(page, -1)))
				time.Sleep(time.Duration(rng.Int64N(int64(think)))) // calling the bank
				f.Set("outcome", []string{"RETRYABLE", "RETRYABLE", "RETRYABLE", "RETRYABLE", "SUCCEEDED", "FAILED_PERMANENT"}[rng.IntN(6)])
				f.Set("reason", "TICKET-9: "+name+" decides on what the page shows")
				status, body, err := o.do(http.MethodPost, "/console/operation/resolve", f)
				if err == nil {
					mu.Lock()
					decisions = append(decisions, decision{who: name, subject: "op:" + id, seenEvents: seen, status: status, aba: strings.Contains(body, "came back to")})
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	if err, _ := machineErr.Load().(error); err != nil {
		t.Fatalf("the machines failed: %v", err)
	}

	bg := context.Background()
	var recorded, refused, aba, runs, stale int
	for _, dc := range decisions {
		if !strings.HasPrefix(dc.subject, "op:") {
			runs++
		}
		switch dc.status {
		case http.StatusSeeOther:
			recorded++
		case http.StatusConflict:
			refused++
			if dc.aba {
				aba++
			}
			continue
		default:
			t.Fatalf("%s's decision on %s answered %d", dc.who, dc.subject, dc.status)
		}
	}
	// Exact check per recorded decision, independent of how the console guards: for each
	// manual transition, the transitions before it must be those its operator saw. The pages
	// an operator read are paired with their decisions in order, per operator and subject.
	type pair struct{ who, subject string }
	queue := map[pair][]int64{}
	for _, dc := range decisions {
		if dc.status == http.StatusSeeOther {
			p := pair{dc.who, dc.subject}
			queue[p] = append(queue[p], dc.seenEvents)
		}
	}
	for p, seens := range queue {
		if strings.HasPrefix(p.subject, "op:") {
			rows, err := d.pool.Query(bg, `SELECT (SELECT count(*) FROM stepwise_event b WHERE b.subject = e.subject AND b.kind = 'op.transition' AND b.id < e.id)
				FROM stepwise_event e WHERE e.subject = $1 AND e.kind = 'op.transition' AND e.actor = $2 AND e.detail->>'resolution' = 'manual' ORDER BY e.id`, p.subject, p.who)
			require.NoError(t, err)
			befores, err := pgx.CollectRows(rows, pgx.RowTo[int64])
			require.NoError(t, err)
			require.Len(t, befores, len(seens), "%s's recorded decisions on %s", p.who, p.subject)
			for i := range seens {
				if befores[i] != seens[i] {
					stale++
					t.Errorf("%s decided on %s having seen %d transitions; %d had happened when it was recorded", p.who, p.subject, seens[i], befores[i])
				}
			}
			continue
		}
		for i, seen := range seens {
			var moved int64
			require.NoError(t, d.pool.QueryRow(bg, `WITH mine AS (
					SELECT id FROM stepwise_event WHERE subject = $1 AND kind = 'run.resume' AND actor = $2 ORDER BY id OFFSET $3 LIMIT 1)
				SELECT count(*) FROM stepwise_event b, mine WHERE b.subject = $1 AND b.id > $4 AND b.id < mine.id AND b.kind IN ('test.worker', 'run.resume')`,
				p.subject, p.who, i, seen).Scan(&moved))
			if moved > 0 {
				stale++
				t.Errorf("%s resumed %s after reading its trail up to event %d; it changed status %d times before the resume was recorded", p.who, p.subject, seen, moved)
			}
		}
	}
	t.Logf("operator's day: %d payouts, %d runs, %d decisions submitted (%d on runs): %d recorded, %d refused as stale (%d of them ABA: the state seen, moved and come back); %d recorded on stale evidence",
		nPayouts, nRuns, len(decisions), runs, recorded, refused, aba, stale)
	require.NotZero(t, recorded, "the operators decided nothing: the day proves nothing")
	require.NotZero(t, refused, "no form went stale: the day did not exercise the race")
}
