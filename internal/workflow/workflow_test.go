package workflow_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/internal/testkit"
	"github.com/stepwise-go/stepwise/internal/workflow"
)

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	_, err := workflow.New(nil, nil)
	require.ErrorContains(t, err, "pool is nil")
	pool := testkit.DB(t)
	for _, tc := range []struct {
		cfg  workflow.Config
		want string
	}{
		{workflow.Config{Lease: -time.Second}, "Config.Lease"},
		{workflow.Config{Lease: time.Second, Heartbeat: time.Second}, "Config.Heartbeat"},
		{workflow.Config{Lease: time.Second, Heartbeat: 2 * time.Second}, "Config.Heartbeat"},
		{workflow.Config{StallTimeout: -1}, "Config.StallTimeout"},
	} {
		_, err := workflow.New(pool, &tc.cfg)
		require.ErrorContains(t, err, tc.want)
	}
	e, err := workflow.New(pool, nil)
	require.NoError(t, err)
	require.Equal(t, workflow.LeaseDefault, e.Config().Lease)
	require.Equal(t, 30*time.Second, e.Config().Lease)
	require.Equal(t, 10*time.Second, e.Config().Heartbeat)
	require.Equal(t, workflow.SliceDefault, e.Config().Slice)
}

// Install checks Slice against the River config's own RescueStuckJobsAfter (River's default
// when zero) instead of asking the user to keep a copy of it in workflow.Config; workers
// added after Install are checked by AddWorker.
func TestInstallChecksSliceAgainstRiversRescue(t *testing.T) {
	t.Parallel()
	pool := testkit.DB(t)

	long, err := workflow.New(pool, &workflow.Config{Slice: time.Hour})
	require.NoError(t, err, "New cannot know the River config yet")
	err = long.Install(&river.Config{})
	require.ErrorContains(t, err, "workflow.Config.Slice (1h0m0s) must be shorter than the river.Config's RescueStuckJobsAfter (1h0m0s)")
	require.ErrorContains(t, err, "set river.Config.RescueStuckJobsAfter above 1h0m0s")
	require.NoError(t, long.Install(&river.Config{RescueStuckJobsAfter: 2 * time.Hour}))
	require.NoError(t, long.Install(&river.Config{JobTimeout: time.Minute}), "River's default is JobTimeout plus an hour then")

	e, err := workflow.New(pool, &workflow.Config{Slice: 2 * time.Minute})
	require.NoError(t, err)
	err = e.Install(&river.Config{RescueStuckJobsAfter: time.Minute})
	require.ErrorContains(t, err, "Slice (2m0s) must be shorter than the river.Config's RescueStuckJobsAfter (1m0s)")

	// A step worker's own slice, added before Install, is checked by Install...
	e, err = workflow.New(pool, nil)
	require.NoError(t, err)
	require.NoError(t, workflow.AddWorkerSafely(e, river.NewWorkers(), &sliceWorker{slice: 10 * time.Minute}))
	err = e.Install(&river.Config{RescueStuckJobsAfter: 5 * time.Minute})
	require.ErrorContains(t, err, "StepOptions.Slice of "+countArgs{}.Kind()+" (10m0s)")
	// ...and one added after Install by AddWorker.
	e, err = workflow.New(pool, nil)
	require.NoError(t, err)
	require.NoError(t, e.Install(&river.Config{RescueStuckJobsAfter: 5 * time.Minute}))
	err = workflow.AddWorkerSafely(e, river.NewWorkers(), &sliceWorker{slice: 10 * time.Minute})
	require.ErrorContains(t, err, "must be shorter than the river.Config's RescueStuckJobsAfter (5m0s)")
}

// sliceWorker is a step worker with its own slice.
type sliceWorker struct {
	workflow.StepperDefaults[countArgs, countCursor]
	slice time.Duration
}

func (w *sliceWorker) StepOptions() *workflow.StepOpts {
	return &workflow.StepOpts{Slice: w.slice}
}

func (w *sliceWorker) Step(context.Context, *workflow.Step[countArgs, countCursor]) (workflow.Next, error) {
	return workflow.Done(), nil
}

