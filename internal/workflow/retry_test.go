package workflow_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/internal/testkit"
	"github.com/stepwise-go/stepwise/internal/workflow"
)

// newPolicyEnv is newEnv with the river.Config's RetryPolicy the test's own (nil: River's
// default, (errors + 1)^4 seconds), as a user's service would configure it.
func newPolicyEnv(t testing.TB, pool *pgxpool.Pool, cfg *workflow.Config, w workflow.Stepper[countArgs, countCursor], policy river.ClientRetryPolicy) *env {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = quietLogger()
	}
	engine, err := workflow.New(pool, cfg)
	require.NoError(t, err)
	workers := river.NewWorkers()
	workflow.AddWorker(engine, workers, w)
	rc := &river.Config{
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 4}},
		Workers:           workers,
		RetryPolicy:       policy,
		FetchCooldown:     5 * time.Millisecond,
		FetchPollInterval: 50 * time.Millisecond,
		Logger:            quietLogger(),
	}
	require.NoError(t, engine.Install(rc))
	client, err := river.NewClient(riverpgxv5.New(pool), rc)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	require.NoError(t, client.Start(ctx))
	t.Cleanup(func() {
		stopCtx, stop := context.WithTimeout(context.Background(), 10*time.Second)
		defer stop()
		_ = client.Stop(stopCtx)
		cancel()
	})
	return &env{pool: pool, engine: engine, client: client, workers: workers}
}

// injectMarkRunningBlips makes the database refuse the next n claims' "run is running"
// writes (markRunning: the only update that adds to stepwise_run.attempts) with a connection
// error, as a failover or a dropped connection would. A sequence counts them: it is not
// rolled back with the failed statement.
func injectMarkRunningBlips(t testing.TB, pool *pgxpool.Pool, n int) {
	t.Helper()
	_, err := pool.Exec(context.Background(), fmt.Sprintf(`
		CREATE SEQUENCE test_blips;
		CREATE FUNCTION test_blip() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF NEW.attempts > OLD.attempts AND nextval('test_blips') <= %d THEN
				RAISE EXCEPTION 'injected: connection lost while marking the run running' USING ERRCODE = '08006';
			END IF;
			RETURN NEW;
		END $$;
		CREATE TRIGGER test_blip BEFORE UPDATE ON stepwise_run FOR EACH ROW EXECUTE FUNCTION test_blip();`, n))
	require.NoError(t, err)
}

// Issue: a last attempt's non-step error failed a run early. The job may be attempted once
// (its first attempt is its last); the database refuses that attempt's markRunning. Before,
// the error reached River, which discarded the job, and maintenance then failed the run
// ("its River job ended discarded") although it had not failed once. Only the run's own
// failure budget may fail it: the attempt snoozes, and the run completes.
func TestLastAttemptNonStepErrorDoesNotFailTheRun(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testkit.DB(t)
	createItems(t, pool, "items", true)
	injectMarkRunningBlips(t, pool, 1)
	e := newPolicyEnv(t, pool, &workflow.Config{Lease: time.Second, MaintenanceInterval: 100 * time.Millisecond}, &countWorker{}, fastRetry{})
	_, err := workflow.Start(ctx, e.client, "blip", countArgs{Total: 5, Batch: 1, Table: "items"},
		&workflow.StartOpts{InsertOpts: &river.InsertOpts{MaxAttempts: 1}})
	require.NoError(t, err)
	run := waitRun(t, pool, "blip", 30*time.Second, workflow.RunStatusSucceeded, workflow.RunStatusFailed)
	blips := queryInt(t, pool, `SELECT last_value FROM test_blips`)
	t.Logf("run %s; markRunning writes the trigger saw: %d (the first refused); failures %d; last error: %v", run.Status, blips, run.Failures, ptrString(run.LastError))
	require.GreaterOrEqual(t, blips, 1, "the blip was never injected")
	require.Equal(t, workflow.RunStatusSucceeded, run.Status, "a database blip on the job's last attempt failed a run that never failed")
	require.Zero(t, run.Failures, "a blip outside the step is not the run's failure")
	perN, _ := itemCounts(t, pool, "items", "blip")
	requireExactlyOnce(t, perN, 5)
}

