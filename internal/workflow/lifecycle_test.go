package workflow_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/internal/testkit"
	"github.com/stepwise-go/stepwise/internal/workflow"
)

// waitForLockWaiter waits until some backend of this database waits on a row lock: the
// maintenance pass has made its decision and is blocked on the row the test holds.
func waitForLockWaiter(t *testing.T, pool interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) {
	t.Helper()
	require.Eventually(t, func() bool {
		var n int
		err := pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n)
		return err == nil && n > 0
	}, 10*time.Second, 5*time.Millisecond)
}

// stalledClient is the River client fakeAttempt's worker belongs to.
const stalledClient = "stalled-client"

// fakeAttempt makes a started run look like River's client stalledClient fetched its job half
// an hour ago (well within River's own rescue of stuck jobs, an hour, which would otherwise
// race the test's maintenance) and its worker claimed it, under the owner a worker writes; the
// lease is then left to lapse, as a worker stalled past its heartbeat would.
func fakeAttempt(t *testing.T, e *env, key string) {
	t.Helper()
	ctx := context.Background()
	run, err := workflow.GetRun(ctx, e.pool, key)
	require.NoError(t, err)
	_, err = e.pool.Exec(ctx, `UPDATE river_job SET state = 'running', attempt = 1, attempted_at = now() - interval '30 minutes',
		attempted_by = ARRAY[$2::text] WHERE id = $1`, *run.RiverJobID, stalledClient)
	require.NoError(t, err)
	_, err = e.engine.Checkpoints().Claim(ctx, key, workflow.OwnerForTest(stalledClient, *run.RiverJobID, 1), 1)
	require.NoError(t, err)
	_, err = e.pool.Exec(ctx, `UPDATE stepwise_run SET status = 'running', attempts = attempts + 1 WHERE key = $1`, key)
	require.NoError(t, err)
	_, err = e.pool.Exec(ctx, `UPDATE stepwise_checkpoint SET lease_until = now() - interval '1 second' WHERE key = $1`, key)
	require.NoError(t, err)
}

// A run's lease is never taken from a live worker; here, the renewing worker: maintenance decides from a scan that a run's worker
// vanished, and before its transaction acts the worker renews its lease (held here, under the
// rows' locks, until maintenance has decided and waits). The old pass rechecked only the job
// id and failed the live run; every transition is now conditional on the lease it saw.
func TestMaintenanceRaceRenewingWorker(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, testkit.DB(t), &workflow.Config{Lease: time.Second}, nil, map[string]river.QueueConfig{})
	// MaxAttempts 1: the first vanish is a crash loop, so the pass wants to fail the run.
	_, err := workflow.Start(ctx, e.client, "live", countArgs{Total: 10, Batch: 1, Table: "items"},
		&workflow.StartOpts{InsertOpts: &river.InsertOpts{MaxAttempts: 1}})
	require.NoError(t, err)
	fakeAttempt(t, e, "live")

	tx, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	defer rollbackQuietly(tx)
	_, err = tx.Exec(ctx, `SELECT 1 FROM stepwise_run WHERE key = 'live' FOR UPDATE`)
	require.NoError(t, err)
	// The worker's heartbeat: renewed under the row lock, visible when the test commits.
	_, err = tx.Exec(ctx, `UPDATE stepwise_checkpoint SET lease_until = now() + interval '1 hour' WHERE key = 'live'`)
	require.NoError(t, err)

	type result struct {
		res *workflow.MaintenanceResult
		err error
	}
	done := make(chan result, 1)
	go func() {
		res, err := e.engine.Maintain(ctx, e.client)
		done <- result{res, err}
	}()
	waitForLockWaiter(t, e.pool)
	require.NoError(t, tx.Commit(ctx))
	r := <-done
	require.NoError(t, r.err)
	run, err := workflow.GetRun(ctx, e.pool, "live")
	require.NoError(t, err)
	t.Logf("maintenance: failed %v, taken over %v; run %s", r.res.Failed, r.res.TakenOver, run.Status)
	require.Empty(t, r.res.Failed, "a run whose worker renewed was failed")
	require.Equal(t, workflow.RunStatusRunning, run.Status)
}

