package workflow_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/internal/testkit"
	"github.com/stepwise-go/stepwise/workflow"
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
	waitRun(t, pool, "healthy", 20*time.Second, workflow.StatusSucceeded)

	var run *workflow.Run
	require.Eventually(t, func() bool {
		run, err = workflow.GetRun(ctx, pool, "looping")
		require.NoError(t, err)
		return run.Retry != nil && run.Retry.NextTryAt != nil
	}, 20*time.Second, 20*time.Millisecond, "the run never showed as retrying")
	t.Logf("looping: status %s, retry %+v, next try in %s", run.Status, *run.Retry, time.Until(*run.Retry.NextTryAt).Round(time.Second))
	require.Equal(t, workflow.StatusRunning, run.Status)
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
	run = waitRun(t, pool, "looping", 20*time.Second, workflow.StatusSucceeded)
	require.Nil(t, run.Retry)
	require.Zero(t, run.FailuresInARow)
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