// hiccupWorker errors once before every odd item: the run commits a step between any two
// errors, so its failures in a row are never more than 1.
func hiccupWorker(errorsSeen *int, mu *sync.Mutex) *countWorker {
	failedAt := map[int]bool{}
	return &countWorker{hook: func(ctx context.Context, s *workflow.Step[countArgs, countCursor]) error {
		mu.Lock()
		defer mu.Unlock()
		if n := s.Cursor.Next; n%2 == 1 && !failedAt[n] {
			failedAt[n] = true
			*errorsSeen++
			return fmt.Errorf("upstream hiccup before item %d", n)
		}
		return nil
	}}
}

// Issue: back-off grew with errors the run had recovered from. Under River's default policy
// a step error waited (errors ever + 1)^4 seconds: 1, 16, 81, 256 s for a run that committed
// steps between its hiccups. The back-off follows failures in a row, as the budget does:
// each of these errors is the first in a row, so each waits about a second.
func TestBackoffFollowsFailuresInARowUnderRiversDefaultPolicy(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testkit.DB(t)
	createItems(t, pool, "items", true)
	var mu sync.Mutex
	errorsSeen := 0
	e := newPolicyEnv(t, pool, &workflow.Config{Lease: time.Second}, hiccupWorker(&errorsSeen, &mu), nil)
	start := time.Now()
	_, err := workflow.Start(ctx, e.client, "hiccups", countArgs{Total: 8, Batch: 1, Table: "items"}, nil)
	require.NoError(t, err)
	deadline := time.Now().Add(30 * time.Second)
	for {
		run, err := workflow.GetRun(ctx, pool, "hiccups")
		require.NoError(t, err)
		if run.Status.Finished() {
			mu.Lock()
			t.Logf("run %s after %d step errors in %s", run.Status, errorsSeen, time.Since(start).Round(100*time.Millisecond))
			mu.Unlock()
			require.Equal(t, workflow.RunStatusSucceeded, run.Status)
			break
		}
		if time.Now().After(deadline) {
			job, err := e.client.JobGet(ctx, *run.RiverJobID)
			require.NoError(t, err)
			mu.Lock()
			defer mu.Unlock()
			t.Fatalf("run still %s after 30s and %d step errors, each after progress; its job is %s, due in %s (failures in a row: %d)",
				run.Status, errorsSeen, job.State, time.Until(job.ScheduledAt).Round(time.Second), run.Failures)
		}
		time.Sleep(50 * time.Millisecond)
	}
	perN, _ := itemCounts(t, pool, "items", "hiccups")
	requireExactlyOnce(t, perN, 8)
}

// recordingPolicy is a user's river.Config.RetryPolicy: it records the error count each job
// row it is asked about shows (len(Errors)+1, what River's own policy counts) and retries
// after 100ms.
type recordingPolicy struct {
	mu   sync.Mutex
	seen []int
}

func (p *recordingPolicy) NextRetry(job *rivertype.JobRow) time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.seen = append(p.seen, len(job.Errors)+1)
	return time.Now().Add(100 * time.Millisecond)
}

func (p *recordingPolicy) counts() []int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]int(nil), p.seen...)
}

// A river.Config.RetryPolicy the user set decides every retry of a step error, the job's last
// attempt included, and is asked about the run's failures in a row, not the job's errors
// ever. Before: River asked it with its own count (1, 2, 3 for errors after progress), and
// on the job's last attempt the worker ignored it for River's default back-off.
func TestUserRetryPolicySeesFailuresInARow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	t.Run("errors after progress", func(t *testing.T) {
		t.Parallel()
		pool := testkit.DB(t)
		createItems(t, pool, "items", true)
		var mu sync.Mutex
		errorsSeen := 0
		policy := &recordingPolicy{}
		e := newPolicyEnv(t, pool, &workflow.Config{Lease: time.Second}, hiccupWorker(&errorsSeen, &mu), policy)
		_, err := workflow.Start(ctx, e.client, "hiccups", countArgs{Total: 10, Batch: 1, Table: "items"},
			&workflow.StartOpts{InsertOpts: &river.InsertOpts{MaxAttempts: 3}})
		require.NoError(t, err)
		run := waitRun(t, pool, "hiccups", 30*time.Second, workflow.RunStatusSucceeded, workflow.RunStatusFailed)
		mu.Lock()
		n := errorsSeen
		mu.Unlock()
		t.Logf("run %s after %d step errors; the policy was asked with counts %v", run.Status, n, policy.counts())
		require.Equal(t, workflow.RunStatusSucceeded, run.Status)
		want := make([]int, n)
		for i := range want {
			want[i] = 1
		}
		require.Equal(t, want, policy.counts(), "each error came after progress: the policy must be asked, every time, about 1 failure in a row")
	})
	t.Run("a step that always errors", func(t *testing.T) {
		t.Parallel()
		pool := testkit.DB(t)
		createItems(t, pool, "items", true)
		policy := &recordingPolicy{}
		w := &countWorker{hook: func(context.Context, *workflow.Step[countArgs, countCursor]) error {
			return errors.New("poison item")
		}}
		e := newPolicyEnv(t, pool, &workflow.Config{Lease: time.Second}, w, policy)
		_, err := workflow.Start(ctx, e.client, "poison", countArgs{Total: 10, Batch: 1, Table: "items"},
			&workflow.StartOpts{InsertOpts: &river.InsertOpts{MaxAttempts: 4}})
		require.NoError(t, err)
		run := waitRun(t, pool, "poison", 30*time.Second, workflow.RunStatusFailed)
		t.Logf("run %s, failures %d; the policy was asked with counts %v", run.Status, run.Failures, policy.counts())
		require.Equal(t, 4, run.Failures)
		require.Equal(t, []int{1, 2, 3}, policy.counts(), "a crash loop backs off by its failures in a row; the 4th fails the run")
	})
}