// A takeover records the River client that had last fetched the run's job, and when, as the
// pass saw them. The old job lives on and is fetched again later (by whichever process finds
// it superseded), so its attempted_by read afterwards names a process that never held the run:
// a chaos oracle reading it blamed a live worker for a takeover that answered a frozen one.
func TestTakeoverRecordsFetcher(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, testkit.DB(t), &workflow.Config{Lease: time.Second}, nil, map[string]river.QueueConfig{})
	_, err := workflow.Start(ctx, e.client, "fetched", countArgs{Total: 10, Batch: 1, Table: "items"}, nil)
	require.NoError(t, err)
	fakeAttempt(t, e, "fetched")
	run, err := workflow.GetRun(ctx, e.pool, "fetched")
	require.NoError(t, err)
	var fetchedAt time.Time
	require.NoError(t, e.pool.QueryRow(ctx, `UPDATE river_job SET attempted_by = ARRAY['worker-a', 'worker-b'] WHERE id = $1 RETURNING attempted_at`,
		*run.RiverJobID).Scan(&fetchedAt))
	res, err := e.engine.Maintain(ctx, e.client)
	require.NoError(t, err)
	require.Equal(t, []string{"fetched"}, res.TakenOver)
	// The old job is fetched again after the takeover: the event keeps what the pass saw.
	_, err = e.pool.Exec(ctx, `UPDATE river_job SET attempted_by = attempted_by || 'worker-c'::text WHERE id = $1`, *run.RiverJobID)
	require.NoError(t, err)
	var by string
	var at time.Time
	require.NoError(t, e.pool.QueryRow(ctx, `SELECT detail->>'fetched_by', (detail->>'fetched_at')::timestamptz
		FROM stepwise_event WHERE subject = 'fetched' AND kind = 'run.takeover'`).Scan(&by, &at))
	require.Equal(t, "worker-b", by)
	require.WithinDuration(t, fetchedAt, at, time.Millisecond)
}

