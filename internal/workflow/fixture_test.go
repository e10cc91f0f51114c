package workflow_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"syscall"
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

// countArgs is the test workflow's input: insert rows n = 0..Total-1 into Table, Batch per step.
type countArgs struct {
	Total int    `json:"total"`
	Batch int    `json:"batch"`
	Table string `json:"table"`
}

func (countArgs) Kind() string { return "test_count" }

type countCursor struct {
	Next int `json:"next"`
}

// countWorker is a step function whose business writes are provable: every item is a row,
// so a duplicate or a loss shows up as a count.
type countWorker struct {
	workflow.StepperDefaults[countArgs, countCursor]
	// hook, when set, runs after the step's writes and before it returns; an error or panic
	// from it fails the step.
	hook func(ctx context.Context, s *workflow.Step[countArgs, countCursor]) error
	// next, when set and returning true, overrides what the step returns after its writes.
	next  func(s *workflow.Step[countArgs, countCursor]) (workflow.Next, bool)
	slice time.Duration
}

func (w *countWorker) StepOptions() *workflow.StepOpts {
	if w.slice == 0 {
		return nil
	}
	return &workflow.StepOpts{Slice: w.slice}
}

func (w *countWorker) Step(ctx context.Context, s *workflow.Step[countArgs, countCursor]) (workflow.Next, error) {
	fmt.Printf("step run=%s n=%d cursor=%d pid=%d token=%d\n", s.RunKey, s.Number, s.Cursor.Next, os.Getpid(), s.Token)
	if s.Cursor.Next >= s.Args.Total {
		return workflow.Done(), nil
	}
	end := min(s.Cursor.Next+s.Args.Batch, s.Args.Total)
	_, err := s.Tx.Exec(ctx, fmt.Sprintf(`INSERT INTO %s (run_key, n, token, pid)
		SELECT $1, g, $2, $3 FROM generate_series($4::int, $5::int - 1) g`, pgx.Identifier{s.Args.Table}.Sanitize()),
		s.RunKey, s.Token, os.Getpid(), s.Cursor.Next, end)
	if err != nil {
		return workflow.Next{}, err
	}
	if w.hook != nil {
		if err := w.hook(ctx, s); err != nil {
			return workflow.Next{}, err
		}
	}
	s.Cursor.Next = end
	if w.next != nil {
		if n, ok := w.next(s); ok {
			return n, nil
		}
	}
	if end >= s.Args.Total {
		return workflow.Done(), nil
	}
	return workflow.Continue(), nil
}

func createItems(t testing.TB, pool *pgxpool.Pool, table string, unique bool) {
	t.Helper()
	ddl := fmt.Sprintf(`CREATE TABLE %s (run_key text NOT NULL, n int NOT NULL, token bigint NOT NULL, pid int NOT NULL)`, table)
	if unique {
		ddl = fmt.Sprintf(`CREATE TABLE %s (run_key text NOT NULL, n int NOT NULL, token bigint NOT NULL, pid int NOT NULL, UNIQUE (run_key, n))`, table)
	}
	_, err := pool.Exec(context.Background(), ddl)
	require.NoError(t, err)
}

// fastRetry makes River retry failed steps after 50ms instead of its production backoff
// (attempt^4 seconds), so retry tests take milliseconds.
type fastRetry struct{}

func (fastRetry) NextRetry(*rivertype.JobRow) time.Time { return time.Now().Add(50 * time.Millisecond) }

type env struct {
	pool    *pgxpool.Pool
	engine  *workflow.Engine
	client  *river.Client[pgx.Tx]
	workers *river.Workers
}

func quietLogger() *slog.Logger {
	if os.Getenv("STEPWISE_TEST_VERBOSE") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// newEnv builds an engine and a started River client on pool, with w registered.
func newEnv(t testing.TB, pool *pgxpool.Pool, cfg *workflow.Config, w workflow.Stepper[countArgs, countCursor], queues map[string]river.QueueConfig) *env {
	t.Helper()
	if cfg == nil {
		cfg = &workflow.Config{}
	}
	if cfg.Logger == nil {
		cfg.Logger = quietLogger()
	}
	engine, err := workflow.New(pool, cfg)
	require.NoError(t, err)
	workers := river.NewWorkers()
	if w != nil {
		workflow.AddWorker(engine, workers, w)
	}
	if queues == nil {
		queues = map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 4}}
	}
	rc := &river.Config{
		Queues:            queues,
		Workers:           workers,
		RetryPolicy:       fastRetry{},
		FetchCooldown:     5 * time.Millisecond,
		FetchPollInterval: 50 * time.Millisecond,
		Logger:            quietLogger(),
	}
	if len(queues) == 0 {
		rc.Queues, rc.Workers = nil, nil
	} else {
		require.NoError(t, engine.Install(rc))
	}
	client, err := river.NewClient(riverpgxv5.New(pool), rc)
	require.NoError(t, err)
	if len(queues) > 0 {
		ctx, cancel := context.WithCancel(context.Background())
		require.NoError(t, client.Start(ctx))
		t.Cleanup(func() {
			stopCtx, stop := context.WithTimeout(context.Background(), 10*time.Second)
			defer stop()
			_ = client.Stop(stopCtx)
			cancel()
		})
	}
	return &env{pool: pool, engine: engine, client: client, workers: workers}
}

