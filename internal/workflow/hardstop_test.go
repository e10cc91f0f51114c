package workflow_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/internal/testkit"
	"github.com/stepwise-go/stepwise/internal/workflow"
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

// A hard stop (StopAndCancel, a deploy's last resort) charges the run no failure, wherever it
// lands: while a step's COMMIT is in flight (the commit is not cancelled with the step and
// lands; the attempt must end before the next step begins, not begin it on a cancelled
// context), or inside a step (which rolls back). On a job with one attempt either used to fail
// the run ("failed after 1 failures in a row ... context canceled"). A trigger holds step 2,
// in its COMMIT (deferred) or in its INSERT, for 3 s; the stop comes during it.
func TestHardStopChargesNoFailure(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		trigger   string
		wantSteps int64
	}{
		{"during the commit", "CONSTRAINT TRIGGER test_slow AFTER INSERT ON items DEFERRABLE INITIALLY DEFERRED", 2},
		{"inside the step", "TRIGGER test_slow BEFORE INSERT ON items", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			after := hardStopDrill(t, slowTrigger("nextval('test_slow') = 2", 3*time.Second, tc.trigger))
			require.Equal(t, tc.wantSteps, after.Steps)
			require.Zero(t, after.Failures, "the hard stop was charged as a failure: %v", ptrString(after.LastError))
		})
	}
}

// A run whose attempt River's hard stop cut is not taken for a crash by maintenance passing
// before River records the job's end: the attempt gives its lease back as a release on purpose
// (released_at), so the unleased scan leaves the run alone for two leases. Before, the lease went
// back bare, and a pass in that gap took the run over as "its worker vanished" and, on a job of
// one attempt, failed it as a crash loop: every run in flight at a deploy was exposed. (Found
// by an adversarial review of the hard-stop change; its probe is this test.)
func TestHardStopIsNoCrashToMaintenance(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	hook := &heldReport{kind: (countArgs{}).Kind(), returned: make(chan error, 1), proceed: make(chan struct{})}
	// No maintenance loop of its own: the test runs the one pass that matters, in the gap.
	s := startStoppable(t, slowTrigger("nextval('test_slow') = 2", 8*time.Second, "TRIGGER test_slow BEFORE INSERT ON items"),
		time.Hour, hook)
	// The attempt began more than two leases ago (4 s at 2 s), as in a long slice: its job's
	// attempted_at alone no longer keeps the unleased scan off (unleasedGrace), only the
	// recorded release does.
	time.Sleep(4200 * time.Millisecond)

	stopped := make(chan error, 1)
	go func() {
		sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		stopped <- s.client.StopAndCancel(sctx)
	}()
	select {
	case werr := <-hook.returned:
		t.Logf("Work returned %v; River has not recorded it yet", werr)
	case <-time.After(20 * time.Second):
		t.Fatal("the stopped attempt never returned")
	}
	var state string
	var leaseReleased, markedReleased bool
	require.NoError(t, s.pool.QueryRow(ctx, `SELECT j.state::text, c.lease_until IS NULL, r.released_at IS NOT NULL
		FROM stepwise_run r JOIN river_job j ON j.id = r.river_job_id JOIN stepwise_checkpoint c ON c.key = r.key
		WHERE r.key = 'stopped'`).Scan(&state, &leaseReleased, &markedReleased))
	t.Logf("in the gap: job %s, lease released %v, release recorded %v", state, leaseReleased, markedReleased)
	other, err := river.NewClient(riverpgxv5.New(s.pool), &river.Config{Workers: s.workers, Logger: quietLogger()})
	require.NoError(t, err)
	res, err := s.engine.Maintain(ctx, other)
	require.NoError(t, err)
	t.Logf("maintenance in the gap: taken over %v, failed %v", res.TakenOver, res.Failed)
	close(hook.proceed)
	require.NoError(t, <-stopped)

	run, err := workflow.GetRun(ctx, s.pool, "stopped")
	require.NoError(t, err)
	t.Logf("run %s, failures %d, last error %v", run.Status, run.Failures, ptrString(run.LastError))
	require.Empty(t, res.Failed, "maintenance failed the run River had just stopped")
	require.NotEqual(t, workflow.RunStatusFailed, run.Status)
	require.Zero(t, run.Failures, "the hard stop was charged to the run as a crash")
	requireStoppedRunGoesOn(t, s.pool)
}

