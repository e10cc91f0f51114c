package workflow_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/internal/testkit"
	"github.com/stepwise-go/stepwise/internal/workflow"
	"github.com/stepwise-go/stepwise/workflowtest"
)

// A worker whose pool has no connection to spare is alive and connected: maintenance must not
// take its run over. Here the step's own transaction holds the worker pool's only connection
// for three leases, as a process's other steps and sends hold a small pool's connections under
// load. On the old code the heartbeat waited for a connection of that pool, the lease lapsed,
// and the run was taken over from its healthy worker (the classic chaos profile's needless
// takeovers: eight settle runs and the payout sends on pgx's default of four connections).
func TestHealthyWorkerOnBusyPoolKeepsItsRun(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const lease = time.Second
	url := testkit.DBURL(t)
	shared := mustPool(t, url) // River's and maintenance's: never short of connections
	pcfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	pcfg.MaxConns = 1
	busy, err := pgxpool.NewWithConfig(ctx, pcfg)
	require.NoError(t, err)
	t.Cleanup(busy.Close)
	createItems(t, shared, "items", true)

	cfg := &workflow.Config{Lease: lease, Logger: quietLogger()}
	engine, err := workflow.New(busy, cfg)
	require.NoError(t, err)
	workers := river.NewWorkers()
	workflow.AddWorker(engine, workers, &countWorker{hook: func(ctx context.Context, s *workflowStep) error {
		if s.Number == 1 {
			_, err := s.Tx.Exec(ctx, `SELECT pg_sleep(3)`) // 3 leases, busy (not idle) in its transaction
			return err
		}
		return nil
	}})
	rc := &river.Config{
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 2}},
		Workers:           workers,
		RetryPolicy:       fastRetry{},
		FetchCooldown:     5 * time.Millisecond,
		FetchPollInterval: 50 * time.Millisecond,
		Logger:            quietLogger(),
	}
	require.NoError(t, engine.Install(rc))
	client, err := river.NewClient(riverpgxv5.New(shared), rc)
	require.NoError(t, err)
	runCtx, cancel := context.WithCancel(ctx)
	require.NoError(t, client.Start(runCtx))
	t.Cleanup(func() {
		stopCtx, stop := context.WithTimeout(context.Background(), 10*time.Second)
		defer stop()
		_ = client.Stop(stopCtx)
		cancel()
	})
	// Maintenance from a process that is not short of connections, every 100ms.
	maint, err := workflow.New(shared, cfg)
	require.NoError(t, err)
	maintainLoop(t, &env{pool: shared, engine: maint, client: client}, 100*time.Millisecond)

	_, err = workflow.Start(ctx, client, "busy", countArgs{Total: 20, Batch: 10, Table: "items"}, nil)
	require.NoError(t, err)
	run := waitRun(t, shared, "busy", 30*time.Second, workflow.RunStatusSucceeded, workflow.RunStatusFailed)
	require.Equal(t, workflow.RunStatusSucceeded, run.Status, "last error: %s", deref(run.LastError))

	takeovers := queryInt(t, shared, `SELECT count(*) FROM stepwise_event WHERE subject = 'busy' AND kind = 'run.takeover'`)
	claims := queryInt(t, shared, `SELECT count(*) FROM stepwise_event WHERE subject = 'busy' AND kind = 'lease.claim'`)
	stepErrors := queryInt(t, shared, `SELECT count(*) FROM stepwise_event WHERE subject = 'busy' AND kind IN ('run.step_error', 'lease.fenced')`)
	require.Zero(t, takeovers, "a live, connected worker was taken over because its pool was busy")
	require.Zero(t, stepErrors, "the step of a live, connected worker was stopped because its pool was busy")
	require.Equal(t, 1, claims, "the run was claimed once, by its only worker")
	perN, _ := itemCounts(t, shared, "items", "busy")
	requireExactlyOnce(t, perN, 20)
}

type workflowStep = workflow.Step[countArgs, countCursor]

// The lease is kept from the claim on, not from the first step: an attempt that is slow
// between its claim and its first step (markRunning waiting for a connection of a busy pool,
// the cursor of a large run decoding on a loaded machine) is alive and connected. Here the
// worker process pauses 2.5 leases right after every claim (a fault point, this goroutine
// only). On the old code the heartbeat started only after markRunning, the lease taken by
// the claim lapsed meanwhile, and maintenance took the run over from its live worker.
func TestSlowStartAfterClaimIsNotTakenOver(t *testing.T) {
	t.Parallel()
	const lease = time.Second
	url, e := processEnv(t, lease, 50*time.Millisecond)
	w := workflowtest.Start(t, "wf-worker", workerEnv(url, lease, lease, "STEPWISE_FAULTS=after-claim:pause=2500ms")...)
	startRun(t, e, "slowstart", countArgs{Total: 40, Batch: 10, Table: "items"})
	run := waitRun(t, e.pool, "slowstart", 30*time.Second, workflow.RunStatusSucceeded, workflow.RunStatusFailed)
	w.Kill()
	takeovers := queryInt(t, e.pool, `SELECT count(*) FROM stepwise_event WHERE subject = 'slowstart' AND kind = 'run.takeover'`)
	t.Logf("run %s: %d takeovers, %d claims", run.Status, takeovers, run.Attempts)
	require.Equal(t, workflow.RunStatusSucceeded, run.Status, "last error: %s", deref(run.LastError))
	require.Zero(t, takeovers, "a live worker was taken over between its claim and its first step")
	require.Equal(t, 1, run.Attempts, "the run was claimed once, by its only worker")
	perN, _ := itemCounts(t, e.pool, "items", "slowstart")
	requireExactlyOnce(t, perN, 40)
}