// A run's lease is never taken from a live worker; here, the finishing worker: maintenance fails a run (its worker looked dead: the
// lease lapsed while the step was stuck) and the worker then finishes its step with Done.
// The old finish had no status guard and flipped 'failed' to 'succeeded'; now the step is
// fenced and rolled back, and the run stays failed with one finish in its audit trail.
func TestMaintenanceRaceFinishingWorker(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testkit.DB(t)
	createItems(t, pool, "items", true)
	entered := make(chan struct{})
	proceed := make(chan struct{})
	w := &countWorker{hook: func(ctx context.Context, s *workflow.Step[countArgs, countCursor]) error {
		close(entered)
		<-proceed
		return nil
	}}
	// A heartbeat as long as allowed, so the lapse below is not renewed before the pass.
	e := newEnv(t, pool, &workflow.Config{Lease: 2 * time.Second, Heartbeat: 1900 * time.Millisecond}, w, nil)
	run, err := workflow.Start(ctx, e.client, "finisher", countArgs{Total: 5, Batch: 5, Table: "items"},
		&workflow.StartOpts{InsertOpts: &river.InsertOpts{MaxAttempts: 1}})
	require.NoError(t, err)
	<-entered
	_, err = pool.Exec(ctx, `UPDATE river_job SET attempted_at = now() - interval '1 hour' WHERE id = $1`, *run.RiverJobID)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE stepwise_checkpoint SET lease_until = now() - interval '1 second' WHERE key = 'finisher'`)
	require.NoError(t, err)
	res, err := e.engine.Maintain(ctx, e.client)
	require.NoError(t, err)
	require.Equal(t, []string{"finisher"}, res.Failed)

	close(proceed) // the step returns Done and tries to commit
	require.Eventually(t, func() bool {
		job, err := e.client.JobGet(ctx, *run.RiverJobID)
		return err == nil && job.State != "running"
	}, 10*time.Second, 20*time.Millisecond)
	run, err = workflow.GetRun(ctx, pool, "finisher")
	require.NoError(t, err)
	finishes := queryInt(t, pool, `SELECT count(*) FROM stepwise_event WHERE subject = 'finisher' AND kind = 'run.finish'`)
	perN, _ := itemCounts(t, pool, "items", "finisher")
	t.Logf("run %s, %d finish events, %d items committed", run.Status, finishes, len(perN))
	require.Equal(t, workflow.RunStatusFailed, run.Status, "a failed run flipped to %s", run.Status)
	require.Equal(t, 1, finishes)
	require.Empty(t, perN, "the step of a failed run committed its writes")
}

func rollbackQuietly(tx pgx.Tx) { _ = tx.Rollback(context.Background()) }

// syncBuffer is a log sink the test can read while workers write to it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

type misuseArgs struct {
	Mode string `json:"mode"`
}

func (misuseArgs) Kind() string { return "test_misuse" }

// Step misuse is refused loudly. The zero Next{} used to mean Continue and
// looped forever; Commit on the step's Tx landed writes unfenced; a step error was logged
// nowhere. Each now fails the step with an error naming the fix, logged at WARN with the run,
// step and attempt, and counted.
func TestStepMisuseIsRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testkit.DB(t)
	logs := &syncBuffer{}
	engine, err := workflow.New(pool, &workflow.Config{Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	require.NoError(t, err)
	var steps atomic.Int32
	workers := river.NewWorkers()
	workflow.AddWorker(engine, workers, workflow.StepFunc(func(ctx context.Context, s *workflow.Step[misuseArgs, int]) (workflow.Next, error) {
		steps.Add(1)
		switch s.Args.Mode {
		case "commit":
			if _, err := s.Tx.Exec(ctx, `CREATE TABLE misuse_commit (x int)`); err != nil {
				return workflow.Next{}, err
			}
			_ = s.Tx.Commit(ctx) // the error is ignored, as careless code would
			return workflow.Continue(), nil
		case "rollback":
			err := s.Tx.Rollback(ctx)
			return workflow.Done(), err
		}
		return workflow.Next{}, nil
	}))
	e := newEnvWith(t, pool, engine, workers)
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(engine.Metrics()))

	for _, tc := range []struct{ mode, want string }{
		{"zero", "workflow.Continue()"},
		{"commit", "Step.Tx.Commit"},
		{"rollback", "Step.Tx.Rollback"},
	} {
		_, err := workflow.Start(ctx, e.client, tc.mode, misuseArgs{Mode: tc.mode}, &workflow.StartOpts{InsertOpts: &river.InsertOpts{MaxAttempts: 2}})
		require.NoError(t, err)
		run := waitRun(t, pool, tc.mode, 15*time.Second, workflow.RunStatusFailed, workflow.RunStatusSucceeded)
		t.Logf("%s: %s after %d steps: %s", tc.mode, run.Status, steps.Load(), deref(run.LastError))
		require.Equal(t, workflow.RunStatusFailed, run.Status)
		require.Contains(t, deref(run.LastError), tc.want)
	}
	var tables int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE tablename = 'misuse_commit'`).Scan(&tables))
	require.Zero(t, tables, "a step's own Commit landed its writes")
	require.Contains(t, logs.String(), "level=WARN msg=\"stepwise: step failed")
	require.Contains(t, logs.String(), "run=zero step=1 attempt=1")
	families, err := reg.Gather()
	require.NoError(t, err)
	var errs float64
	for _, f := range families {
		if f.GetName() == "stepwise_step_errors_total" {
			for _, m := range f.GetMetric() {
				errs += m.Counter.GetValue()
			}
		}
	}
	require.Equal(t, 6.0, errs, "three runs, two attempts each")
}

// CancelRun on a sleeping run takes effect at the next maintenance pass,
// not when the run wakes an hour later.
func TestCancelSleepingRun(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testkit.DB(t)
	createItems(t, pool, "items", true)
	w := &countWorker{next: func(s *workflow.Step[countArgs, countCursor]) (workflow.Next, bool) {
		return workflow.Sleep(time.Hour), true
	}}
	e := newEnv(t, pool, &workflow.Config{Lease: time.Second}, w, nil)
	run, err := workflow.Start(ctx, e.client, "dozer", countArgs{Total: 10, Batch: 1, Table: "items"}, nil)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		job, err := e.client.JobGet(ctx, *run.RiverJobID)
		return err == nil && job.State == "scheduled"
	}, 10*time.Second, 20*time.Millisecond)

	require.NoError(t, workflow.CancelRun(ctx, pool, "dozer", "merchant closed"))
	res, err := e.engine.Maintain(ctx, e.client)
	require.NoError(t, err)
	run, err = workflow.GetRun(ctx, pool, "dozer")
	require.NoError(t, err)
	t.Logf("after one pass: run %s, cancelled %v", run.Status, res.Cancelled)
	require.Equal(t, workflow.RunStatusCancelled, run.Status)
	require.Contains(t, deref(run.LastError), "merchant closed")
	job, err := e.client.JobGet(ctx, *run.RiverJobID)
	require.NoError(t, err)
	require.Equal(t, "cancelled", string(job.State), "the sleeping job must not wake to find a cancelled run")
}

