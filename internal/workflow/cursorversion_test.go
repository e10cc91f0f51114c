package workflow_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/internal/testkit"
	"github.com/stepwise-go/stepwise/internal/workflow"
)

// countCursorV2 is the count workflow's cursor after a release that changed its shape: the
// field is renamed (so version 1's strict decoder cannot read it, nor it version 1's) and a
// counter added.
type countCursorV2 struct {
	Done  int `json:"done"`
	Steps int `json:"steps"`
}

// countWorkerV2 is the count workflow of that release: the same business writes, cursor
// version 2, and an upgrade from version 1 (unless noUpgrade).
type countWorkerV2 struct {
	workflow.StepperDefaults[countArgs, countCursorV2]
	noUpgrade bool
	stepSleep time.Duration
	slice     time.Duration
}

func (w *countWorkerV2) CursorVersion() int { return 2 }

func (w *countWorkerV2) UpgradeCursor(from int, raw json.RawMessage) (countCursorV2, error) {
	if from != 1 || w.noUpgrade {
		return countCursorV2{}, fmt.Errorf("%w (version %d)", workflow.ErrNoCursorUpgrade, from)
	}
	var v1 countCursor
	if err := json.Unmarshal(raw, &v1); err != nil {
		return countCursorV2{}, err
	}
	return countCursorV2{Done: v1.Next}, nil
}

func (w *countWorkerV2) StepOptions() *workflow.StepOpts {
	if w.slice == 0 {
		return nil
	}
	return &workflow.StepOpts{Slice: w.slice}
}

func (w *countWorkerV2) Step(ctx context.Context, s *workflow.Step[countArgs, countCursorV2]) (workflow.Next, error) {
	fmt.Printf("step run=%s n=%d cursor=%d pid=%d token=%d v=2\n", s.RunKey, s.Number, s.Cursor.Done, os.Getpid(), s.Token)
	if s.Cursor.Done >= s.Args.Total {
		return workflow.Done(), nil
	}
	end := min(s.Cursor.Done+s.Args.Batch, s.Args.Total)
	_, err := s.Tx.Exec(ctx, fmt.Sprintf(`INSERT INTO %s (run_key, n, token, pid)
		SELECT $1, g, $2, $3 FROM generate_series($4::int, $5::int - 1) g`, pgx.Identifier{s.Args.Table}.Sanitize()),
		s.RunKey, s.Token, os.Getpid(), s.Cursor.Done, end)
	if err != nil {
		return workflow.Next{}, err
	}
	if w.stepSleep > 0 {
		time.Sleep(w.stepSleep)
	}
	s.Cursor.Done, s.Cursor.Steps = end, s.Cursor.Steps+1
	if end >= s.Args.Total {
		return workflow.Done(), nil
	}
	return workflow.Continue(), nil
}