// waitRun waits until the run reaches one of the statuses, polling the database (the run's
// state there is the evidence we assert on).
func waitRun(t testing.TB, pool *pgxpool.Pool, key string, timeout time.Duration, statuses ...workflow.RunStatus) *workflow.Run {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		run, err := workflow.GetRun(context.Background(), pool, key)
		if errors.Is(err, workflow.ErrRunNotFound) && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond) // a job inserted with plain River creates its run when first worked
			continue
		}
		require.NoError(t, err)
		for _, s := range statuses {
			if run.Status == s {
				return run
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("run %q is %s after %s, want one of %v (last error: %v)", key, run.Status, timeout, statuses, deref(run.LastError))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// itemCounts returns how many rows each n has, and how many rows a pid wrote.
func itemCounts(t testing.TB, pool *pgxpool.Pool, table, key string) (perN map[int]int, perPid map[int]int) {
	t.Helper()
	rows, err := pool.Query(context.Background(), fmt.Sprintf("SELECT n, pid FROM %s WHERE run_key = $1", pgx.Identifier{table}.Sanitize()), key)
	require.NoError(t, err)
	perN, perPid = map[int]int{}, map[int]int{}
	for rows.Next() {
		var n, pid int
		require.NoError(t, rows.Scan(&n, &pid))
		perN[n]++
		perPid[pid]++
	}
	require.NoError(t, rows.Err())
	return perN, perPid
}

func requireExactlyOnce(t testing.TB, perN map[int]int, total int) {
	t.Helper()
	var missing, dup []int
	for n := 0; n < total; n++ {
		switch c := perN[n]; {
		case c == 0:
			missing = append(missing, n)
		case c > 1:
			dup = append(dup, n)
		}
	}
	require.Empty(t, missing, "items never processed")
	require.Empty(t, dup, "items processed more than once")
	require.Len(t, perN, total)
}

// runWorkerRole is a worker subprocess: a River client working queue "wf" with the count
// workflow, until killed. Its env configures lease and where to pause.
func runWorkerRole(ctx context.Context, envVars map[string]string) error {
	pool, err := pgxpool.New(ctx, envVars["STEPWISE_TEST_DB"])
	if err != nil {
		return err
	}
	defer pool.Close()
	leaseMS, _ := strconv.Atoi(envVars["LEASE_MS"])
	stallMS, _ := strconv.Atoi(envVars["STALL_MS"])
	stopAt, _ := strconv.Atoi(envVars["STOP_AT_STEP"])
	stepSleep, _ := time.ParseDuration(envVars["STEP_SLEEP"])
	maintMS, _ := strconv.Atoi(envVars["MAINTENANCE_MS"])
	sliceMS, _ := strconv.Atoi(envVars["SLICE_MS"])
	sleepAt, _ := strconv.Atoi(envVars["SLEEP_AT_STEP"])
	sleepFor, _ := time.ParseDuration(envVars["SLEEP_FOR"])
	engine, err := workflow.New(pool, &workflow.Config{
		Lease:               time.Duration(leaseMS) * time.Millisecond,
		MaintenanceInterval: time.Duration(maintMS) * time.Millisecond,
		StallTimeout:        time.Duration(stallMS) * time.Millisecond,
		Logger:              slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: logLevel(envVars)})),
	})
	if err != nil {
		return err
	}
	if envVars["DISABLE_FENCE"] == "1" {
		workflow.DisableFenceForTest(engine)
	}
	w := &countWorker{hook: func(ctx context.Context, s *workflow.Step[countArgs, countCursor]) error {
		if stepSleep > 0 {
			time.Sleep(stepSleep)
		}
		if stopAt > 0 && int(s.Number) == stopAt {
			// Freeze the whole process (heartbeat included) with uncommitted writes, as
			// a long GC pause or a frozen VM would; the test SIGCONTs it later.
			fmt.Printf("pausing run=%s step=%d pid=%d\n", s.RunKey, s.Number, os.Getpid())
			stoppedAt := time.Now()
			_ = syscall.Kill(os.Getpid(), syscall.SIGSTOP)
			// The stop lands asynchronously in a multi-threaded process: do not run on
			// past this point before it has.
			time.Sleep(100 * time.Millisecond)
			fmt.Printf("resumed pid=%d after %s\n", os.Getpid(), time.Since(stoppedAt).Round(time.Millisecond))
		}
		return nil
	}}
	w.slice = time.Duration(sliceMS) * time.Millisecond
	if sleepAt > 0 {
		w.next = func(s *workflow.Step[countArgs, countCursor]) (workflow.Next, bool) {
			if int(s.Number) != sleepAt {
				return workflow.Next{}, false
			}
			fmt.Printf("sleeping run=%s step=%d for=%s pid=%d\n", s.RunKey, s.Number, sleepFor, os.Getpid())
			return workflow.Sleep(sleepFor), true
		}
	}
	workers := river.NewWorkers()
	if envVars["CURSOR_V2"] == "1" {
		// The next release of the count workflow: its cursor changed shape (version 2).
		workflow.AddWorker(engine, workers, &countWorkerV2{stepSleep: stepSleep, slice: w.slice})
	} else {
		workflow.AddWorker(engine, workers, w)
	}
	if envVars["WAIT_DRILL"] == "1" {
		// Drill 10's workflow (parents, children, signal waiters) beside the count workflow.
		workflow.AddWorker(engine, workers, &waitDrillWorker{stepSleep: stepSleep})
	}
	// WF_MAX_WORKERS sizes the queue for a drill whose runs are woken in bursts (2 by default).
	maxWorkers := 2
	if n, err := strconv.Atoi(envVars["WF_MAX_WORKERS"]); err == nil && n > 0 {
		maxWorkers = n
	}
	rc := &river.Config{
		Queues:            map[string]river.QueueConfig{"wf": {MaxWorkers: maxWorkers}},
		Workers:           workers,
		FetchCooldown:     5 * time.Millisecond,
		FetchPollInterval: 50 * time.Millisecond,
		RetryPolicy:       fastRetry{},
		Logger:            slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	if envVars["WAIT_PAYOUT"] == "1" {
		// Drill 11's workflow and the outbox delivering its payouts.
		if err := wpWorkerRole(pool, envVars, engine, rc, stepSleep); err != nil {
			return err
		}
	}
	if envVars["WITH_MAINTENANCE"] == "1" {
		if err := engine.Install(rc); err != nil {
			return err
		}
	}
	client, err := river.NewClient(riverpgxv5.New(pool), rc)
	if err != nil {
		return err
	}
	// SIGTERM (ctx) drains, as a service does (docs/design.md, *Draining*): the client runs
	// on a context SIGTERM does not cancel, since cancelling it is River's hard stop, which
	// cancels the step in flight instead of letting it commit.
	if err := client.Start(context.WithoutCancel(ctx)); err != nil {
		return err
	}
	if envVars["MAINTAIN_EVERYWHERE"] == "1" {
		go func() { _ = engine.RunMaintenance(ctx, client) }()
	}
	fmt.Printf("ready pid=%d\n", os.Getpid())
	<-ctx.Done()
	engine.Quiesce()
	stopCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := client.Stop(stopCtx); err != nil {
		if !errors.Is(err, context.DeadlineExceeded) {
			return err
		}
		hardCtx, cancelHard := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancelHard()
		_ = client.StopAndCancel(hardCtx)
	}
	return nil
}