// Maintenance reads River's tables unqualified, so a client configured with
// another schema is refused at Install with the reason and the fix, never silently wrong.
func TestInstallRefusesRiverSchema(t *testing.T) {
	t.Parallel()
	engine, err := workflow.New(testkit.DB(t), nil)
	require.NoError(t, err)
	err = engine.Install(&river.Config{Schema: "jobs"})
	require.ErrorContains(t, err, `Config.River.Schema is "jobs"`)
	require.NoError(t, engine.Install(&river.Config{}))
}

// A failed run is resumed from its last committed cursor, audited with the
// actor and the reason, and finishes with every item exactly once.
func TestResumeFailedRun(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testkit.DB(t)
	createItems(t, pool, "items", true)
	var broken atomic.Bool
	broken.Store(true)
	w := &countWorker{hook: func(ctx context.Context, s *workflow.Step[countArgs, countCursor]) error {
		if s.Cursor.Next == 30 && broken.Load() {
			return errors.New("bank unreachable")
		}
		return nil
	}}
	e := newEnv(t, pool, nil, w, nil)
	_, err := workflow.Start(ctx, e.client, "resumable", countArgs{Total: 50, Batch: 10, Table: "items"},
		&workflow.StartOpts{InsertOpts: &river.InsertOpts{MaxAttempts: 2}})
	require.NoError(t, err)
	run := waitRun(t, pool, "resumable", 10*time.Second, workflow.RunStatusFailed, workflow.RunStatusSucceeded)
	require.Equal(t, workflow.RunStatusFailed, run.Status)

	err = resumeNow(ctx, pool, e.client, "resumable", "", "x")
	require.ErrorContains(t, err, "actor")
	broken.Store(false)
	require.NoError(t, resumeNow(ctx, pool, e.client, "resumable", "alice@ops", "bank is back (INC-42)"))
	run = waitRun(t, pool, "resumable", 10*time.Second, workflow.RunStatusSucceeded, workflow.RunStatusFailed)
	require.Equal(t, workflow.RunStatusSucceeded, run.Status)
	perN, _ := itemCounts(t, pool, "items", "resumable")
	requireExactlyOnce(t, perN, 50)
	var actor, reason string
	require.NoError(t, pool.QueryRow(ctx, `SELECT actor, detail->>'reason' FROM stepwise_event WHERE subject = 'resumable' AND kind = 'run.resume'`).Scan(&actor, &reason))
	require.Equal(t, "alice@ops", actor)
	require.Equal(t, "bank is back (INC-42)", reason)
	st, err := e.engine.Checkpoints().Get(ctx, "resumable")
	require.NoError(t, err)
	require.Equal(t, int64(5), st.Steps, "steps 1-3 were not redone: resumed from the committed cursor")

	err = resumeNow(ctx, pool, e.client, "resumable", "alice@ops", "again")
	require.ErrorIs(t, err, workflow.ErrRunNotResumable)
	require.ErrorContains(t, err, "succeeded")
	// A stale version is refused as such before the status is judged.
	require.ErrorIs(t, resumeSeen(ctx, pool, e.client, "resumable", 1, "alice@ops", "again"), workflow.ErrRunChanged)
	require.ErrorIs(t, resumeSeen(ctx, pool, e.client, "nope", 1, "alice@ops", "x"), workflow.ErrRunNotFound)
}

// hourRetry schedules every retry an hour out, like River's backoff after a few attempts.
type hourRetry struct{}

func (hourRetry) NextRetry(*rivertype.JobRow) time.Time { return time.Now().Add(time.Hour) }

