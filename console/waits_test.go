package console_test

import (
	"context"
	"log/slog"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/internal/outbox"
	"github.com/stepwise-go/stepwise/internal/workflow"
)

// addWait records a run's open wait as a step's commit leaves it (workflow.WaitFor...),
// begun five minutes ago and timing out in an hour.
func (f *fixture) addWait(t testing.TB, key, kind string, manualAtRest bool, children []string, signal string) {
	t.Helper()
	_, err := f.pool.Exec(context.Background(), `INSERT INTO stepwise_wait (run_key, kind, manual_at_rest, children, signal_name, since, deadline)
		VALUES ($1, $2, $3, $4, nullif($5, ''), now() - interval '5 minutes', now() + interval '1 hour')`, key, kind, manualAtRest, children, signal)
	require.NoError(t, err)
}

// setParent records parent as the run that started key (Step.StartChild).
func (f *fixture) setParent(t testing.TB, key, parent string) {
	t.Helper()
	_, err := f.pool.Exec(context.Background(), `UPDATE stepwise_run SET parent_key = $2 WHERE key = $1`, key, parent)
	require.NoError(t, err)
}

func (f *fixture) runKeys(t testing.TB, q string) []string {
	t.Helper()
	var out []string
	for _, m := range regexp.MustCompile(`class="run-link" href="[^"]*">([^<]+)<`).FindAllStringSubmatch(f.get(t, "/console/runs"+q), -1) {
		out = append(out, m[1])
	}
	return out
}

// TestRunPageSaysWhatTheRunWaitsFor: a run waiting for its operations, one of them MANUAL,
// says so on its page (what is missing, since when, until when, a link to the MANUAL
// operation); the overview counts it as held up by a MANUAL operation and the runs list
// selects it, until the operation is resolved. A wait that counts MANUAL as at rest is not
// held up, and a cancelled run's leftover wait row is no wait.
func TestRunPageSaysWhatTheRunWaitsFor(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	f.addRun(t, "pay/1", "settle", workflow.RunStatusRunning, "")
	f.enqueue(t, "w", "pay/1", 3)
	f.setState(t, "w-0", outbox.StateManual, "the bank says nothing")
	f.setState(t, "w-1", outbox.StateSucceeded, "")
	f.addWait(t, "pay/1", "operations", false, nil, "")
	f.addRun(t, "pay/2", "settle", workflow.RunStatusRunning, "")
	f.enqueue(t, "m", "pay/2", 1)
	f.setState(t, "m-0", outbox.StateManual, "mismatch")
	f.addWait(t, "pay/2", "operations", true, nil, "")
	f.addRun(t, "pay/3", "settle", workflow.RunStatusCancelled, "")
	f.addWait(t, "pay/3", "operations", false, nil, "")
	f.addRun(t, "idle/1", "settle", workflow.RunStatusRunning, "")

	body := f.get(t, "/console/run?key=pay/1")
	require.Contains(t, body, `id="run-wait"`)
	require.Contains(t, body, `<b id="run-wait-missing">2 of 3 operations not at rest; 1 MANUAL</b>`)
	require.Regexp(t, `id="run-wait-manual" href="/console/operations\?run=pay%2F1&amp;state=MANUAL"`, body)
	require.Contains(t, body, "needs a person")
	require.Regexp(t, `times out <span id="run-wait-deadline">\d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ</span> \(<span>in (59m\d+s|1h0m0s)</span>\)`, body)
	require.Regexp(t, `since <span id="run-wait-since">[^<]+</span> \(5m\d+s\)`, body)

	body = f.get(t, "/console/run?key=pay/2")
	require.Contains(t, body, `<b id="run-wait-missing">0 of 1 operations not at rest; 1 MANUAL (counted at rest)</b>`)
	require.NotContains(t, body, "needs a person", "WaitForOperationsOrManual goes on with a MANUAL operation")
	require.NotContains(t, f.get(t, "/console/run?key=pay/3"), `id="run-wait"`, "a cancelled run waits for nothing")
	require.NotContains(t, f.get(t, "/console/run?key=idle/1"), `id="run-wait"`)

	body = f.get(t, "/console/")
	require.Regexp(t, `id="waiting-operations" href="/console/runs\?wait=operations">2<`, body)
	require.Regexp(t, `id="waiting-manual" href="/console/runs\?wait=manual" class="st st-MANUAL">1<`, body)
	require.Regexp(t, `id="waiting-signal" href="[^"]*">0<`, body)
	require.ElementsMatch(t, []string{"pay/1", "pay/2"}, f.runKeys(t, "?wait=operations"))
	require.Equal(t, []string{"pay/1"}, f.runKeys(t, "?wait=manual"))
	require.Equal(t, []string{"pay/1"}, f.runKeys(t, "?wait=manual&status=running&workflow=settle"))
	require.Empty(t, f.runKeys(t, "?wait=manual&status=pending"))
	require.Empty(t, f.runKeys(t, "?wait=signal"))
	require.Contains(t, f.get(t, "/console/runs?status=running"), `run-waiting">waiting for operations<`)
	res := f.do(t, request{target: "/console/runs?wait=MANUAL", auth: true})
	require.Equal(t, 400, res.status)
	require.Contains(t, res.text, `wait="MANUAL": want one of operations, children, signal, manual`)

	// Resolved: still waiting for w-2, no longer for a person.
	f.setState(t, "w-0", outbox.StateSucceeded, "")
	body = f.get(t, "/console/run?key=pay/1")
	require.Contains(t, body, `<b id="run-wait-missing">1 of 3 operations not at rest</b>`)
	require.NotContains(t, body, "run-wait-manual")
	require.Regexp(t, `id="waiting-manual" href="/console/runs\?wait=manual">0<`, f.get(t, "/console/"))
	require.Empty(t, f.runKeys(t, "?wait=manual"))

	// Woken: nothing missing, waiting for a worker.
	_, err := f.pool.Exec(context.Background(), `UPDATE stepwise_wait SET woken_at = now(), woken_by = 'operation' WHERE run_key = 'pay/1'`)
	require.NoError(t, err)
	require.Contains(t, f.get(t, "/console/run?key=pay/1"), `<b id="run-wait-missing">nothing: woken (operation), waiting for a worker</b>`)
}