// slowTrigger is the DDL of a trigger test_slow (trigger: what it is and where it fires, as in
// CREATE <trigger> FOR EACH ROW) that sleeps for sleep when when holds; when may count hits
// with nextval('test_slow').
func slowTrigger(when string, sleep time.Duration, trigger string) string {
	return fmt.Sprintf(`
		CREATE FUNCTION test_slow() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF %s THEN
				PERFORM pg_sleep(%g);
			END IF;
			RETURN NEW;
		END $$;
		CREATE %s FOR EACH ROW EXECUTE FUNCTION test_slow();`, when, sleep.Seconds(), trigger)
}

// stoppable is a 5-step run "stopped" (one item a step, the job's only attempt) being worked
// by client, held by a slow trigger.
type stoppable struct {
	pool    *pgxpool.Pool
	engine  *workflow.Engine
	workers *river.Workers
	client  *river.Client[pgx.Tx]
}

// startStoppable creates the items table, sequence test_slow and the trigger of slowDDL, starts
// an engine (maintenance every maintEvery) and a River client with hooks, starts the run, and
// returns once the trigger sleeps in the database.
func startStoppable(t *testing.T, slowDDL string, maintEvery time.Duration, hooks ...rivertype.Hook) *stoppable {
	ctx := context.Background()
	pool := testkit.DB(t)
	createItems(t, pool, "items", true)
	_, err := pool.Exec(ctx, `CREATE SEQUENCE test_slow;`+slowDDL)
	require.NoError(t, err)
	engine, err := workflow.New(pool, &workflow.Config{Lease: 2 * time.Second, MaintenanceInterval: maintEvery, Logger: quietLogger()})
	require.NoError(t, err)
	workers := river.NewWorkers()
	workflow.AddWorker(engine, workers, workflow.Stepper[countArgs, countCursor](&countWorker{}))
	rc := &river.Config{
		Queues: map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 2}}, Workers: workers, RetryPolicy: fastRetry{},
		FetchCooldown: 5 * time.Millisecond, FetchPollInterval: 50 * time.Millisecond, Logger: quietLogger(), Hooks: hooks,
	}
	require.NoError(t, engine.Install(rc))
	client, err := river.NewClient(riverpgxv5.New(pool), rc)
	require.NoError(t, err)
	require.NoError(t, client.Start(ctx))
	_, err = workflow.Start(ctx, client, "stopped", countArgs{Total: 5, Batch: 1, Table: "items"},
		&workflow.StartOpts{InsertOpts: &river.InsertOpts{MaxAttempts: 1}})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		return queryInt(t, pool, `SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep' AND datname = current_database()`) == 1
	}, 10*time.Second, 10*time.Millisecond, "the attempt never reached the trigger")
	return &stoppable{pool: pool, engine: engine, workers: workers, client: client}
}

// hardStopDrill starts a stoppable run, stops its client with StopAndCancel while the trigger
// sleeps, requires that the run goes on, and returns the run as the stop left it.
func hardStopDrill(t *testing.T, slowDDL string) *workflow.Run {
	ctx := context.Background()
	s := startStoppable(t, slowDDL, 100*time.Millisecond)
	stopCtx, stop := context.WithTimeout(ctx, 10*time.Second)
	defer stop()
	require.NoError(t, s.client.StopAndCancel(stopCtx))
	after, err := workflow.GetRun(ctx, s.pool, "stopped")
	require.NoError(t, err)
	var state string
	require.NoError(t, s.pool.QueryRow(ctx, `SELECT state::text FROM river_job WHERE id = $1`, *after.RiverJobID).Scan(&state))
	t.Logf("after the hard stop: run %s, %d steps, failures %d, last error %v; its job %s",
		after.Status, after.Steps, after.Failures, ptrString(after.LastError), state)
	requireStoppedRunGoesOn(t, s.pool)
	return after
}

// requireStoppedRunGoesOn: a new client finishes the run "stopped", every item written once,
// the run not failed for the stop.
func requireStoppedRunGoesOn(t *testing.T, pool *pgxpool.Pool) {
	newPolicyEnv(t, pool, &workflow.Config{Lease: 2 * time.Second, MaintenanceInterval: 100 * time.Millisecond}, &countWorker{}, fastRetry{})
	run := waitRun(t, pool, "stopped", 30*time.Second, workflow.RunStatusSucceeded, workflow.RunStatusFailed)
	t.Logf("run %s; failures %d; last error: %v", run.Status, run.Failures, ptrString(run.LastError))
	require.Equal(t, workflow.RunStatusSucceeded, run.Status, "a hard stop failed the run")
	perN, _ := itemCounts(t, pool, "items", "stopped")
	requireExactlyOnce(t, perN, 5)
}
