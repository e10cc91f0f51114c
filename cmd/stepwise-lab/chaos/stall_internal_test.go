package chaos

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/internal/testkit"
	"github.com/stepwise-go/stepwise/workflowtest"
)

// linesWorker is a worker process as far as addStalls sees it: a pid and its output.
type linesWorker struct {
	pid   int
	lines []string
}

func (w *linesWorker) Pid() int        { return w.pid }
func (w *linesWorker) Lines() []string { return w.lines }
func (w *linesWorker) Exited() bool    { return false }
func (w *linesWorker) Stop() error     { return nil }
func (w *linesWorker) Cont() error     { return nil }
func (w *linesWorker) Kill()           {}

// A takeover of a run whose worker reported itself not scheduled for long enough to lose its
// lease (a loaded machine) is explained by that stall; one after a shorter stall, or after a
// stall outside the window, is still needless: the stalls excuse no broken renewal.
func TestReportedStallsExplainOnlyTheTakeoversTheyCanCause(t *testing.T) {
	ctx := context.Background()
	pool := testkit.DB(t)
	const lease = 2 * time.Second
	base := time.Now().UTC().Add(-time.Hour).Truncate(time.Second)
	at := func(s float64) time.Time { return base.Add(time.Duration(s * float64(time.Second))) }
	stall := func(s float64, d time.Duration) string {
		return fmt.Sprintf("stalled %s %s", at(s).UTC().Format(time.RFC3339Nano), d)
	}
	w := &linesWorker{pid: 4242, lines: []string{
		"ready",
		stall(10, 1500*time.Millisecond), // longer than Lease less a heartbeat: can lapse a lease
		stall(30, 800*time.Millisecond),  // too short to lapse a lease renewed every Lease/3
		"stalled nonsense",
	}}
	report := &workflowtest.ChaosReport{Workers: []workflowtest.WorkerLife{{ID: "chaos-w4242", Pid: 4242, Started: at(0)}}}
	var started sync.Map
	started.Store(w.pid, workflowtest.Worker(w))
	addStalls(report, &started, lease-lease/3)
	require.Equal(t, []workflowtest.Interval{{From: at(10), To: at(11.5)}}, report.Workers[0].Paused)

	event := func(key, kind, actor string, s float64) {
		_, err := pool.Exec(ctx, `INSERT INTO stepwise_event (subject, kind, actor, detail, at) VALUES ($1, $2, $3, '{}', $4)`,
			key, kind, actor, at(s))
		require.NoError(t, err)
	}
	for _, key := range []string{"stalled", "short-stall", "stall-long-before"} {
		_, err := pool.Exec(ctx, `INSERT INTO stepwise_checkpoint (key) VALUES ($1)`, key)
		require.NoError(t, err)
		_, err = pool.Exec(ctx, `INSERT INTO stepwise_run (key, workflow, input, status) VALUES ($1, 'w', '{}', 'running')`, key)
		require.NoError(t, err)
	}
	event("stalled", "lease.claim", "chaos-w4242/job-1/attempt-1", 9)
	event("stalled", "run.takeover", "maintenance", 13)
	event("short-stall", "lease.claim", "chaos-w4242/job-2/attempt-1", 29)
	event("short-stall", "run.takeover", "maintenance", 33)
	event("stall-long-before", "lease.claim", "chaos-w4242/job-3/attempt-1", 20)
	event("stall-long-before", "run.takeover", "maintenance", 22)

	live := report.Liveness(2*lease+3*time.Second, 0)
	count, vs, err := workflowtest.CountTakeovers(ctx, pool, live)
	require.NoError(t, err)
	t.Log(workflowtest.FormatViolations(vs))
	require.Equal(t, workflowtest.TakeoverCount{Takeovers: 3, Needless: 2}, count)
	require.Len(t, vs, 2)
	require.Contains(t, vs[0].Evidence, "run short-stall taken over")
	require.Contains(t, vs[0].Evidence, "the holder claimed at")
	require.Contains(t, vs[0].Evidence, "its lease lapsed")
	require.Contains(t, vs[1].Evidence, "run stall-long-before taken over")
}