// logLevel is the worker role's log level: warnings, or everything from INFO with LOG_INFO=1.
func logLevel(envVars map[string]string) slog.Level {
	if envVars["LOG_INFO"] == "1" {
		return slog.LevelInfo
	}
	return slog.LevelWarn
}

// processEnv is the parent side of a process test: a database of its own (url, for the
// children's workerEnv), an env on it with lease and no River workers of its own, the
// "items" table, and maintenance every maintainEvery (0: none).
func processEnv(t testing.TB, lease, maintainEvery time.Duration) (url string, e *env) {
	t.Helper()
	url = testkit.DBURL(t)
	e = newEnv(t, mustPool(t, url), &workflow.Config{Lease: lease}, nil, map[string]river.QueueConfig{})
	createItems(t, e.pool, "items", true)
	if maintainEvery > 0 {
		maintainLoop(t, e, maintainEvery)
	}
	return url, e
}

// maintainLoop runs the engine's maintenance pass every interval from this (surviving)
// process, standing in for River's leader while worker processes are being killed.
func maintainLoop(t testing.TB, e *env, interval time.Duration) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		ticker := time.NewTicker(interval)
		defer ticker.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-ticker.C:
				if _, err := e.engine.Maintain(ctx, e.client); err != nil && ctx.Err() == nil {
					t.Logf("maintain: %v", err)
				}
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
}

var _ = testkit.DB

func testkitPool(p interface{}) *pgxpool.Pool { return p.(*pgxpool.Pool) }

func riverDriver(p *pgxpool.Pool) *riverpgxv5.Driver { return riverpgxv5.New(p) }

func mustPool(t testing.TB, url string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), url)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

func queryInt(t testing.TB, pool *pgxpool.Pool, sql string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), sql, args...).Scan(&n))
	return n
}

// resumeSeen resumes key as a person who read its version seen: workflow.ResumeTx in a
// transaction of its own, which is what stepwise.Client.RunResume does.
func resumeSeen(ctx context.Context, pool *pgxpool.Pool, client *river.Client[pgx.Tx], key string, seen int64, actor, reason string) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := workflow.ResumeTx(ctx, client, tx, key, seen, actor, reason)
		return err
	})
}

// resumeNow resumes key at the version it has now, as a script deciding on what it reads
// does: the read and the resume in one transaction.
func resumeNow(ctx context.Context, pool *pgxpool.Pool, client *river.Client[pgx.Tx], key, actor, reason string) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		run, err := workflow.GetRun(ctx, tx, key)
		if err != nil {
			return err
		}
		_, err = workflow.ResumeTx(ctx, client, tx, key, run.Version, actor, reason)
		return err
	})
}