// lockedBuffer is a log sink shared by the goroutines of a River client.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// workerClient starts, in this process, a River client working queue "wf" with stepper w
// (of either cursor type), on an engine of its own; stop ends it.
func workerClient[C any](t *testing.T, pool *pgxpool.Pool, logs *lockedBuffer, w workflow.Stepper[countArgs, C]) (engine *workflow.Engine, stop func()) {
	t.Helper()
	logger := quietLogger()
	if logs != nil {
		logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	engine, err := workflow.New(pool, &workflow.Config{Lease: time.Second, Logger: logger})
	require.NoError(t, err)
	workers := river.NewWorkers()
	workflow.AddWorker(engine, workers, w)
	rc := &river.Config{
		Queues:            map[string]river.QueueConfig{"wf": {MaxWorkers: 2}},
		Workers:           workers,
		RetryPolicy:       fastRetry{},
		FetchCooldown:     5 * time.Millisecond,
		FetchPollInterval: 50 * time.Millisecond,
		Logger:            quietLogger(),
	}
	require.NoError(t, engine.Install(rc))
	client, err := river.NewClient(riverpgxv5.New(pool), rc)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	require.NoError(t, client.Start(ctx))
	var once sync.Once
	stop = func() {
		once.Do(func() {
			stopCtx, done := context.WithTimeout(context.Background(), 10*time.Second)
			defer done()
			_ = client.Stop(stopCtx)
			cancel()
		})
	}
	t.Cleanup(stop)
	return engine, stop
}

// committedMidway starts run key (50 items, 10 a step) and commits its first two steps by
// hand, as a worker of the given cursor version would have: items 0-19 written, cursor
// after them. No worker runs yet.
func committedMidway(t *testing.T, e *env, key, cursor string, version int) {
	t.Helper()
	ctx := context.Background()
	startRun(t, e, key, countArgs{Total: 50, Batch: 10, Table: "items"})
	_, err := e.pool.Exec(ctx, `UPDATE stepwise_checkpoint SET cursor = $2, cursor_version = $3, steps = 2 WHERE key = $1`, key, cursor, version)
	require.NoError(t, err)
	_, err = e.pool.Exec(ctx, `INSERT INTO items (run_key, n, token, pid) SELECT $1, g, 0, 0 FROM generate_series(0, 19) g`, key)
	require.NoError(t, err)
}

func releasesForVersion(t *testing.T, e *env, key string) int {
	return queryInt(t, e.pool, `SELECT count(*) FROM stepwise_event WHERE subject = $1 AND kind = 'run.release' AND detail->>'reason' = 'cursor_version'`, key)
}

// An old worker that meets a cursor newer than it reads releases the run untouched: no
// failure, no step error, no River attempt spent, no takeover, the lease free at once, the
// job snoozed; the run says what it waits for, the metric and the log say it too. A worker
// that reads the version then finishes the run, every item exactly once.
func TestOldWorkerReleasesNewerCursorUntouched(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, e := processEnv(t, time.Second, 200*time.Millisecond)
	const key = "deploy/newer"
	const cursor = `{"done": 20, "steps": 2}`
	committedMidway(t, e, key, cursor, 2)

	logs := &lockedBuffer{}
	oldEngine, stopOld := workerClient[countCursor](t, e.pool, logs, &countWorker{})
	deadline := time.Now().Add(30 * time.Second)
	for releasesForVersion(t, e, key) == 0 {
		require.True(t, time.Now().Before(deadline), "the old worker never released the run")
		time.Sleep(20 * time.Millisecond)
	}
	// Let River record the snooze before reading the job.
	var state string
	var attempt int
	var errs int
	require.Eventually(t, func() bool {
		run, err := workflow.GetRun(ctx, e.pool, key)
		require.NoError(t, err)
		require.NoError(t, e.pool.QueryRow(ctx, `SELECT state::text, attempt, coalesce(array_length(errors, 1), 0) FROM river_job WHERE id = $1`,
			*run.RiverJobID).Scan(&state, &attempt, &errs))
		return state == "scheduled" || state == "available"
	}, 10*time.Second, 20*time.Millisecond)
	run, err := workflow.GetRun(ctx, e.pool, key)
	require.NoError(t, err)
	t.Logf("run %s: %s; job %s, attempt %d", run.Status, run.Awaiting, state, attempt)
	require.NotNil(t, run.Awaiting, "the run says what it waits for")
	require.Equal(t, 2, run.Awaiting.CursorVersion)
	require.Contains(t, run.Awaiting.String(), "waiting for a worker that reads cursor version 2")
	require.Equal(t, workflow.RunStatusPending, run.Status, "never marked running by a worker that cannot read it")
	require.Zero(t, run.Failures, "no failure recorded")
	require.Nil(t, run.Retry, "not a retry")
	require.Nil(t, run.LastError)
	require.Zero(t, attempt, "the snooze gave River's attempt back")
	require.Zero(t, errs, "no error recorded on the job")
	st, err := e.engine.Checkpoints().Get(ctx, key)
	require.NoError(t, err)
	require.Nil(t, st.Owner, "the lease is released at once, not left to lapse")
	require.JSONEq(t, cursor, string(st.Cursor), "the cursor is untouched")
	require.Equal(t, 2, st.CursorVersion)
	require.EqualValues(t, 2, st.Steps, "no step committed")
	require.GreaterOrEqual(t, metricSum(t, oldEngine, "stepwise_cursor_version_releases_total"), 1.0)
	require.Equal(t, 1.0, metricSum(t, oldEngine, "stepwise_runs_awaiting_newer_worker"))
	require.Contains(t, logs.String(), "cursor_version=2 reads_cursor_version=1")
	require.Contains(t, logs.String(), "released untouched for a worker that reads it")

	// The old worker meets it again after the back-off; the wait keeps its start.
	deadline = time.Now().Add(30 * time.Second)
	for releasesForVersion(t, e, key) < 2 {
		require.True(t, time.Now().Before(deadline), "the old worker never met the run again")
		time.Sleep(20 * time.Millisecond)
	}
	again, err := workflow.GetRun(ctx, e.pool, key)
	require.NoError(t, err)
	require.NotNil(t, again.Awaiting)
	require.True(t, again.Awaiting.Since.Equal(run.Awaiting.Since), "the wait's start is kept across releases")
	stopOld()

	// A new worker reads it: the run finishes, nothing lost, nothing done twice.
	workerClient[countCursorV2](t, e.pool, nil, &countWorkerV2{})
	done := waitRun(t, e.pool, key, 30*time.Second, workflow.RunStatusSucceeded, workflow.RunStatusFailed)
	require.Equal(t, workflow.RunStatusSucceeded, done.Status, "last error: %s", deref(done.LastError))
	require.Nil(t, done.Awaiting)
	require.Zero(t, done.Failures)
	perN, _ := itemCounts(t, e.pool, "items", key)
	requireExactlyOnce(t, perN, 50)
	require.Zero(t, queryInt(t, e.pool, `SELECT count(*) FROM stepwise_event WHERE subject = $1 AND kind IN ('run.takeover', 'run.step_error')`, key))
	requireStrictlyIncreasing(t, claimTokens(t, e, key))
}

// A new worker that meets an older cursor upgrades it through its stepper, and its next
// step commits the cursor in the new version.
func TestNewWorkerUpgradesOlderCursor(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, e := processEnv(t, time.Second, 200*time.Millisecond)
	const key = "deploy/older"
	committedMidway(t, e, key, `{"next": 20}`, 1)

	workerClient[countCursorV2](t, e.pool, nil, &countWorkerV2{})
	run := waitRun(t, e.pool, key, 30*time.Second, workflow.RunStatusSucceeded, workflow.RunStatusFailed)
	require.Equal(t, workflow.RunStatusSucceeded, run.Status, "last error: %s", deref(run.LastError))
	perN, _ := itemCounts(t, e.pool, "items", key)
	requireExactlyOnce(t, perN, 50)
	st, err := e.engine.Checkpoints().Get(ctx, key)
	require.NoError(t, err)
	require.Equal(t, 2, st.CursorVersion, "committed in the new version")
	var c countCursorV2
	require.NoError(t, json.Unmarshal(st.Cursor, &c))
	require.Equal(t, countCursorV2{Done: 50, Steps: 3}, c, "the three steps of 10 after the upgraded cursor, counted by the new version")
}

// An older cursor the stepper cannot upgrade fails the run at once, naming both versions and
// the fix; the cursor and the work done stay as committed.
func TestOlderCursorWithoutUpgradeFailsNamingVersions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, e := processEnv(t, time.Second, 200*time.Millisecond)
	const key = "deploy/noupgrade"
	committedMidway(t, e, key, `{"next": 20}`, 1)

	workerClient[countCursorV2](t, e.pool, nil, &countWorkerV2{noUpgrade: true})
	run := waitRun(t, e.pool, key, 30*time.Second, workflow.RunStatusSucceeded, workflow.RunStatusFailed)
	require.Equal(t, workflow.RunStatusFailed, run.Status)
	msg := deref(run.LastError)
	t.Logf("last error: %s", msg)
	for _, want := range []string{"committed cursor is version 1", "reads version 2", "no upgrade from version 1", "UpgradeCursor", "RunResume", `{"next": 20}`} {
		require.Contains(t, msg, want)
	}
	perN, _ := itemCounts(t, e.pool, "items", key)
	require.Len(t, perN, 20, "nothing done past the committed cursor")
	st, err := e.engine.Checkpoints().Get(ctx, key)
	require.NoError(t, err)
	require.JSONEq(t, `{"next": 20}`, string(st.Cursor))
	require.Equal(t, 1, st.CursorVersion)
}