func TestRunsToDone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testkit.DB(t)
	createItems(t, pool, "items", true)
	e := newEnv(t, pool, nil, &countWorker{}, nil)

	run, err := workflow.Start(ctx, e.client, "count/1", countArgs{Total: 1000, Batch: 100, Table: "items"}, nil)
	require.NoError(t, err)
	require.True(t, run.Created)
	require.Equal(t, workflow.RunStatusPending, run.Status)

	run = waitRun(t, pool, "count/1", 10*time.Second, workflow.RunStatusSucceeded, workflow.RunStatusFailed)
	require.Equal(t, workflow.RunStatusSucceeded, run.Status)
	require.NotNil(t, run.FinishedAt)
	perN, _ := itemCounts(t, pool, "items", "count/1")
	requireExactlyOnce(t, perN, 1000)

	st, err := e.engine.Checkpoints().Get(ctx, "count/1")
	require.NoError(t, err)
	require.JSONEq(t, `{"next":1000}`, string(st.Cursor))
	require.Equal(t, int64(10), st.Steps, "ten batches of 100, the last one returning Done")
	require.Nil(t, st.Owner, "a finished run holds no lease")

	job, err := e.client.JobGet(ctx, *run.RiverJobID)
	require.NoError(t, err)
	require.Equal(t, "completed", string(job.State))
}

func TestStartTwiceIsOneRun(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testkit.DB(t)
	e := newEnv(t, pool, nil, &countWorker{}, map[string]river.QueueConfig{}) // insert-only client
	args := countArgs{Total: 10, Batch: 5, Table: "items"}

	first, err := workflow.Start(ctx, e.client, "once", args, nil)
	require.NoError(t, err)
	again, err := workflow.Start(ctx, e.client, "once", args, nil)
	require.NoError(t, err)
	require.True(t, first.Created)
	require.False(t, again.Created)
	require.Equal(t, *first.RiverJobID, *again.RiverJobID)

	var jobs int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM river_job WHERE kind = 'test_count'").Scan(&jobs))
	require.Equal(t, 1, jobs)

	_, err = workflow.Start(ctx, e.client, "once", countArgs{Total: 11, Batch: 5, Table: "items"}, nil)
	require.ErrorIs(t, err, workflow.ErrRunConflict)
	require.ErrorContains(t, err, `"total":11`)
}

func TestStartRejectsBadKeys(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testkit.DB(t)
	e := newEnv(t, pool, nil, &countWorker{}, map[string]river.QueueConfig{})
	_, err := workflow.Start(ctx, e.client, "", countArgs{}, nil)
	require.ErrorContains(t, err, "key is empty")
	_, err = workflow.Start(ctx, e.client, strings.Repeat("k", 256), countArgs{}, nil)
	require.ErrorContains(t, err, "limited to 255")
}

func TestStepErrorRollsBackAndResumes(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"error", "panic"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool := testkit.DB(t)
			createItems(t, pool, "items", true)
			var failed atomic.Bool
			var stepsSeen []int64
			w := &countWorker{hook: func(ctx context.Context, s *workflow.Step[countArgs, countCursor]) error {
				stepsSeen = append(stepsSeen, s.Number)
				// Step 3 fails once, after writing its rows: they must roll back.
				if s.Number == 3 && failed.CompareAndSwap(false, true) {
					if mode == "panic" {
						panic("boom in step 3")
					}
					return errors.New("boom in step 3")
				}
				return nil
			}}
			e := newEnv(t, pool, nil, w, map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 1}})
			_, err := workflow.Start(ctx, e.client, "r", countArgs{Total: 50, Batch: 10, Table: "items"}, nil)
			require.NoError(t, err)
			run := waitRun(t, pool, "r", 10*time.Second, workflow.RunStatusSucceeded, workflow.RunStatusFailed)
			require.Equal(t, workflow.RunStatusSucceeded, run.Status)
			perN, _ := itemCounts(t, pool, "items", "r")
			requireExactlyOnce(t, perN, 50)
			// Resumed from the last committed cursor: step 3 ran again, steps 1-2 did not.
			require.Equal(t, []int64{1, 2, 3, 3, 4, 5}, stepsSeen)
			require.Equal(t, 2, run.Attempts)

			var recorded string
			require.NoError(t, pool.QueryRow(ctx, `SELECT detail->>'error' FROM stepwise_event
				WHERE subject = 'r' AND kind = 'run.step_error'`).Scan(&recorded))
			require.Contains(t, recorded, "boom in step 3")
		})
	}
}