// gauges gathers the engine's metrics as "name,label=value..." -> value.
func gauges(t testing.TB, engine *workflow.Engine) map[string]float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(engine.Metrics()))
	families, err := reg.Gather()
	require.NoError(t, err)
	got := map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			name := f.GetName()
			for _, l := range m.GetLabel() {
				name += "," + l.GetName() + "=" + l.GetValue()
			}
			if m.Gauge != nil {
				got[name] = m.Gauge.GetValue()
			}
		}
	}
	return got
}

// Issue: a crash-looping run was invisible for weeks: between its tries it said 'running'
// though no worker held it. A run waiting for a retry says so, with its failures in a row,
// its budget, when it is tried next and its last error, in GetRun, in Retrying (the list an
// overview reads) and in the metrics.
func TestRetryingRunIsVisible(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testkit.DB(t)
	createItems(t, pool, "items", true)
	var mu sync.Mutex
	poison := true
	w := &countWorker{hook: func(ctx context.Context, s *workflow.Step[countArgs, countCursor]) error {
		mu.Lock()
		defer mu.Unlock()
		if s.RunKey == "looping" && poison {
			return errors.New("bank said 503")
		}
		return nil
	}}
	e := newPolicyEnv(t, pool, &workflow.Config{Lease: time.Second}, w, hourRetry{})
	_, err := workflow.Start(ctx, e.client, "looping", countArgs{Total: 3, Batch: 1, Table: "items"},
		&workflow.StartOpts{InsertOpts: &river.InsertOpts{MaxAttempts: 25}})
	require.NoError(t, err)
	_, err = workflow.Start(ctx, e.client, "healthy", countArgs{Total: 3, Batch: 1, Table: "items"}, nil)
	require.NoError(t, err)
	waitRun(t, pool, "healthy", 20*time.Second, workflow.RunStatusSucceeded)

	var run *workflow.Run
	require.Eventually(t, func() bool {
		run, err = workflow.GetRun(ctx, pool, "looping")
		require.NoError(t, err)
		return run.Retry != nil && run.Retry.NextTryAt != nil
	}, 20*time.Second, 20*time.Millisecond, "the run never showed as retrying")
	t.Logf("looping: status %s, retry %+v, next try in %s", run.Status, *run.Retry, time.Until(*run.Retry.NextTryAt).Round(time.Second))
	require.Equal(t, workflow.RunStatusRunning, run.Status)
	require.Equal(t, 1, run.FailuresInARow)
	require.Equal(t, 1, run.Retry.FailuresInARow)
	require.Equal(t, 25, run.Retry.MaxFailures)
	require.Contains(t, run.Retry.LastError, "bank said 503")
	require.InDelta(t, time.Hour.Seconds(), time.Until(*run.Retry.NextTryAt).Seconds(), 60, "the next try is the user's policy's hour")

	healthy, err := workflow.GetRun(ctx, pool, "healthy")
	require.NoError(t, err)
	require.Nil(t, healthy.Retry)

	list, total, err := workflow.Retrying(ctx, pool, 10)
	require.NoError(t, err)
	require.Equal(t, 1, total)
	require.Len(t, list, 1)
	require.Equal(t, "looping", list[0].Key)
	require.NotNil(t, list[0].Retry)
	require.Equal(t, 1, list[0].Retry.FailuresInARow)

	got := gauges(t, e.engine)
	require.Equal(t, 1.0, got["stepwise_runs_retrying,workflow=test_count"], "metrics: %v", got)
	require.Equal(t, 1.0, got["stepwise_run_failures_in_a_row_max,workflow=test_count"], "metrics: %v", got)

	// Once the run commits a step again its failures are no longer in a row, and it is not
	// retrying: the operator is told the crash loop ended.
	mu.Lock()
	poison = false
	mu.Unlock()
	_, err = e.client.JobRetry(ctx, *run.RiverJobID)
	require.NoError(t, err)
	run = waitRun(t, pool, "looping", 20*time.Second, workflow.RunStatusSucceeded)
	require.Nil(t, run.Retry)
	require.Zero(t, run.FailuresInARow)
}

