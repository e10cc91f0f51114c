package workflow_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/riverqueue/river"
	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/internal/testkit"
	"github.com/stepwise-go/stepwise/internal/workflow"
	"github.com/stepwise-go/stepwise/workflowtest"
)

// Drill 4: a worker's database connection is cut mid-run. It can no longer renew its lease,
// so it stops taking work; another worker takes the run over from the last committed cursor.
func TestDrillConnectionCut(t *testing.T) {
	t.Parallel()
	const lease = time.Second
	url, e := processEnv(t, lease, 250*time.Millisecond)
	proxy, proxiedURL := testkit.NewProxy(t, url)

	cutOff := workflowtest.Start(t, "wf-worker", workerEnv(proxiedURL, lease, lease, "STEP_SLEEP=20ms")...)
	_, err := cutOff.WaitForLine(waitCtx(t, 20*time.Second), "ready")
	require.NoError(t, err)
	startRun(t, e, "cut", countArgs{Total: 2000, Batch: 20, Table: "items"})
	_, err = cutOff.WaitForLine(waitCtx(t, 20*time.Second), "step run=cut n=5 ")
	require.NoError(t, err)

	healthy := workflowtest.Start(t, "wf-worker", workerEnv(url, lease, lease, "STEP_SLEEP=20ms")...)
	_, err = healthy.WaitForLine(waitCtx(t, 20*time.Second), "ready")
	require.NoError(t, err)
	proxy.Cut()
	cutAt := time.Now()
	linesAtCut := len(cutOff.Lines())

	line, err := healthy.WaitForLine(waitCtx(t, 30*time.Second), "step run=cut")
	require.NoError(t, err)
	t.Logf("taken over %s after the cut: %s", time.Since(cutAt).Round(time.Millisecond), line)
	run := waitRun(t, e.pool, "cut", 60*time.Second, workflow.RunStatusSucceeded, workflow.RunStatusFailed)
	require.Equal(t, workflow.RunStatusSucceeded, run.Status)

	perN, _ := itemCounts(t, e.pool, "items", "cut")
	requireExactlyOnce(t, perN, 2000)
	// The cut-off worker started no step after the cut (at most the one in flight).
	var after int
	for _, l := range cutOff.Lines()[linesAtCut:] {
		if stepLine.MatchString(l) {
			after++
		}
	}
	require.LessOrEqual(t, after, 1, "a worker that cannot reach its database must stop taking work")
}

// Drill 6: one hot, always-failing run among healthy ones. It backs off through River's
// attempts and ends dead, visibly; the healthy runs finish beside it.
func TestDrillHotFailingRun(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testkit.DB(t)
	createItems(t, pool, "items", true)
	w := &countWorker{hook: func(ctx context.Context, s *workflow.Step[countArgs, countCursor]) error {
		if s.Args.Table == "items" && s.RunKey == "hot" {
			return fmt.Errorf("upstream file for %s is corrupt", s.RunKey)
		}
		return nil
	}}
	e := newEnv(t, pool, nil, w, map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 2}})
	_, err := workflow.Start(ctx, e.client, "hot", countArgs{Total: 100, Batch: 10, Table: "items"},
		&workflow.StartOpts{InsertOpts: &river.InsertOpts{MaxAttempts: 6}})
	require.NoError(t, err)
	for i := 0; i < 5; i++ {
		_, err := workflow.Start(ctx, e.client, fmt.Sprintf("healthy/%d", i), countArgs{Total: 500, Batch: 10, Table: "items"}, nil)
		require.NoError(t, err)
	}
	for i := 0; i < 5; i++ {
		run := waitRun(t, pool, fmt.Sprintf("healthy/%d", i), 30*time.Second, workflow.RunStatusSucceeded, workflow.RunStatusFailed)
		require.Equal(t, workflow.RunStatusSucceeded, run.Status)
		perN, _ := itemCounts(t, pool, "items", run.Key)
		requireExactlyOnce(t, perN, 500)
	}
	hot := waitRun(t, pool, "hot", 30*time.Second, workflow.RunStatusFailed, workflow.RunStatusSucceeded)
	require.Equal(t, workflow.RunStatusFailed, hot.Status)
	require.Equal(t, 6, hot.Attempts)
	require.Contains(t, *hot.LastError, "6 failures in a row without progress (the job's max attempts): upstream file for hot is corrupt")
	// The run is failed in the last attempt; the worker cancels its job (River would discard it).
	require.Eventually(t, func() bool {
		job, err := e.client.JobGet(ctx, *hot.RiverJobID)
		return err == nil && job.State == "cancelled"
	}, 10*time.Second, 20*time.Millisecond)
	perN, _ := itemCounts(t, pool, "items", "hot")
	require.Empty(t, perN, "every failed step rolled back")
}
