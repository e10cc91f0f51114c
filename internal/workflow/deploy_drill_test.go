package workflow_test

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/internal/testkit"
	"github.com/stepwise-go/stepwise/internal/workflow"
	"github.com/stepwise-go/stepwise/stepwisetype"
	"github.com/stepwise-go/stepwise/workflowtest"
)

// Drill: a rolling deploy, mid-settle, to a release whose cursor changed shape. Three worker
// processes of the old release (cursor version 1, {"next"}) work six runs; they are replaced
// one by one, each by a process of the new release (cursor version 2, {"done", "steps"},
// CURSOR_V2=1) started first, then the old one stopped with SIGTERM, as a deploy would. Every
// slice is short, so runs move between old and new processes all through the deploy: new
// workers upgrade version 1 cursors, old workers meet version 2 cursors and must release them
// untouched. Every invariant holds (every item written exactly once into a table with no
// unique key, tokens increasing), no run fails, no step error or River error is recorded, and
// the time runs spent waiting for a worker that reads their cursor is measured.
func TestRollingDeployChangesCursorShape(t *testing.T) {
	t.Parallel()
	// The drill is about deploys, not leases: nothing in it is killed, every hand-over is a
	// release (a slice's end, a drained SIGTERM, a cursor too new), so the lease's length
	// costs it nothing, and it is long enough that a loaded machine does not lose one. With
	// 2 s, beside a CPU hog and another test package (load 10), two renewals timed out, the
	// runs' steps were interrupted and recorded as step errors: the load's doing, not the
	// deploy's, and the assertion below (no step error at all) failed for time.
	const lease = 5 * time.Second
	url := testkit.DBURL(t)
	e := newEnv(t, mustPool(t, url), &workflow.Config{Lease: lease}, nil, map[string]river.QueueConfig{})
	createItems(t, e.pool, "deploy_items", false)
	maintainLoop(t, e, 200*time.Millisecond)
	ctx := context.Background()

	const runs, total, batch = 6, 1200, 10
	env := workerEnv(url, lease, lease, "STEP_SLEEP=25ms", "SLICE_MS=150", "LOG_INFO=1")
	start := func(extra ...string) *workflowtest.Process {
		p := workflowtest.Start(t, "wf-worker", append(append([]string(nil), env...), extra...)...)
		_, err := p.WaitForLine(waitCtx(t, 30*time.Second), "ready")
		require.NoError(t, err)
		return p
	}
	old := []*workflowtest.Process{start(), start(), start()}
	began := time.Now()
	keys := make([]string, runs)
	for i := range keys {
		keys[i] = fmt.Sprintf("deploy/%d", i)
		_, err := workflow.Start(ctx, e.client, keys[i], countArgs{Total: total, Batch: batch, Table: "deploy_items"},
			&workflow.StartOpts{InsertOpts: &river.InsertOpts{Queue: "wf"}}) // River's default 25 attempts
		require.NoError(t, err)
	}
	// Mid-settle: every run has committed a few steps under the old release.
	require.Eventually(t, func() bool {
		return queryInt(t, e.pool, `SELECT count(*) FROM stepwise_checkpoint WHERE key LIKE 'deploy/%' AND steps >= 3`) == runs
	}, 60*time.Second, 20*time.Millisecond, "the runs never started")

	var fresh []*workflowtest.Process
	deployStart := time.Now()
	for i, p := range old {
		fresh = append(fresh, start("CURSOR_V2=1"))
		require.NoError(t, p.Signal(syscall.SIGTERM))
		stopped := make(chan error, 1)
		go func() { stopped <- p.Wait() }()
		select {
		case err := <-stopped:
			require.NoError(t, err, "old worker %d did not stop cleanly", i)
		case <-time.After(20 * time.Second):
			t.Fatalf("old worker %d still running 20s after SIGTERM", i)
		}
		open := queryInt(t, e.pool, `SELECT count(*) FROM stepwise_run WHERE key LIKE 'deploy/%' AND status IN ('pending', 'running')`)
		t.Logf("replaced old worker %d (pid %d) at %s: %d runs unfinished", i, p.Pid(), time.Since(deployStart).Round(time.Millisecond), open)
		// Old and new side by side for a while before the next replacement.
		time.Sleep(700 * time.Millisecond)
	}
	deployTook := time.Since(deployStart)

	for _, k := range keys {
		run := waitRun(t, e.pool, k, 90*time.Second, workflow.RunStatusSucceeded, workflow.RunStatusFailed, workflow.RunStatusCancelled)
		require.Equal(t, workflow.RunStatusSucceeded, run.Status, "run %s: %s", k, deref(run.LastError))
		require.Nil(t, run.Awaiting, "run %s finished", k)
	}
	settled := time.Since(began)

	items := func(ctx context.Context, q stepwisetype.DBTX) ([]workflowtest.Violation, error) {
		rows, err := q.Query(ctx, `
			SELECT format('run %s item %s written %s times (tokens %s, pids %s)', k.run_key, k.n, count(d.n),
			              string_agg(d.token::text, ','), string_agg(d.pid::text, ','))
			  FROM (SELECT r.key AS run_key, g AS n FROM stepwise_run r, generate_series(0, $1 - 1) g) k
			  LEFT JOIN deploy_items d ON d.run_key = k.run_key AND d.n = k.n
			 GROUP BY k.run_key, k.n HAVING count(d.n) <> 1
			 ORDER BY k.run_key, k.n`, total)
		if err != nil {
			return nil, err
		}
		evidence, err := pgx.CollectRows(rows, pgx.RowTo[string])
		var vs []workflowtest.Violation
		for _, e := range evidence {
			vs = append(vs, workflowtest.Violation{Invariant: 2, Name: "every item written exactly once across the deploy", Evidence: e})
		}
		return vs, err
	}
	violations, err := workflowtest.CheckInvariants(ctx, e.pool, &workflowtest.CheckOpts{Quiet: true, Domain: []workflowtest.CheckFunc{items}})
	require.NoError(t, err)
	require.Empty(t, violations, "first violation: %s\n%s", first(violations), workflowtest.FormatViolations(violations))

	// Nothing about the deploy is a failure: no step error, no River error, and the only
	// failures counted are takeovers (a lease lost to the machine's load, not to the deploy).
	texts := func(sql string) []string {
		rows, err := e.pool.Query(ctx, sql)
		require.NoError(t, err)
		out, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return out
	}
	require.Empty(t, texts(`SELECT format('run %s: %s', subject, detail->>'error') FROM stepwise_event WHERE kind = 'run.step_error'`), "step errors")
	require.Empty(t, texts(`SELECT format('job %s: %s', id, e->>'error') FROM river_job, unnest(errors) e WHERE kind = 'test_count'`), "River recorded errors")
	takeovers := queryInt(t, e.pool, `SELECT count(*) FROM stepwise_event WHERE kind = 'run.takeover'`)
	require.Zero(t, queryInt(t, e.pool, `SELECT count(*) FROM stepwise_run r WHERE failures > 0
		AND NOT EXISTS (SELECT 1 FROM stepwise_event v WHERE v.subject = r.key AND v.kind = 'run.takeover')`),
		"a run's failure budget was spent without a takeover")
	require.Equal(t, runs, queryInt(t, e.pool, `SELECT count(*) FROM stepwise_checkpoint WHERE key LIKE 'deploy/%' AND cursor_version = 2 AND cursor ? 'done'`),
		"every run finished under the new release, its cursor in version 2")

	waits, releases := cursorWaits(t, e)
	var upgrades int
	for _, p := range fresh {
		for _, l := range p.Lines() {
			if strings.Contains(l, "cursor upgraded") {
				upgrades++
			}
		}
	}
	var oldLogged int
	for _, p := range old {
		for _, l := range p.Lines() {
			if strings.Contains(l, "released untouched for a worker that reads it") && strings.Contains(l, "cursor_version=2 reads_cursor_version=1") {
				oldLogged++
			}
		}
	}
	require.Greater(t, upgrades, 0, "no new worker upgraded a version 1 cursor: the drill did not deploy mid-settle")
	require.Greater(t, releases, 0, "no old worker met a version 2 cursor: the drill did not run old and new side by side")
	require.Equal(t, releases, oldLogged, "every release for a newer worker is logged by the old worker, with the versions")

	var sum time.Duration
	for _, w := range waits {
		sum += w
	}
	sorted := append([]time.Duration(nil), waits...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i] < sorted[j] })
	median, worst := time.Duration(0), time.Duration(0)
	if len(sorted) > 0 {
		median, worst = sorted[len(sorted)/2], sorted[len(sorted)-1]
	}
	t.Logf("rolling deploy of %d workers in %s, mid-settle of %d runs x %d items (settled in %s): %d cursors upgraded by new workers; "+
		"%d releases by old workers in %d waits for a new worker: total %s, median %s, max %s; takeovers %d, failed runs 0, violations 0",
		len(old), deployTook.Round(time.Millisecond), runs, total, settled.Round(time.Millisecond), upgrades,
		releases, len(waits), sum.Round(time.Millisecond), median.Round(time.Millisecond), worst.Round(time.Millisecond), takeovers)
}

