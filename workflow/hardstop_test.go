package workflow_test

import (
	"context"
	"testing"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/internal/testkit"
	"github.com/stepwise-go/stepwise/workflow"
)

// heldReport holds River, once, between a job's Work returning and River recording the job's
// end: the gap a slow completer (or a WorkEnd hook doing I/O) leaves, in which maintenance
// of another process may pass.
type heldReport struct {
	river.HookDefaults
	kind     string
	returned chan error
	proceed  chan struct{}
}

func (h *heldReport) WorkEnd(ctx context.Context, job *rivertype.JobRow, err error) error {
	if job.Kind != h.kind {
		return err
	}
	select {
	case h.returned <- err:
		<-h.proceed
	default:
	}
	return err
}

// A run whose attempt River's hard stop cut is not taken for a crash by maintenance passing
// before River records the job's end: the attempt gives its lease back as a release on purpose
// (released_at), so the unleased scan leaves the run alone for a lease. Before, the lease went
// back bare, and a pass in that gap took the run over as "its worker vanished" and, on a job of
// one attempt, failed it as a crash loop: every run in flight at a deploy was exposed. (Found
// by an adversarial review of the hard-stop change; its probe is this test.)
func TestHardStopIsNoCrashToMaintenance(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testkit.DB(t)
	createItems(t, pool, "items", true)
	_, err := pool.Exec(ctx, `CREATE SEQUENCE test_slow;
		CREATE FUNCTION test_slow() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF nextval('test_slow') = 2 THEN
				PERFORM pg_sleep(4);
			END IF;
			RETURN NEW;
		END $$;
		CREATE TRIGGER test_slow BEFORE INSERT ON items FOR EACH ROW EXECUTE FUNCTION test_slow();`)
	require.NoError(t, err)
	// No maintenance loop of its own: the test runs the one pass that matters, in the gap.
	engine, err := workflow.New(pool, &workflow.Config{Lease: 2 * time.Second, MaintenanceInterval: time.Hour, Logger: quietLogger()})
	require.NoError(t, err)
	workers := river.NewWorkers()
	workflow.AddWorker(engine, workers, workflow.Stepper[countArgs, countCursor](&countWorker{}))
	hook := &heldReport{kind: (countArgs{}).Kind(), returned: make(chan error, 1), proceed: make(chan struct{})}
	rc := &river.Config{
		Queues: map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 2}}, Workers: workers, RetryPolicy: fastRetry{},
		FetchCooldown: 5 * time.Millisecond, FetchPollInterval: 50 * time.Millisecond, Logger: quietLogger(),
		Hooks: []rivertype.Hook{hook},
	}
	require.NoError(t, engine.Install(rc))
	first, err := river.NewClient(riverpgxv5.New(pool), rc)
	require.NoError(t, err)
	require.NoError(t, first.Start(ctx))
	_, err = workflow.Start(ctx, first, "stopped", countArgs{Total: 5, Batch: 1, Table: "items"},
		&workflow.StartOpts{InsertOpts: &river.InsertOpts{MaxAttempts: 1}})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		return queryInt(t, pool, `SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep' AND datname = current_database()`) == 1
	}, 10*time.Second, 10*time.Millisecond, "step 2 never reached the trigger")
	time.Sleep(2200 * time.Millisecond) // the attempt began more than a lease ago, as in a long slice

	stopped := make(chan error, 1)
	go func() {
		sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		stopped <- first.StopAndCancel(sctx)
	}()
	select {
	case werr := <-hook.returned:
		t.Logf("Work returned %v; River has not recorded it yet", werr)
	case <-time.After(20 * time.Second):
		t.Fatal("the stopped attempt never returned")
	}
	var state string
	var leaseReleased, markedReleased bool
	require.NoError(t, pool.QueryRow(ctx, `SELECT j.state::text, c.lease_until IS NULL, r.released_at IS NOT NULL
		FROM stepwise_run r JOIN river_job j ON j.id = r.river_job_id JOIN stepwise_checkpoint c ON c.key = r.key
		WHERE r.key = 'stopped'`).Scan(&state, &leaseReleased, &markedReleased))
	t.Logf("in the gap: job %s, lease released %v, release recorded %v", state, leaseReleased, markedReleased)
	other, err := river.NewClient(riverpgxv5.New(pool), &river.Config{Workers: workers, Logger: quietLogger()})
	require.NoError(t, err)
	res, err := engine.Maintain(ctx, other)
	require.NoError(t, err)
	t.Logf("maintenance in the gap: taken over %v, failed %v", res.TakenOver, res.Failed)
	close(hook.proceed)
	require.NoError(t, <-stopped)

	run, err := workflow.GetRun(ctx, pool, "stopped")
	require.NoError(t, err)
	t.Logf("run %s, failures %d, last error %v", run.Status, run.Failures, ptrString(run.LastError))
	require.Empty(t, res.Failed, "maintenance failed the run River had just stopped")
	require.NotEqual(t, workflow.RunStatusFailed, run.Status)
	require.Zero(t, run.Failures, "the hard stop was charged to the run as a crash")

	// And the run goes on: a new client finishes it, every item once.
	newPolicyEnv(t, pool, &workflow.Config{Lease: 2 * time.Second, MaintenanceInterval: 100 * time.Millisecond}, &countWorker{}, fastRetry{})
	done := waitRun(t, pool, "stopped", 30*time.Second, workflow.RunStatusSucceeded, workflow.RunStatusFailed)
	require.Equal(t, workflow.RunStatusSucceeded, done.Status, "last error: %v", ptrString(done.LastError))
	perN, _ := itemCounts(t, pool, "items", "stopped")
	requireExactlyOnce(t, perN, 5)
}