// A lease given up on purpose is not a crash; here, after step errors: River's backoff is honoured. A step fails after running
// longer than the lease; until River's completer records the retry (its batches flush every
// 250ms) the job is 'running' with a stale attempted_at and no lease. The old maintenance
// (here every 10ms) took it over into a job available at once, skipping the backoff; the run
// must wait for River's retry instead.
func TestStepErrorBackoffHonoured(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testkit.DB(t)
	createItems(t, pool, "items", true)
	var steps atomic.Int32
	w := &countWorker{hook: func(ctx context.Context, s *workflow.Step[countArgs, countCursor]) error {
		steps.Add(1)
		// Longer than two leases: the job's attempted_at alone no longer protects it from
		// the unleased scan (unleasedGrace), only the release recorded with the error does.
		time.Sleep(2200 * time.Millisecond)
		return errors.New("bank said 503")
	}}
	engine, err := workflow.New(pool, &workflow.Config{Lease: time.Second, StallTimeout: 10 * time.Second, Logger: quietLogger()})
	require.NoError(t, err)
	workers := river.NewWorkers()
	workflow.AddWorker(engine, workers, w)
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		Queues:      map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 2}},
		Workers:     workers,
		RetryPolicy: hourRetry{},
		Logger:      quietLogger(),
	})
	require.NoError(t, err)
	runCtx, cancel := context.WithCancel(ctx)
	require.NoError(t, client.Start(runCtx))
	t.Cleanup(func() {
		stopCtx, stop := context.WithTimeout(context.Background(), 10*time.Second)
		defer stop()
		_ = client.Stop(stopCtx)
		cancel()
	})
	e := &env{pool: pool, engine: engine, client: client, workers: workers}
	maintainLoop(t, e, 10*time.Millisecond)

	_, err = workflow.Start(ctx, client, "backoff", countArgs{Total: 10, Batch: 1, Table: "items"}, nil)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return steps.Load() >= 1 }, 10*time.Second, 10*time.Millisecond)
	time.Sleep(4 * time.Second) // the step's 2.2s, River's completer, many maintenance passes
	run, err := workflow.GetRun(ctx, pool, "backoff")
	require.NoError(t, err)
	takeovers := queryInt(t, pool, `SELECT count(*) FROM stepwise_event WHERE subject = 'backoff' AND kind = 'run.takeover'`)
	job, err := client.JobGet(ctx, *run.RiverJobID)
	require.NoError(t, err)
	t.Logf("after 4s: %d step attempts, %d takeovers, job %d %s due in %s", steps.Load(), takeovers, job.ID, job.State, time.Until(job.ScheduledAt).Round(time.Second))
	require.Zero(t, takeovers, "a run waiting for River's retry was taken over")
	require.Equal(t, int32(1), steps.Load(), "the step ran again before River's backoff")
	require.Equal(t, "retryable", string(job.State))
}

// The crash-loop guard counts failures in a row without progress (a 10-minute chaos soak
// failed a run that had committed 6,676 steps because its workers were SIGKILLed 25 times).
// Takeovers are simulated deterministically: a stalled attempt with a lapsed lease, then a
// maintenance pass. With steps committed between the takeovers the run is taken over twice
// its MaxAttempts and stays running, its count back at 1 each time; without progress it fails
// on its MaxAttempts-th failure in a row, as a crash loop.
func TestCrashLoopGuardCountsFailuresWithoutProgress(t *testing.T) {
	t.Parallel()
	const maxAttempts = 3
	for _, tc := range []struct {
		name     string
		progress bool
	}{{"progress between takeovers", true}, {"no progress", false}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			e := newEnv(t, testkit.DB(t), &workflow.Config{Lease: time.Second}, nil, map[string]river.QueueConfig{})
			_, err := workflow.Start(ctx, e.client, "flaky", countArgs{Total: 1000, Batch: 1, Table: "items"},
				&workflow.StartOpts{InsertOpts: &river.InsertOpts{MaxAttempts: maxAttempts}})
			require.NoError(t, err)
			var failures []int
			for kill := 1; kill <= 2*maxAttempts; kill++ {
				fakeAttempt(t, e, "flaky")
				if tc.progress { // the attempt committed steps before its worker was killed
					_, err := e.pool.Exec(ctx, `UPDATE stepwise_checkpoint SET steps = steps + 7 WHERE key = 'flaky'`)
					require.NoError(t, err)
				}
				res, err := e.engine.Maintain(ctx, e.client)
				require.NoError(t, err)
				run, err := workflow.GetRun(ctx, e.pool, "flaky")
				require.NoError(t, err)
				t.Logf("kill %d: taken over %v, failed %v; status %s, failures %d", kill, res.TakenOver, res.Failed, run.Status, run.Failures)
				if tc.progress {
					require.Equal(t, workflow.RunStatusRunning, run.Status, "kill %d: a run progressing between crashes is not a crash loop", kill)
					require.Equal(t, []string{"flaky"}, res.TakenOver, "kill %d", kill)
					failures = append(failures, run.Failures)
					continue
				}
				if kill < maxAttempts {
					require.Equal(t, []string{"flaky"}, res.TakenOver, "kill %d", kill)
					require.Equal(t, kill, run.Failures)
					continue
				}
				require.Equal(t, []string{"flaky"}, res.Failed, "kill %d", kill)
				require.Equal(t, workflow.RunStatusFailed, run.Status)
				require.Equal(t, maxAttempts, run.Failures)
				require.Contains(t, *run.LastError, "a crash loop")
				return
			}
			require.True(t, tc.progress, "the run without progress was never failed")
			require.Equal(t, []int{1, 1, 1, 1, 1, 1}, failures, "progress since the last failure restarts the count")
		})
	}
}

