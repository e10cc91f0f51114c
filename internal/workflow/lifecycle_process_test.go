package workflow_test

import (
	"context"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/riverqueue/river"
	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/internal/workflow"
	"github.com/stepwise-go/stepwise/workflowtest"
)

// The crash-loop guard counts crashes, not slices. A run of many slices
// (every step its own slice) with River's default 25 attempts is killed with kill -9 three
// times; it must finish with every item exactly once. The old guard counted claims, one per
// slice, and failed the run at its first crash ("vanished on attempt N of 25").
//
// A slice costs about 150ms here (River records a snooze in its completer's 250ms batches),
// so the default is 300 slices, twelve times the attempts; STEPWISE_TEST_SLICES=1000 runs the
// full 1,000 slices a long run is promised to survive.
func TestLongRunSurvivesCrashes(t *testing.T) {
	if testing.Short() {
		// 300 slices and three kill -9 in worker processes: almost a minute under the race
		// detector, for goroutines TestKill9ResumesFromCheckpoint already runs there.
		t.Skip("a long multi-process crash drill")
	}
	t.Parallel()
	const lease = time.Second
	url, e := processEnv(t, lease, 200*time.Millisecond)

	total := 300
	if n, err := strconv.Atoi(os.Getenv("STEPWISE_TEST_SLICES")); err == nil && n > 0 {
		total = n
	}
	_, err := workflow.Start(context.Background(), e.client, "long", countArgs{Total: total, Batch: 1, Table: "items"},
		&workflow.StartOpts{InsertOpts: &river.InsertOpts{Queue: "wf"}}) // MaxAttempts: River's default, 25
	require.NoError(t, err)
	extra := []string{"SLICE_MS=1"} // every step ends its slice: 1,000 claims
	active := workflowtest.Start(t, "wf-worker", workerEnv(url, lease, lease, extra...)...)
	started := time.Now()
	for kill, at := range []int{total / 4, total / 2, total * 3 / 4} {
		// Wait until the run has passed the cursor, then kill whoever works it.
		deadline := time.Now().Add(90 * time.Second)
		for {
			st, err := e.engine.Checkpoints().Get(context.Background(), "long")
			require.NoError(t, err)
			if st.Steps >= int64(at) {
				break
			}
			require.True(t, time.Now().Before(deadline), "run stuck at %d steps before kill %d", st.Steps, kill+1)
			time.Sleep(20 * time.Millisecond)
		}
		active.Kill()
		run, err := workflow.GetRun(context.Background(), e.pool, "long")
		require.NoError(t, err)
		t.Logf("kill %d at %d steps after %s: claims %d, failures %d, status %s", kill+1, at, time.Since(started).Round(time.Millisecond), run.Attempts, run.Failures, run.Status)
		active = workflowtest.Start(t, "wf-worker", workerEnv(url, lease, lease, extra...)...)
	}
	run := waitRun(t, e.pool, "long", 120*time.Second, workflow.RunStatusSucceeded, workflow.RunStatusFailed)
	active.Kill()
	t.Logf("finished %s after %s: claims %d, failures %d", run.Status, time.Since(started).Round(time.Millisecond), run.Attempts, run.Failures)
	require.Equal(t, workflow.RunStatusSucceeded, run.Status, "last error: %s", deref(run.LastError))
	require.Greater(t, run.Attempts, 25, "the run was claimed once per slice, more often than its max attempts")
	perN, _ := itemCounts(t, e.pool, "items", "long")
	requireExactlyOnce(t, perN, total)
	requireStrictlyIncreasing(t, claimTokens(t, e, "long"))
}

// A worker that released its lease on purpose is not taken over while River
// has yet to record the job's new state. Every step here ends its slice, and the worker
// pauses 600ms after each commit before returning the snooze to River (a fault point), with
// steps longer than the lease so the job's attempted_at is stale: exactly what a dead worker
// looks like to the old scan. With maintenance every 50ms, the old code took the run over
// again and again; the run must finish with no takeover at all.
func TestReleasedRunIsNotTakenOver(t *testing.T) {
	t.Parallel()
	const lease = time.Second
	url, e := processEnv(t, lease, 50*time.Millisecond)

	w := workflowtest.Start(t, "wf-worker", workerEnv(url, lease, 10*time.Second, "SLICE_MS=1", "STEP_SLEEP=2200ms",
		"STEPWISE_FAULTS=after-step-commit:pause=600ms")...)
	startRun(t, e, "released", countArgs{Total: 4, Batch: 1, Table: "items"})
	run := waitRun(t, e.pool, "released", 60*time.Second, workflow.RunStatusSucceeded, workflow.RunStatusFailed)
	w.Kill()
	takeovers := queryInt(t, e.pool, `SELECT count(*) FROM stepwise_event WHERE subject = 'released' AND kind = 'run.takeover'`)
	releases := queryInt(t, e.pool, `SELECT count(*) FROM stepwise_event WHERE subject = 'released' AND kind = 'run.release'`)
	t.Logf("run %s: %d releases, %d takeovers, %d claims", run.Status, releases, takeovers, run.Attempts)
	require.Equal(t, workflow.RunStatusSucceeded, run.Status)
	require.Zero(t, takeovers, "a run released on purpose was taken over")
	perN, _ := itemCounts(t, e.pool, "items", "released")
	requireExactlyOnce(t, perN, 4)
}