// TestRunPageShowsItsFamily: a parent's page lists its children with their statuses (those
// that need a look first) and what its wait for them misses; a child's page links its
// parent; a large family is counted in full and listed up to 50.
func TestRunPageShowsItsFamily(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	ctx := context.Background()
	f.addRun(t, "batch/1", "fanout", workflow.RunStatusRunning, "")
	for k, st := range map[string]workflow.RunStatus{"batch/1/a": workflow.RunStatusSucceeded, "batch/1/b": workflow.RunStatusFailed, "batch/1/c": workflow.RunStatusRunning} {
		f.addRun(t, k, "shard", st, "")
		f.setParent(t, k, "batch/1")
	}
	f.addWait(t, "batch/1", "children", false, []string{"batch/1/a", "batch/1/c"}, "")

	body := f.get(t, "/console/run?key=batch/1")
	require.Contains(t, body, `<b id="run-wait-missing">1 of 2 child runs unfinished</b>`)
	require.Contains(t, body, `<a href="/console/run?key=batch%2f1%2fa">batch/1/a</a>, <a href="/console/run?key=batch%2f1%2fc">batch/1/c</a>`)
	require.Contains(t, body, `id="run-children-count">3: 1 running, 1 failed, 1 succeeded<`)
	var children, statuses []string
	for _, m := range regexp.MustCompile(`class="child-link" href="[^"]*">([^<]+)<`).FindAllStringSubmatch(body, -1) {
		children = append(children, m[1])
	}
	for _, m := range regexp.MustCompile(`child-status">([a-z]+)<`).FindAllStringSubmatch(body, -1) {
		statuses = append(statuses, m[1])
	}
	require.Equal(t, []string{"batch/1/c", "batch/1/b", "batch/1/a"}, children, "running, then failed, then succeeded")
	require.Equal(t, []string{"running", "failed", "succeeded"}, statuses)
	require.NotContains(t, body, "children-more")
	require.NotContains(t, body, `id="run-parent"`)

	body = f.get(t, "/console/run?key=batch/1/b")
	require.Contains(t, body, `id="run-parent"><a href="/console/run?key=batch%2f1">batch/1</a> <span class="st st-running">running</span>`)
	require.NotContains(t, body, `id="children"`, "a run without children shows no children")

	// A large family: counted in full, listed up to 50, the unfinished first.
	f.addRun(t, "big", "fanout", workflow.RunStatusRunning, "")
	_, err := f.pool.Exec(ctx, `INSERT INTO stepwise_checkpoint (key, cursor) SELECT 'big/' || i, '{}' FROM generate_series(1, 120) i`)
	require.NoError(t, err)
	_, err = f.pool.Exec(ctx, `INSERT INTO stepwise_run (key, workflow, input, status, parent_key)
		SELECT 'big/' || i, 'shard', '{}', CASE WHEN i <= 3 THEN 'pending' ELSE 'succeeded' END, 'big' FROM generate_series(1, 120) i`)
	require.NoError(t, err)
	body = f.get(t, "/console/run?key=big")
	require.Contains(t, body, `id="run-children-count">120: 3 pending, 117 succeeded<`)
	require.Contains(t, body, `id="children-more">50 of 120 shown`)
	require.Equal(t, 50, strings.Count(body, `class="child-link"`))
	require.Equal(t, 3, strings.Count(body, `child-status">pending<`))
	table := body[strings.Index(body, `id="children"`):]
	require.Less(t, strings.LastIndex(table, `child-status">pending<`), strings.Index(table, `child-status">succeeded<`), "the pending children first")

	// A parent whose row is gone (retention kept the child's key only).
	f.addRun(t, "orphan", "shard", workflow.RunStatusSucceeded, "")
	f.setParent(t, "orphan", "gone/1")
	require.Contains(t, f.get(t, "/console/run?key=orphan"), `(no longer in the database)`)
}