func TestUndecodableCursorFailsRunAndKeepsCursor(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testkit.DB(t)
	createItems(t, pool, "items", true)
	e := newEnv(t, pool, nil, &countWorker{}, map[string]river.QueueConfig{})
	_, err := workflow.Start(ctx, e.client, "old", countArgs{Total: 50, Batch: 10, Table: "items"}, nil)
	require.NoError(t, err)
	// A cursor written by an older deploy, whose field was since renamed.
	_, err = pool.Exec(ctx, `UPDATE stepwise_checkpoint SET cursor = '{"after_item": 30}' WHERE key = 'old'`)
	require.NoError(t, err)

	newEnv(t, pool, nil, &countWorker{}, nil)
	run := waitRun(t, pool, "old", 10*time.Second, workflow.RunStatusFailed, workflow.RunStatusSucceeded)
	require.Equal(t, workflow.RunStatusFailed, run.Status)
	require.Contains(t, *run.LastError, `run "old"`)
	require.Contains(t, *run.LastError, "workflow_test.countCursor")
	require.Contains(t, *run.LastError, `{"after_item": 30}`)
	st, err := e.engine.Checkpoints().Get(ctx, "old")
	require.NoError(t, err)
	require.JSONEq(t, `{"after_item": 30}`, string(st.Cursor), "the raw cursor stays for a person to repair")
	perN, _ := itemCounts(t, pool, "items", "old")
	require.Empty(t, perN, "nothing was redone from zero")
}