// A lease given up on purpose is not a crash: Sleep holds. A run that sleeps an hour is not woken by maintenance; and
// when its worker dies right after committing the sleep, before River records the snooze,
// the run is taken over after about two leases past the release, under a job scheduled at the
// run's wake time, not at once.
func TestSleepHoldsAcrossCrashInGap(t *testing.T) {
	t.Parallel()
	const lease = time.Second
	url, e := processEnv(t, lease, 50*time.Millisecond)

	// Worker A sleeps its runs and pauses 3s after each commit; we kill it inside that pause.
	a := workflowtest.Start(t, "wf-worker", workerEnv(url, lease, 10*time.Second, "SLEEP_AT_STEP=1", "SLEEP_FOR=1h", "STEP_SLEEP=1200ms",
		"STEPWISE_FAULTS=after-step-commit:pause=3s")...)
	startRun(t, e, "dozer", countArgs{Total: 10, Batch: 1, Table: "items"})
	_, err := a.WaitForLine(waitCtx(t, 30*time.Second), "sleeping run=dozer")
	require.NoError(t, err)
	// Wait for the sleep's commit, then kill inside the pause that follows it.
	deadline := time.Now().Add(10 * time.Second)
	for {
		run, err := workflow.GetRun(context.Background(), e.pool, "dozer")
		require.NoError(t, err)
		if run.WakeAt != nil {
			break
		}
		require.True(t, time.Now().Before(deadline), "the sleep never committed")
		time.Sleep(10 * time.Millisecond)
	}
	a.Kill()
	killedAt := time.Now()
	// A spare worker that would resume the run at once if it were re-enqueued without its wake time.
	b := workflowtest.Start(t, "wf-worker", workerEnv(url, lease, lease)...)
	defer b.Kill()

	deadline = time.Now().Add(15 * time.Second)
	for queryInt(t, e.pool, `SELECT count(*) FROM stepwise_event WHERE subject = 'dozer' AND kind = 'run.takeover'`) == 0 {
		require.True(t, time.Now().Before(deadline), "a run whose worker died in the gap was never taken over")
		time.Sleep(20 * time.Millisecond)
	}
	took := time.Since(killedAt)
	run, err := workflow.GetRun(context.Background(), e.pool, "dozer")
	require.NoError(t, err)
	var state string
	var scheduledIn time.Duration
	require.NoError(t, e.pool.QueryRow(context.Background(), `SELECT state::text, (extract(epoch FROM scheduled_at - now()) * 1e9)::bigint
		FROM river_job WHERE id = $1`, *run.RiverJobID).Scan(&state, &scheduledIn))
	t.Logf("taken over %s after the kill; new job %d is %s, due in %s (wake_at %s)", took.Round(time.Millisecond), *run.RiverJobID, state,
		scheduledIn.Round(time.Second), run.WakeAt.Format(time.RFC3339))
	require.Equal(t, "scheduled", state)
	require.Greater(t, scheduledIn, 55*time.Minute, "the takeover job must keep the sleep's wake time")
	require.Less(t, took, 3*lease+5*time.Second, "takeover after a crash in the gap must be bounded")

	time.Sleep(2 * time.Second)
	perN, _ := itemCounts(t, e.pool, "items", "dozer")
	require.Len(t, perN, 1, "only the step before the sleep ran: the run still sleeps")
}

// A Sleep holds when the attempt that committed it believes its commit failed. A commit can
// land and still report an error (the connection cut while the answer was on its way, the
// attempt's context cancelled by a heartbeat that found the lease already released by that
// very commit), and an error after the commit looks the same to the attempt. The chaos
// sleepers profile caught it: a run that slept an hour woke 2.3 s later, because the failed-
// looking attempt recorded a step error (clearing the wake time) or snoozed its own job for a
// lease, and the job's next attempt took the run up again. Here the step's commit lands and
// the attempt then fails (a fault point); with River retrying in 50 ms, the old code ran the
// run's next step at once.
func TestSleepHoldsWhenItsCommitLooksFailed(t *testing.T) {
	t.Parallel()
	const lease = time.Second
	url, e := processEnv(t, lease, 50*time.Millisecond)

	w := workflowtest.Start(t, "wf-worker", workerEnv(url, lease, 10*time.Second, "SLEEP_AT_STEP=1", "SLEEP_FOR=1h",
		"STEPWISE_FAULTS=after-step-commit:error@n=1")...)
	defer w.Kill()
	startRun(t, e, "dozer", countArgs{Total: 10, Batch: 1, Table: "items"})
	_, err := w.WaitForLine(waitCtx(t, 30*time.Second), "sleeping run=dozer")
	require.NoError(t, err)
	slept := time.Now()

	// Long enough for River's retries (50 ms), a fenced snooze (one lease) and many
	// maintenance passes.
	time.Sleep(3*lease + time.Second)
	perN, _ := itemCounts(t, e.pool, "items", "dozer")
	run, err := workflow.GetRun(context.Background(), e.pool, "dozer")
	require.NoError(t, err)
	var state string
	var scheduledIn time.Duration
	require.NoError(t, e.pool.QueryRow(context.Background(), `SELECT state::text, (extract(epoch FROM scheduled_at - now()) * 1e9)::bigint
		FROM river_job WHERE id = $1`, *run.RiverJobID).Scan(&state, &scheduledIn))
	t.Logf("%s after the sleep: %d steps' items, run %s, wake_at %v, job %d %s due in %s", time.Since(slept).Round(time.Millisecond),
		len(perN), run.Status, run.WakeAt, *run.RiverJobID, state, scheduledIn.Round(time.Second))
	require.Len(t, perN, 1, "the run woke early: it slept for an hour and ran its next step")
	require.NotNil(t, run.WakeAt, "the run's wake time was lost")
	require.Greater(t, time.Until(*run.WakeAt), 55*time.Minute)
	require.Equal(t, "scheduled", state)
	require.Greater(t, scheduledIn, 55*time.Minute, "the run's job must be due at its wake time")
}