// TestWaitAndFamilyAreEscaped: what a workflow names (a signal, a child's key) reaches the
// page as text, never as markup.
func TestWaitAndFamilyAreEscaped(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	evilChild := `c/<img src=x onerror=alert(1)>`
	evilParent := `p/"><script>alert(2)</script>`
	f.addRun(t, evilParent, "fanout", workflow.RunStatusRunning, "")
	f.addRun(t, evilChild, "shard", workflow.RunStatusRunning, "")
	f.setParent(t, evilChild, evilParent)
	f.addWait(t, evilParent, "children", false, []string{evilChild}, "")
	f.addRun(t, "sig/1", "approve", workflow.RunStatusPending, "")
	f.addWait(t, "sig/1", "signal", false, nil, `<script>alert(3)</script>`)

	for _, key := range []string{evilParent, evilChild, "sig/1"} {
		res := f.do(t, request{target: "/console/run?key=" + url.QueryEscape(key), auth: true})
		require.Equal(t, 200, res.status, res.body)
		for _, raw := range []string{"<img", "<script>alert", `"><script`} {
			require.NotContains(t, res.body, raw, "page of %q", key)
		}
	}
	require.Contains(t, f.get(t, "/console/run?key="+url.QueryEscape(evilParent)), "c/&lt;img src=x onerror=alert(1)&gt;")
	res := f.do(t, request{target: "/console/run?key=sig/1", auth: true})
	require.Contains(t, res.text, `signal "<script>alert(3)</script>" not received`)
	require.Contains(t, res.body, `<code>&lt;script&gt;alert(3)&lt;/script&gt;</code>`)
	for _, q := range []string{"", "?wait=children", "?wait=signal"} {
		body := f.get(t, "/console/runs"+q)
		require.NotContains(t, body, "<img")
		require.NotContains(t, body, "<script>alert")
	}
}

// familyArgs drive familyWorker: a parent ("parent") starts two children and enqueues two
// payouts, then waits for its operations; a child ("child") waits for the signal "go".
type familyArgs struct {
	Mode string `json:"mode"`
}

func (familyArgs) Kind() string { return "console_test_family" }

type familyCursor struct {
	Phase int `json:"phase"`
}

type familyWorker struct {
	workflow.StepperDefaults[familyArgs, familyCursor]
}