// A run whose River job is gone (River's cleaner deleted it, or an operator did) reads as
// before: the derived retry state must not make GetRun fail on the missing job.
func TestGetRunWithoutItsJob(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, testkit.DB(t), nil, nil, map[string]river.QueueConfig{})
	run, err := workflow.Start(ctx, e.client, "jobless", countArgs{Total: 1, Batch: 1, Table: "items"}, nil)
	require.NoError(t, err)
	_, err = e.pool.Exec(ctx, `DELETE FROM river_job WHERE id = $1`, *run.RiverJobID)
	require.NoError(t, err)
	got, err := workflow.GetRun(ctx, e.pool, "jobless")
	require.NoError(t, err)
	require.Equal(t, workflow.RunStatusPending, got.Status)
	require.Nil(t, got.Retry)
	_, err = e.pool.Exec(ctx, `UPDATE stepwise_run SET failures = 2 WHERE key = 'jobless'`)
	require.NoError(t, err)
	got, err = workflow.GetRun(ctx, e.pool, "jobless")
	require.NoError(t, err)
	require.NotNil(t, got.Retry, "failures in a row and nobody holds it: retrying, though its job is gone")
	require.Zero(t, got.Retry.MaxFailures)
	require.Nil(t, got.Retry.NextTryAt)
}

// The same on a hard stop: the worker's client is stopped with StopAndCancel while the job's
// only attempt waits in markRunning (a trigger sleeps there), so the attempt ends with a
// cancelled context. The run is not failed for it: another client finishes it. (A guard: on
// the old code River already took this error for a stop, because pgx wrapped the context's
// error; settle now keeps the job alive whatever the wording.)
func TestLastAttemptHardStopDoesNotFailTheRun(t *testing.T) {
	t.Parallel()
	after := hardStopDrill(t, slowTrigger("NEW.attempts > OLD.attempts AND nextval('test_slow') = 1", 5*time.Second,
		"TRIGGER test_slow BEFORE UPDATE ON stepwise_run"))
	require.Zero(t, after.Steps)
}

// Errors outside the steps that repeat (here the database refuses markRunning three times in
// a row, on the job's only attempt) are not failures of the run, but their back-off still
// grows with them, as the user's policy is asked: a run the database keeps refusing must not
// be retried at a constant pace forever once the job's attempts are spent.
func TestRepeatedNonStepErrorsBackOff(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testkit.DB(t)
	createItems(t, pool, "items", true)
	injectMarkRunningBlips(t, pool, 3)
	policy := &recordingPolicy{}
	e := newPolicyEnv(t, pool, &workflow.Config{Lease: time.Second}, &countWorker{}, policy)
	_, err := workflow.Start(ctx, e.client, "refused", countArgs{Total: 3, Batch: 1, Table: "items"},
		&workflow.StartOpts{InsertOpts: &river.InsertOpts{MaxAttempts: 1}})
	require.NoError(t, err)
	run := waitRun(t, pool, "refused", 30*time.Second, workflow.RunStatusSucceeded, workflow.RunStatusFailed)
	t.Logf("run %s, failures %d; the policy was asked with counts %v", run.Status, run.Failures, policy.counts())
	require.Equal(t, workflow.RunStatusSucceeded, run.Status)
	require.Zero(t, run.Failures)
	require.Equal(t, []int{1, 2, 3}, policy.counts(), "three refusals in a row back off as 1, 2, 3")
}