func TestSliceSnoozesAndResumes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testkit.DB(t)
	createItems(t, pool, "items", true)
	w := &countWorker{hook: func(ctx context.Context, s *workflow.Step[countArgs, countCursor]) error {
		time.Sleep(20 * time.Millisecond)
		return nil
	}}
	e := newEnv(t, pool, &workflow.Config{Slice: 100 * time.Millisecond}, w, nil)
	_, err := workflow.Start(ctx, e.client, "sliced", countArgs{Total: 400, Batch: 20, Table: "items"}, nil)
	require.NoError(t, err)
	run := waitRun(t, pool, "sliced", 20*time.Second, workflow.RunStatusSucceeded, workflow.RunStatusFailed)
	require.Equal(t, workflow.RunStatusSucceeded, run.Status)
	require.GreaterOrEqual(t, run.Attempts, 3, "20 steps of 20ms in slices of 100ms need several attempts")
	perN, _ := itemCounts(t, pool, "items", "sliced")
	requireExactlyOnce(t, perN, 400)
	var releases int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM stepwise_event WHERE subject = 'sliced' AND kind = 'lease.claim'`).Scan(&releases))
	require.Equal(t, run.Attempts, releases)
}

// failArgs drives the outcome tests: Sleep, Fail and always-error.
type outcomeArgs struct {
	Mode string `json:"mode"`
}

func (outcomeArgs) Kind() string { return "test_outcome" }

type outcomeWorker struct {
	workflow.StepperDefaults[outcomeArgs, int]
	calls atomic.Int32
}

func (w *outcomeWorker) Step(ctx context.Context, s *workflow.Step[outcomeArgs, int]) (workflow.Next, error) {
	w.calls.Add(1)
	switch s.Args.Mode {
	case "sleep":
		s.Cursor++
		if s.Cursor == 1 {
			return workflow.Sleep(200 * time.Millisecond), nil
		}
		return workflow.Done(), nil
	case "fail":
		return workflow.Fail(errors.New("merchant 42 has no bank account")), nil
	default:
		return workflow.Next{}, errors.New("always failing")
	}
}

func TestOutcomes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testkit.DB(t)
	engine, err := workflow.New(pool, &workflow.Config{Logger: quietLogger()})
	require.NoError(t, err)
	workers := river.NewWorkers()
	w := &outcomeWorker{}
	workflow.AddWorker(engine, workers, w)
	require.Panics(t, func() { workflow.AddWorker(engine, workers, w) }, "a kind registered twice is bad wiring")
	e := newEnvWith(t, pool, engine, workers)

	start := time.Now()
	_, err = workflow.Start(ctx, e.client, "sleep", outcomeArgs{Mode: "sleep"}, nil)
	require.NoError(t, err)
	_, err = workflow.Start(ctx, e.client, "fail", outcomeArgs{Mode: "fail"}, nil)
	require.NoError(t, err)
	_, err = workflow.Start(ctx, e.client, "dead", outcomeArgs{Mode: "error"}, &workflow.StartOpts{InsertOpts: &river.InsertOpts{MaxAttempts: 3}})
	require.NoError(t, err)

	run := waitRun(t, pool, "sleep", 10*time.Second, workflow.RunStatusSucceeded, workflow.RunStatusFailed)
	require.Equal(t, workflow.RunStatusSucceeded, run.Status)
	require.GreaterOrEqual(t, time.Since(start), 200*time.Millisecond)
	require.Equal(t, 2, run.Attempts)

	run = waitRun(t, pool, "fail", 10*time.Second, workflow.RunStatusSucceeded, workflow.RunStatusFailed)
	require.Equal(t, workflow.RunStatusFailed, run.Status)
	require.Equal(t, "merchant 42 has no bank account", *run.LastError)
	require.Equal(t, 1, run.Attempts, "Fail is terminal: no retry")
	// The run is failed in the step's commit; River records the job's cancel right after.
	require.Eventually(t, func() bool {
		job, err := e.client.JobGet(ctx, *run.RiverJobID)
		return err == nil && job.State == "cancelled"
	}, 10*time.Second, 20*time.Millisecond)

	// An always-failing run backs off through River's attempts and ends dead, visibly.
	run = waitRun(t, pool, "dead", 10*time.Second, workflow.RunStatusSucceeded, workflow.RunStatusFailed)
	require.Equal(t, workflow.RunStatusFailed, run.Status)
	require.Contains(t, *run.LastError, "3 failures in a row without progress (the job's max attempts): always failing")
	require.Equal(t, 3, run.Attempts)
}

// newEnvWith starts a River client for engine's workers (with middleware, if any) on the
// default queue.
func newEnvWith(t testing.TB, pool interface{}, engine *workflow.Engine, workers *river.Workers, middleware ...rivertype.Middleware) *env {
	t.Helper()
	p := testkitPool(pool)
	rc := &river.Config{
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 4}},
		Workers:           workers,
		Middleware:        middleware,
		RetryPolicy:       fastRetry{},
		FetchCooldown:     5 * time.Millisecond,
		FetchPollInterval: 50 * time.Millisecond,
		Logger:            quietLogger(),
	}
	require.NoError(t, engine.Install(rc))
	client, err := river.NewClient(riverDriver(p), rc)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	require.NoError(t, client.Start(ctx))
	t.Cleanup(func() {
		stopCtx, stop := context.WithTimeout(context.Background(), 10*time.Second)
		defer stop()
		_ = client.Stop(stopCtx)
		cancel()
	})
	return &env{pool: p, engine: engine, client: client, workers: workers}
}

func TestRunKeyFromArgs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testkit.DB(t)
	engine, err := workflow.New(pool, &workflow.Config{Logger: quietLogger()})
	require.NoError(t, err)
	workers := river.NewWorkers()
	workflow.AddWorker(engine, workers, workflow.StepFunc(func(ctx context.Context, s *workflow.Step[keyedArgs, json.RawMessage]) (workflow.Next, error) {
		return workflow.Done(), nil
	}))
	e := newEnvWith(t, pool, engine, workers)
	// Inserted with plain River, no workflow.Start: the args name the run.
	_, err = e.client.Insert(ctx, keyedArgs{Date: "2026-11-29"}, nil)
	require.NoError(t, err)
	run := waitRun(t, pool, "settle/2026-11-29", 10*time.Second, workflow.RunStatusSucceeded)
	require.Equal(t, "test_keyed", run.Workflow)
}

type keyedArgs struct {
	Date string `json:"date"`
}

func (keyedArgs) Kind() string     { return "test_keyed" }
func (a keyedArgs) RunKey() string { return "settle/" + a.Date }

// The maintenance job must keep coming: River's default unique states include 'completed',
// which would block every insert after the first pass and silently stop fast takeover.
func TestMaintenanceKeepsRunning(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testkit.DB(t)
	newEnv(t, pool, &workflow.Config{MaintenanceInterval: 100 * time.Millisecond}, &countWorker{}, nil)
	require.Eventually(t, func() bool {
		var done int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM river_job WHERE kind = 'stepwise_maintenance' AND state = 'completed'`).Scan(&done)
		return err == nil && done >= 3
	}, 20*time.Second, 50*time.Millisecond)
}