func (familyWorker) Step(ctx context.Context, s *workflow.Step[familyArgs, familyCursor]) (workflow.Next, error) {
	if s.Cursor.Phase > 0 {
		return workflow.Done(), nil
	}
	s.Cursor.Phase = 1
	if s.Args.Mode == "child" {
		return workflow.WaitForSignal("go", time.Hour), nil
	}
	for _, k := range []string{"a", "b"} {
		if _, err := s.StartChild(ctx, s.RunKey+"/"+k, familyArgs{Mode: "child"}, nil); err != nil {
			return workflow.Next{}, err
		}
		if _, err := outbox.Enqueue(ctx, s.Tx, outbox.EnqueueParams{Kind: "payout", BusinessKey: s.RunKey + "/" + k,
			Payload: []byte(`{}`), Amount: 100, Currency: "EUR"}); err != nil {
			return workflow.Next{}, err
		}
	}
	return workflow.WaitForOperations(time.Hour), nil
}

// TestRunPageShowsARealWait: a workflow run by a worker waits for its operations (one MANUAL)
// and its children wait for a signal; the console shows what workflow committed, and a
// child's finish shows on its parent's page.
func TestRunPageShowsARealWait(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	ctx := context.Background()
	quiet := slog.New(slog.DiscardHandler)
	engine, err := workflow.New(f.pool, &workflow.Config{Logger: quiet, Lease: 5 * time.Second, MaintenanceInterval: time.Hour})
	require.NoError(t, err)
	rc := &river.Config{Queues: map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 4}}, Workers: river.NewWorkers(),
		FetchCooldown: 5 * time.Millisecond, FetchPollInterval: 50 * time.Millisecond, Logger: quiet}
	workflow.AddWorker(engine, rc.Workers, familyWorker{})
	require.NoError(t, engine.Install(rc))
	client, err := river.NewClient(riverpgxv5.New(f.pool), rc)
	require.NoError(t, err)
	runCtx, cancel := context.WithCancel(ctx)
	require.NoError(t, client.Start(runCtx))
	t.Cleanup(func() {
		stopCtx, stop := context.WithTimeout(context.Background(), 10*time.Second)
		defer stop()
		_ = client.Stop(stopCtx)
		cancel()
	})
	_, err = workflow.Start(ctx, client, "fam", familyArgs{Mode: "parent"}, nil)
	require.NoError(t, err)
	waiting := func(key string) *workflow.Run {
		var run *workflow.Run
		require.Eventually(t, func() bool {
			run, err = workflow.GetRun(ctx, f.pool, key)
			return err == nil && run.Wait != nil
		}, 30*time.Second, 20*time.Millisecond, "run %s never waited", key)
		return run
	}
	waiting("fam")
	waiting("fam/a")
	waiting("fam/b")
	f.setState(t, "fam/a", outbox.StateManual, "the bank does not answer")

	body := f.get(t, "/console/run?key=fam")
	require.Contains(t, body, `<b id="run-wait-missing">2 of 2 operations not at rest; 1 MANUAL</b>`)
	require.Contains(t, body, "needs a person")
	require.Contains(t, body, `id="run-children-count">2: 2 running<`)
	body = f.get(t, "/console/run?key=fam/a")
	require.Contains(t, body, `id="run-parent"><a href="/console/run?key=fam">fam</a> <span class="st st-running">running</span>`)
	require.Contains(t, body, `<b id="run-wait-missing">signal &#34;go&#34; not received</b>`)
	body = f.get(t, "/console/")
	require.Regexp(t, `id="waiting-signal" href="[^"]*">2<`, body)
	require.Regexp(t, `id="waiting-manual" href="[^"]*" class="st st-MANUAL">1<`, body)

	require.NoError(t, workflow.SignalPool(ctx, f.pool, "fam/a", "go", "t-1", nil))
	require.Eventually(t, func() bool {
		return strings.Contains(f.get(t, "/console/run?key=fam"), `id="run-children-count">2: 1 running, 1 succeeded<`)
	}, 30*time.Second, 50*time.Millisecond, "the child's finish never showed on its parent's page")
}