// A cursor whose shape changed without a new version fails as before, and the error says how
// to declare the change.
func TestSameVersionUndecodableCursorNamesTheFix(t *testing.T) {
	t.Parallel()
	_, e := processEnv(t, time.Second, 200*time.Millisecond)
	const key = "deploy/unversioned"
	committedMidway(t, e, key, `{"done": 20, "steps": 2}`, 1)

	workerClient[countCursor](t, e.pool, nil, &countWorker{})
	run := waitRun(t, e.pool, key, 30*time.Second, workflow.RunStatusSucceeded, workflow.RunStatusFailed)
	require.Equal(t, workflow.RunStatusFailed, run.Status)
	require.Contains(t, deref(run.LastError), "does not decode")
	require.Contains(t, deref(run.LastError), "declare a higher CursorVersion and an UpgradeCursor")
}

// A run cancelled while it waits for a newer worker is cancelled, not left waiting.
func TestCancelWhileAwaitingNewerWorker(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, e := processEnv(t, time.Second, 200*time.Millisecond)
	const key = "deploy/cancel"
	committedMidway(t, e, key, `{"done": 20, "steps": 2}`, 2)
	workerClient[countCursor](t, e.pool, nil, &countWorker{})
	deadline := time.Now().Add(30 * time.Second)
	for releasesForVersion(t, e, key) == 0 {
		require.True(t, time.Now().Before(deadline), "the old worker never released the run")
		time.Sleep(20 * time.Millisecond)
	}
	require.NoError(t, workflow.CancelRun(ctx, e.pool, key, "deploy rolled back"))
	run := waitRun(t, e.pool, key, 30*time.Second, workflow.RunStatusCancelled, workflow.RunStatusFailed, workflow.RunStatusSucceeded)
	require.Equal(t, workflow.RunStatusCancelled, run.Status)
	require.Nil(t, run.Awaiting, "a finished run waits for nothing")
	st, err := e.engine.Checkpoints().Get(ctx, key)
	require.NoError(t, err)
	require.Equal(t, 2, st.CursorVersion, "the cursor keeps its version")
}