func TestMetrics(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testkit.DB(t)
	createItems(t, pool, "items", true)
	e := newEnv(t, pool, nil, &countWorker{}, nil)
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(e.engine.Metrics()))

	_, err := workflow.Start(ctx, e.client, "m", countArgs{Total: 30, Batch: 10, Table: "items"}, nil)
	require.NoError(t, err)
	waitRun(t, pool, "m", 10*time.Second, workflow.RunStatusSucceeded)
	// A run nobody works, with a lease that expired a minute ago: visible as a stale lease.
	_, err = workflow.Start(ctx, e.client, "orphan", countArgs{Total: 30, Batch: 10, Table: "items"},
		&workflow.StartOpts{InsertOpts: &river.InsertOpts{Queue: "nobody_works_this"}})
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE stepwise_checkpoint SET owner = 'gone', lease_until = now() - interval '1 minute' WHERE key = 'orphan'`)
	require.NoError(t, err)

	families, err := reg.Gather()
	require.NoError(t, err)
	got := map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			name := f.GetName()
			for _, l := range m.GetLabel() {
				name += "," + l.GetName() + "=" + l.GetValue()
			}
			switch {
			case m.Counter != nil:
				got[name] = m.Counter.GetValue()
			case m.Gauge != nil:
				got[name] = m.Gauge.GetValue()
			}
		}
	}
	require.Equal(t, 3.0, got["stepwise_steps_committed_total,workflow=test_count"], "three batches of 10, the third returning Done")
	require.Equal(t, 1.0, got["stepwise_runs_finished_total,status=succeeded,workflow=test_count"])
	require.Equal(t, 1.0, got["stepwise_runs_active,status=pending,workflow=test_count"])
	require.GreaterOrEqual(t, got["stepwise_run_lease_expired_seconds"], 59.0)
}

// A maintenance job left 'running' by a killed leader must not block the next ones: River
// keeps such a job running until its one-hour rescue, and a uniqueness that counted it would
// stop takeover for that hour. Maintenance is unique per period instead.
func TestMaintenanceNotBlockedByADeadJob(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testkit.DB(t)
	cfg := &workflow.Config{MaintenanceInterval: time.Second}
	insertOnly := newEnv(t, pool, cfg, nil, map[string]river.QueueConfig{})
	// The corpse: inserted exactly as the periodic job inserts it, then "running" forever.
	dead, err := insertOnly.client.Insert(ctx, workflow.MaintenanceArgsForTest{}, workflow.MaintenanceInsertOptsForTest(insertOnly.engine))
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE river_job SET state = 'running', attempt = 1, attempted_at = now() - interval '1 minute' WHERE id = $1`, dead.Job.ID)
	require.NoError(t, err)

	newEnv(t, pool, cfg, &countWorker{}, nil)
	require.Eventually(t, func() bool {
		var done int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM river_job WHERE kind = 'stepwise_maintenance' AND state = 'completed'`).Scan(&done)
		return err == nil && done >= 2
	}, 20*time.Second, 50*time.Millisecond)
}