// The same rule for step errors: errors with steps committed between them restart the count;
// errors in a row fail the run on its MaxAttempts-th, whatever the job's own attempt.
func TestCrashLoopGuardStepErrors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const maxFailures = 3
	e := newEnv(t, testkit.DB(t), &workflow.Config{Lease: time.Second}, nil, map[string]river.QueueConfig{})
	_, err := workflow.Start(ctx, e.client, "erring", countArgs{Total: 1000, Batch: 1, Table: "items"}, nil)
	require.NoError(t, err)
	fakeAttempt(t, e, "erring")
	run, err := workflow.GetRun(ctx, e.pool, "erring")
	require.NoError(t, err)
	for i := 1; i <= 2*maxFailures; i++ {
		_, err := e.pool.Exec(ctx, `UPDATE stepwise_checkpoint SET steps = steps + 3 WHERE key = 'erring'`)
		require.NoError(t, err)
		status, err := workflow.MarkStepErrorForTest(ctx, e.engine, "erring", *run.RiverJobID, "flaky upstream", maxFailures)
		require.NoError(t, err)
		require.Equal(t, workflow.RunStatusRunning, status, "error %d, after progress", i)
		got, err := workflow.GetRun(ctx, e.pool, "erring")
		require.NoError(t, err)
		require.Equal(t, 1, got.Failures, "error %d, after progress", i)
	}
	for i := 2; i <= maxFailures; i++ { // no progress: 2, 3 in a row after the last one
		status, err := workflow.MarkStepErrorForTest(ctx, e.engine, "erring", *run.RiverJobID, "poison item", maxFailures)
		require.NoError(t, err)
		got, err := workflow.GetRun(ctx, e.pool, "erring")
		require.NoError(t, err)
		require.Equal(t, i, got.Failures)
		if i < maxFailures {
			require.Equal(t, workflow.RunStatusRunning, status)
		} else {
			require.Equal(t, workflow.RunStatusFailed, status, "errors in a row without progress are a crash loop")
		}
	}
}

// A run that keeps committing steps between step errors is not a crash loop, even when its
// River job has used up its attempts: River counts every error of the job, the guard only
// failures in a row without progress. Here the job may be attempted 3 times and the step
// errors once after every second committed step (5 errors in all, with progress between
// each): before, the third error came on the job's last attempt, River discarded the job
// and the run ended failed; now the worker snoozes the job instead (a snooze is not an
// attempt) and the run completes.
func TestStepErrorsWithProgressOutliveTheJobsAttempts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testkit.DB(t)
	createItems(t, pool, "items", true)
	var mu sync.Mutex
	failedAt := map[int]bool{}
	errorsSeen := 0
	w := &countWorker{hook: func(ctx context.Context, s *workflow.Step[countArgs, countCursor]) error {
		mu.Lock()
		defer mu.Unlock()
		if n := s.Cursor.Next; n%2 == 1 && !failedAt[n] {
			failedAt[n] = true
			errorsSeen++
			return fmt.Errorf("upstream hiccup before item %d", n)
		}
		return nil
	}}
	e := newEnv(t, pool, &workflow.Config{Lease: time.Second}, w, nil)
	_, err := workflow.Start(ctx, e.client, "hiccups", countArgs{Total: 10, Batch: 1, Table: "items"},
		&workflow.StartOpts{InsertOpts: &river.InsertOpts{MaxAttempts: 3}})
	require.NoError(t, err)
	run := waitRun(t, pool, "hiccups", 60*time.Second, workflow.RunStatusSucceeded, workflow.RunStatusFailed)
	mu.Lock()
	t.Logf("run %s after %d step errors; last error: %v", run.Status, errorsSeen, ptrString(run.LastError))
	mu.Unlock()
	require.Equal(t, workflow.RunStatusSucceeded, run.Status, "a run progressing between step errors was failed by River's attempt budget")
	perN, _ := itemCounts(t, pool, "items", "hiccups")
	requireExactlyOnce(t, perN, 10)
}

