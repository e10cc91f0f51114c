package chaos

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/stepwise-go/stepwise/internal/workflow"
	"github.com/stepwise-go/stepwise/workflowtest"
)

// The "steps" workload of the long and sleepers profiles: runs of plain steps, no bank, so
// that what is judged is the run lifecycle alone (slices, takeovers, attempts, Sleep).

// stepsQueue is the River queue of the steps workload, stepsWorkers its workers per process.
const (
	stepsQueue   = "chaos_steps"
	stepsWorkers = 6
)

// LongArgs is a run of short steps that lives for Lifetime: with a Slice of 100-200 ms it
// lives hundreds of slices, far past River's MaxAttempts, and must still finish whatever the
// killer does. Its length is time, not steps, so that it lives as many slices on a fast
// machine as on a loaded one.
type LongArgs struct {
	Lifetime time.Duration `json:"lifetime"`
	// StepTime is how long each step works (a sleep inside its transaction).
	StepTime time.Duration `json:"step_time"`
}

// Kind is the River job kind.
func (LongArgs) Kind() string { return "chaos_long" }

// LongCursor counts the steps done since the run's first step began.
type LongCursor struct {
	Began time.Time `json:"began"`
	Done  int       `json:"done"`
}

type longWorker struct {
	workflow.StepperDefaults[LongArgs, LongCursor]
	slice time.Duration
}

func (w *longWorker) StepOptions() *workflow.StepOpts {
	return &workflow.StepOpts{Slice: w.slice}
}

func (w *longWorker) Step(ctx context.Context, s *workflow.Step[LongArgs, LongCursor]) (workflow.Next, error) {
	select {
	case <-ctx.Done():
		return workflow.Next{}, ctx.Err()
	case <-time.After(s.Args.StepTime):
	}
	if s.Cursor.Began.IsZero() {
		s.Cursor.Began = time.Now()
	}
	s.Cursor.Done++
	if time.Since(s.Cursor.Began) >= s.Args.Lifetime {
		return workflow.Done(), nil
	}
	return workflow.Continue(), nil
}

// SleeperArgs is a run whose first step works for Work and then sleeps For; it records when
// it woke. A first step longer than the lease is what makes the hand-back to River race with
// maintenance: the River job still looks started long ago and unleased until River records
// the snooze.
type SleeperArgs struct {
	For  time.Duration `json:"for"`
	Work time.Duration `json:"work"`
}

// Kind is the River job kind.
func (SleeperArgs) Kind() string { return "chaos_sleeper" }

// SleeperCursor records the sleep: a run that woke before SleptAt + For woke early.
type SleeperCursor struct {
	SleptAt time.Time  `json:"slept_at"`
	WokeAt  *time.Time `json:"woke_at,omitempty"`
}

type sleeperWorker struct {
	workflow.StepperDefaults[SleeperArgs, SleeperCursor]
}

func (sleeperWorker) Step(ctx context.Context, s *workflow.Step[SleeperArgs, SleeperCursor]) (workflow.Next, error) {
	if s.Cursor.SleptAt.IsZero() {
		// Work in the database, statement after statement, as a busy step does: a step idle
		// in its transaction for longer than StallTimeout would (rightly) be cut off.
		for end := time.Now().Add(s.Args.Work); time.Now().Before(end); {
			if _, err := s.Tx.Exec(ctx, `SELECT pg_sleep(0.25)`); err != nil {
				return workflow.Next{}, err
			}
		}
		s.Cursor.SleptAt = time.Now()
		return workflow.Sleep(s.Args.For), nil
	}
	now := time.Now()
	s.Cursor.WokeAt = &now
	return workflow.Done(), nil
}

// startSteps starts the long and sleeper runs of a steps workload.
func startSteps(ctx context.Context, pool *pgxpool.Pool, cfg *Config) error {
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		return err
	}
	opts := &workflow.StartOpts{InsertOpts: &river.InsertOpts{Queue: stepsQueue}}
	for i := range cfg.LongRuns {
		if _, err := workflow.Start(ctx, client, fmt.Sprintf("long-%03d", i), LongArgs{Lifetime: cfg.LongLifetime, StepTime: cfg.StepTime}, opts); err != nil {
			return fmt.Errorf("chaos: starting long run %d: %w", i, err)
		}
	}
	for i := range cfg.Sleepers {
		if _, err := workflow.Start(ctx, client, fmt.Sprintf("sleeper-%03d", i), SleeperArgs{For: cfg.SleepFor, Work: cfg.SleeperWork}, opts); err != nil {
			return fmt.Errorf("chaos: starting sleeper %d: %w", i, err)
		}
	}
	return nil
}