// cursorWaits measures, from the audit trail, each wait of a run for a worker that reads its
// cursor: from an old worker's release of it (run.release, reason cursor_version) to the next
// claim that was not followed by such a release (a worker that read it). It returns the
// waits and the number of such releases.
func cursorWaits(t *testing.T, e *env) (waits []time.Duration, releases int) {
	t.Helper()
	rows, err := e.pool.Query(context.Background(), `
		SELECT subject, kind, token, at,
		       EXISTS (SELECT 1 FROM stepwise_event r WHERE r.subject = v.subject AND r.kind = 'run.release'
		                 AND r.token = v.token AND r.detail->>'reason' = 'cursor_version')
		  FROM stepwise_event v
		 WHERE kind = 'lease.claim' OR (kind = 'run.release' AND detail->>'reason' = 'cursor_version')
		 ORDER BY subject, id`)
	require.NoError(t, err)
	defer rows.Close()
	waitingSince := map[string]time.Time{}
	for rows.Next() {
		var (
			subject, kind  string
			token          int64
			at             time.Time
			releasedForNew bool
		)
		require.NoError(t, rows.Scan(&subject, &kind, &token, &at, &releasedForNew))
		switch {
		case kind == "run.release":
			releases++
			if _, ok := waitingSince[subject]; !ok {
				waitingSince[subject] = at
			}
		case !releasedForNew:
			if since, ok := waitingSince[subject]; ok {
				waits = append(waits, at.Sub(since))
				delete(waitingSince, subject)
			}
		}
	}
	require.NoError(t, rows.Err())
	require.Empty(t, waitingSince, "a run still waits for a worker that reads its cursor")
	return waits, releases
}