type badVersion struct {
	countWorker
	v int
}

func (b *badVersion) CursorVersion() int { return b.v }

type badUpgrade struct{ countWorker }

func (badUpgrade) UpgradeCursor(from int, raw json.RawMessage) (countCursorV2, error) {
	return countCursorV2{}, nil
}

// Versioning mistakes are refused when the worker is added, not when a deploy meets them.
func TestAddWorkerRefusesBadCursorVersioning(t *testing.T) {
	t.Parallel()
	engine, err := workflow.New(mustPool(t, testkit.DBURL(t)), nil)
	require.NoError(t, err)
	err = workflow.AddWorkerSafely[countArgs, countCursor](engine, river.NewWorkers(), &badVersion{v: 0})
	require.ErrorContains(t, err, "CursorVersion() of *workflow_test.badVersion is 0; versions start at 1")
	err = workflow.AddWorkerSafely[countArgs, countCursor](engine, river.NewWorkers(), &badUpgrade{})
	require.ErrorContains(t, err, "has an UpgradeCursor method, but not UpgradeCursor(from int, raw json.RawMessage) (workflow_test.countCursor, error)")
	require.NoError(t, workflow.AddWorkerSafely[countArgs, countCursor](engine, river.NewWorkers(), &badVersion{v: 3}))
}

// metricSum is the sum of the samples of the engine's metric name (counters and gauges).
func metricSum(t *testing.T, engine *workflow.Engine, name string) float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	require.NoError(t, reg.Register(engine.Metrics()))
	families, err := reg.Gather()
	require.NoError(t, err)
	var sum float64
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return sum
}