// A COMMIT that landed but answered with an error is found to have landed: the attempt goes
// on as after any commit (its Sleep snoozes the job to the wake time), records no step
// error and no fenced commit. The old code took it for a failed step.
func TestCommitWhoseAnswerIsLostIsFoundLanded(t *testing.T) {
	t.Parallel()
	const lease = time.Second
	url, e := processEnv(t, lease, 50*time.Millisecond)

	w := workflowtest.Start(t, "wf-worker", workerEnv(url, lease, 10*time.Second, "SLEEP_AT_STEP=1", "SLEEP_FOR=1h",
		"STEPWISE_FAULTS=commit-answer-lost:error@n=1")...)
	defer w.Kill()
	startRun(t, e, "dozer", countArgs{Total: 10, Batch: 1, Table: "items"})
	_, err := w.WaitForLine(waitCtx(t, 30*time.Second), "COMMIT reported an error but the step landed")
	require.NoError(t, err)
	var run *workflow.Run
	deadline := time.Now().Add(10 * time.Second)
	for {
		run, err = workflow.GetRun(context.Background(), e.pool, "dozer")
		require.NoError(t, err)
		var state string
		require.NoError(t, e.pool.QueryRow(context.Background(), `SELECT state::text FROM river_job WHERE id = $1`, *run.RiverJobID).Scan(&state))
		if state == "scheduled" {
			break
		}
		require.True(t, time.Now().Before(deadline), "the sleeping run's job was never snoozed (state %s)", state)
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(lease)
	perN, _ := itemCounts(t, e.pool, "items", "dozer")
	stepErrors := queryInt(t, e.pool, `SELECT count(*) FROM stepwise_event WHERE subject = 'dozer' AND kind IN ('run.step_error', 'lease.fenced')`)
	t.Logf("run %s, failures %d, %d steps' items, %d step errors or fenced commits, wake in %s", run.Status, run.Failures, len(perN), stepErrors,
		time.Until(*run.WakeAt).Round(time.Second))
	require.Len(t, perN, 1)
	require.Zero(t, stepErrors, "a step that committed was recorded as failed")
	require.Zero(t, run.Failures)
	require.Greater(t, time.Until(*run.WakeAt), 55*time.Minute)
}

// The same for a step that continues, whose fenced write and COMMIT travel together
// (checkpoint.AdvanceCommit): the COMMIT lands, its answer is lost before the lease counted
// the step, and the attempt finds it landed and goes on from it, with no step error, no
// item twice and none lost.
func TestPipelinedCommitWhoseAnswerIsLostIsFoundLanded(t *testing.T) {
	t.Parallel()
	const lease = time.Second
	url, e := processEnv(t, lease, 50*time.Millisecond)

	w := workflowtest.Start(t, "wf-worker", workerEnv(url, lease, 10*time.Second,
		"STEPWISE_FAULTS=commit-answer-lost:error@n=2")...)
	defer w.Kill()
	startRun(t, e, "lost-answer", countArgs{Total: 10, Batch: 1, Table: "items"})
	_, err := w.WaitForLine(waitCtx(t, 30*time.Second), "COMMIT reported an error but the step landed")
	require.NoError(t, err)
	run := waitRun(t, e.pool, "lost-answer", 30*time.Second, workflow.RunStatusSucceeded, workflow.RunStatusFailed)
	require.Equal(t, workflow.RunStatusSucceeded, run.Status)
	perN, _ := itemCounts(t, e.pool, "items", "lost-answer")
	requireExactlyOnce(t, perN, 10)
	stepErrors := queryInt(t, e.pool, `SELECT count(*) FROM stepwise_event WHERE subject = 'lost-answer' AND kind IN ('run.step_error', 'lease.fenced')`)
	require.Zero(t, stepErrors, "a step that committed was recorded as failed")
	require.Zero(t, run.Failures)
}