// stepsAtRest is true when every long run has finished and every sleeper has fallen asleep
// (or finished, which the sleeper check reports).
func stepsAtRest(ctx context.Context, pool *pgxpool.Pool) (bool, error) {
	var open int
	err := pool.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM stepwise_run WHERE workflow = 'chaos_long' AND status IN ('pending', 'running')) +
		(SELECT count(*) FROM stepwise_run r JOIN stepwise_checkpoint c USING (key)
		  WHERE r.workflow = 'chaos_sleeper' AND r.status IN ('pending', 'running') AND c.cursor->>'slept_at' IS NULL)`).Scan(&open)
	return err == nil && open == 0, err
}

// Names of the steps workload's own checks.
const (
	nameLongFinishes = "every long run finishes"
	nameNoEarlyWake  = "no sleeper wakes before its Sleep ends"
)

// stepsChecks are the steps workload's own invariants: every long run finished all its
// steps; no sleeper woke before its time.
func stepsChecks(ctx context.Context, pool *pgxpool.Pool) ([]workflowtest.Violation, error) {
	var out []workflowtest.Violation
	rows, err := pool.Query(ctx, `
		SELECT r.key, r.status, coalesce(r.last_error, ''), coalesce((c.cursor->>'done')::int, 0),
		       (SELECT count(*) FROM stepwise_event e WHERE e.subject = r.key AND e.kind = 'lease.claim')
		  FROM stepwise_run r JOIN stepwise_checkpoint c USING (key)
		 WHERE r.workflow = 'chaos_long' ORDER BY r.key`)
	if err != nil {
		return nil, fmt.Errorf("checking long runs: %w", err)
	}
	var key, status, lastErr string
	var done, claims int
	if _, err := pgx.ForEachRow(rows, []any{&key, &status, &lastErr, &done, &claims}, func() error {
		if workflow.RunStatus(status) != workflow.RunStatusSucceeded {
			out = append(out, workflowtest.Violation{Invariant: 5, Name: nameLongFinishes, Evidence: fmt.Sprintf(
				"long run %s ended %s after %d steps in %d slices (%s)", key, status, done, claims, lastErr)})
		}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("checking long runs: %w", err)
	}
	rows, err = pool.Query(ctx, `
		SELECT r.key, r.status, (c.cursor->>'slept_at')::timestamptz, (c.cursor->>'woke_at')::timestamptz,
		       (r.input->>'for')::bigint
		  FROM stepwise_run r JOIN stepwise_checkpoint c USING (key)
		 WHERE r.workflow = 'chaos_sleeper' AND c.cursor->>'woke_at' IS NOT NULL ORDER BY r.key`)
	if err != nil {
		return nil, fmt.Errorf("checking sleepers: %w", err)
	}
	var slept, woke time.Time
	var forNanos int64
	if _, err := pgx.ForEachRow(rows, []any{&key, &status, &slept, &woke, &forNanos}, func() error {
		if due := slept.Add(time.Duration(forNanos)); woke.Before(due) {
			out = append(out, workflowtest.Violation{Invariant: 5, Name: nameNoEarlyWake, Evidence: fmt.Sprintf(
				"sleeper %s slept at %s for %s and woke at %s, %s early (%s)",
				key, slept.UTC().Format("15:04:05.000"), time.Duration(forNanos), woke.UTC().Format("15:04:05.000"),
				due.Sub(woke).Round(time.Millisecond), status)})
		}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("checking sleepers: %w", err)
	}
	return out, nil
}

// workerID is the River client ID (and so the lease owner prefix) of a chaos worker process:
// the harness derives the same from the pid to tell which process held a run.
func workerID(pid int) string { return "chaos-w" + strconv.Itoa(pid) }

// stepsWorkerMain is one worker process of the steps workload.
func stepsWorkerMain(ctx context.Context, env map[string]string, lease time.Duration) error {
	slice, err := time.ParseDuration(env["CHAOS_SLICE"])
	if err != nil {
		return fmt.Errorf("CHAOS_SLICE: %w", err)
	}
	pcfg, err := pgxpool.ParseConfig(env["DATABASE_URL"])
	if err != nil {
		return err
	}
	// Enough connections for every step transaction of the queue plus heartbeats and River:
	// a starved pool would delay heartbeats and lose leases of healthy workers, which the
	// takeover check would then blame on Stepwise.
	pcfg.MaxConns = stepsWorkers + 6
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	engine, err := workflow.New(pool, &workflow.Config{Lease: lease, Logger: logger})
	if err != nil {
		return err
	}
	rc := &river.Config{
		ID:      workerID(os.Getpid()),
		Logger:  logger,
		Queues:  map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 2}, stepsQueue: {MaxWorkers: stepsWorkers}},
		Workers: river.NewWorkers(),
		// Snoozed slices are fetched again at the next poll: poll often so a run spends
		// its time in slices (where a kill lands) rather than waiting to be fetched.
		FetchPollInterval: 100 * time.Millisecond,
	}
	workflow.AddWorker(engine, rc.Workers, &longWorker{slice: slice})
	workflow.AddWorker(engine, rc.Workers, sleeperWorker{})
	if err := engine.Install(rc); err != nil {
		return err
	}
	client, err := river.NewClient(riverpgxv5.New(pool), rc)
	if err != nil {
		return err
	}
	if err := client.Start(ctx); err != nil {
		return err
	}
	// As in the settle workload: takeover must not wait for River's leader election.
	go func() { _ = engine.RunMaintenance(ctx, client) }()
	go watchStalls(ctx, os.Stdout)
	fmt.Println("ready")
	<-ctx.Done()
	stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	return client.Stop(stopCtx)
}