func ptrString(s *string) string {
	if s == nil {
		return "<nil>"
	}
	return *s
}

// A Sleep holds against "retry now" (River's JobRetry, as River's UI offers it): the job comes
// early, claims nothing and snoozes back to the run's wake time, measured on the database's
// clock.
func TestRetryNowOnASleepingRunSleepsOn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testkit.DB(t)
	createItems(t, pool, "items", true)
	w := &countWorker{next: func(s *workflow.Step[countArgs, countCursor]) (workflow.Next, bool) {
		return workflow.Sleep(time.Hour), true
	}}
	e := newEnv(t, pool, &workflow.Config{Lease: time.Second}, w, nil)
	run, err := workflow.Start(ctx, e.client, "dozer", countArgs{Total: 10, Batch: 1, Table: "items"}, nil)
	require.NoError(t, err)
	jobState := func() (string, time.Duration) {
		var state string
		var dueIn time.Duration
		require.NoError(t, pool.QueryRow(ctx, `SELECT state::text, (extract(epoch FROM scheduled_at - now()) * 1e9)::bigint FROM river_job WHERE id = $1`,
			*run.RiverJobID).Scan(&state, &dueIn))
		return state, dueIn
	}
	require.Eventually(t, func() bool { st, _ := jobState(); return st == "scheduled" }, 10*time.Second, 20*time.Millisecond)
	retried := time.Now()
	_, err = e.client.JobRetry(ctx, *run.RiverJobID)
	require.NoError(t, err)
	// The retried job is fetched (attempted again), finds the run asleep and snoozes back to
	// its wake time.
	require.Eventually(t, func() bool {
		var attemptedAt time.Time
		require.NoError(t, pool.QueryRow(ctx, `SELECT attempted_at FROM river_job WHERE id = $1`, *run.RiverJobID).Scan(&attemptedAt))
		st, dueIn := jobState()
		return attemptedAt.After(retried) && st == "scheduled" && dueIn > 55*time.Minute
	}, 20*time.Second, 20*time.Millisecond, "the retried job of a sleeping run was not snoozed back to its wake time")
	var items int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM items WHERE run_key = 'dozer'`).Scan(&items))
	require.Equal(t, 1, items, "the sleeping run's next step ran on a retry-now")
	after, err := workflow.GetRun(ctx, pool, "dozer")
	require.NoError(t, err)
	require.NotNil(t, after.WakeAt)
	require.Greater(t, time.Until(*after.WakeAt), 55*time.Minute)
}

// Cancelling a finished run does nothing, to it or, through it, to its descendants: a later
// cancel of a child is the child's own news, not the parent's cancellation.
func TestCancelOfAFinishedRunReachesNoDescendant(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testkit.DB(t)
	_, err := pool.Exec(ctx, `INSERT INTO stepwise_checkpoint (key) VALUES ('fp'), ('fp/c');
		INSERT INTO stepwise_run (key, workflow, input, status, finished_at) VALUES ('fp', 'wf', '{}', 'failed', now());
		INSERT INTO stepwise_run (key, workflow, input, status, parent_key) VALUES ('fp/c', 'wf', '{}', 'running', 'fp')`)
	require.NoError(t, err)
	require.NoError(t, workflow.CancelRun(ctx, pool, "fp", "too late"))
	var requested int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM stepwise_run WHERE cancel_requested_at IS NOT NULL`).Scan(&requested))
	require.Zero(t, requested, "neither the finished run nor its running child")
	var events int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM stepwise_event WHERE kind = 'run.cancel_requested'`).Scan(&events))
	require.Zero(t, events)
}
