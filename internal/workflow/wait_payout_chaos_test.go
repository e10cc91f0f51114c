package workflow_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/internal/outbox"
	"github.com/stepwise-go/stepwise/internal/reconcile"
	"github.com/stepwise-go/stepwise/internal/testkit"
	"github.com/stepwise-go/stepwise/internal/workflow"
	"github.com/stepwise-go/stepwise/stepwisetype"
	"github.com/stepwise-go/stepwise/workflowtest"
	"github.com/stepwise-go/stepwise/workflowtest/fakebank"
)

// Drill 11: runs that pay out through the outbox and wait for their payouts
// (WaitForOperations), while workers are killed -9 and frozen, against a bank that does not
// deduplicate (fakebank Strict) and sometimes answers only after the sender's timeout
// (DelayAfterApply), or with a 5xx after applying, so that payouts become UNKNOWN_EXTERNAL and
// the reconciler settles them by lookup.

const wpKind = "test_wait_payout"

// Delivery timings: the send's timeout is short and the bank's late answers come after it;
// the outbox lease is its minimum, over three times the timeout (a killed sender's payouts go UNKNOWN_EXTERNAL after
// it); the reconciler believes a not-found only after Grace (above the send timeout) and
// checks again every wpCheckBackoff.
const (
	wpSendTimeout  = 300 * time.Millisecond
	wpBankDelay    = 700 * time.Millisecond
	wpOutboxLease  = time.Second
	wpGrace        = time.Second
	wpCheckBackoff = 300 * time.Millisecond
	wpReconcile    = time.Second            // the test process's reconciliation interval (River's minimum period)
	wpArrival      = 400 * time.Millisecond // between two runs' starts
)

// wpArgs drive wpWorker: step 1 enqueues Payouts payouts (the first Declined to a closed
// account: the bank declines them, FAILED_PERMANENT) and waits for them; the step after the
// wait records what it saw; a closing step finishes the run.
type wpArgs struct {
	Payouts  int `json:"payouts"`
	Declined int `json:"declined,omitempty"`
}

func (wpArgs) Kind() string { return "test_wait_payout" }

type wpCursor struct {
	Phase int `json:"phase"`
}

type wpWorker struct {
	workflow.StepperDefaults[wpArgs, wpCursor]
	stepSleep time.Duration
}

func (w *wpWorker) Step(ctx context.Context, s *workflow.Step[wpArgs, wpCursor]) (workflow.Next, error) {
	fmt.Printf("step run=%s n=%d phase=%d pid=%d token=%d\n", s.RunKey, s.Number, s.Cursor.Phase, os.Getpid(), s.Token)
	switch s.Cursor.Phase {
	case 0:
		time.Sleep(w.stepSleep)
		ops := make([]outbox.EnqueueParams, s.Args.Payouts)
		for i := range ops {
			account := fmt.Sprintf("acct-%s-%d", s.RunKey, i)
			if i < s.Args.Declined {
				account = "closed-" + account
			}
			payload, err := json.Marshal(fakebank.Payload{Account: account})
			if err != nil {
				return workflow.Next{}, err
			}
			ops[i] = outbox.EnqueueParams{Kind: wpKind, BusinessKey: fmt.Sprintf("%s/%d", s.RunKey, i), Payload: payload,
				Amount: int64(100 + i), Currency: "EUR"}
		}
		if _, err := outbox.Enqueue(ctx, s.Tx, ops...); err != nil {
			return workflow.Next{}, err
		}
		s.Cursor.Phase = 1
		return workflow.WaitForOperations(waitDrillTimeout), nil
	case 1:
		// The step after the wait: what Woken said, what the database says of the run's
		// operations in this step's own transaction, and the database's clock.
		raw, err := json.Marshal(s.Woken())
		if err != nil {
			return workflow.Next{}, err
		}
		if _, err := s.Tx.Exec(ctx, `INSERT INTO wp_log (run_key, woken, step_at, not_at_rest, token, pid)
			SELECT $1, $2, clock_timestamp(), count(*) FILTER (WHERE state NOT IN ('SUCCEEDED', 'FAILED_PERMANENT')), $3, $4
			  FROM stepwise_operation WHERE run_key = $1`, s.RunKey, raw, s.Token, os.Getpid()); err != nil {
			return workflow.Next{}, err
		}
		time.Sleep(w.stepSleep)
		s.Cursor.Phase = 2
		return workflow.Continue(), nil
	default:
		// The closing step: it must run once, after the wait's step.
		if _, err := s.Tx.Exec(ctx, `INSERT INTO wp_closed (run_key, token, pid) VALUES ($1, $2, $3)`, s.RunKey, s.Token, os.Getpid()); err != nil {
			return workflow.Next{}, err
		}
		return workflow.Done(), nil
	}
}

// wpOutbox is the outbox of the drill's payouts against the bank at url, in the worker
// processes (which deliver) and in the test process (whose reconciler needs it).
// blindResend makes the sender resend a payment whose answer it did not get (a timeout, a
// 5xx), once, under the same key: the classic "retry on timeout" that a deduplicating bank
// hides and this one pays twice.
func wpOutbox(pool outbox.DB, url, id string, logger *slog.Logger, blindResend bool) (*outbox.Outbox, error) {
	// The client's own timeout stays above the send's: the outbox's Timeout is the one that
	// cuts a late answer.
	client := fakebank.NewClient(url, &http.Client{Timeout: 10 * time.Second})
	var sender outbox.Sender = fakebank.Sender{Client: client}
	if blindResend {
		sender = outbox.SendFunc(func(ctx context.Context, op *outbox.Operation) (outbox.Receipt, error) {
			r, err := fakebank.Sender{Client: client}.Send(ctx, op)
			if err != nil && !outbox.IsNotSent(err) && !outbox.IsPermanent(err) {
				again, cancel := context.WithTimeout(context.WithoutCancel(ctx), wpSendTimeout)
				defer cancel()
				return fakebank.Sender{Client: client}.Send(again, op)
			}
			return r, err
		})
	}
	return outbox.New(pool, &outbox.Config{ID: id, Logger: logger, DispatcherLease: 2 * time.Second, Kinds: map[string]*outbox.KindConfig{
		wpKind: {Sender: sender, Timeout: wpSendTimeout, Lease: wpOutboxLease, BatchSize: 20, Concurrency: 8,
			MaxAttempts: -1, RetryBackoff: func(int) time.Duration { return 200 * time.Millisecond }},
	}})
}

// wpWorkerRole adds the drill's workflow and its outbox to a worker process (WAIT_PAYOUT=1).
func wpWorkerRole(pool outbox.DB, envVars map[string]string, engine *workflow.Engine, rc *river.Config, stepSleep time.Duration) error {
	workflow.AddWorker(engine, rc.Workers, &wpWorker{stepSleep: stepSleep})
	ob, err := wpOutbox(pool, envVars["BANK_URL"], fmt.Sprintf("worker/%d", os.Getpid()), slog.New(slog.DiscardHandler), envVars["BLIND_RESEND"] == "1")
	if err != nil {
		return err
	}
	if err := ob.Install(rc); err != nil {
		return err
	}
	return ob.Register(context.Background())
}

func createWPTables(t testing.TB, e *env) {
	t.Helper()
	_, err := e.pool.Exec(context.Background(), `
		CREATE TABLE wp_log (run_key text NOT NULL, woken jsonb NOT NULL, step_at timestamptz NOT NULL, not_at_rest int NOT NULL, token bigint NOT NULL, pid int NOT NULL);
		CREATE TABLE wp_closed (run_key text NOT NULL, token bigint NOT NULL, pid int NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())`)
	require.NoError(t, err)
}

// wpSize is the drill's size: runs, payouts per run, and how long the killer works.
// STEPWISE_WAIT_PAYOUT_RUNS raises it (the CI size is 12 runs of 6 payouts, 10 s of kills).
func wpSize(t *testing.T) (runs, payouts int, chaos time.Duration) {
	runs, payouts, chaos = 12, 6, 10*time.Second
	if s := os.Getenv("STEPWISE_WAIT_PAYOUT_RUNS"); s != "" {
		n, err := strconv.Atoi(s)
		require.NoError(t, err, "STEPWISE_WAIT_PAYOUT_RUNS")
		runs, chaos = n, time.Duration(max(10, n))*time.Second
	}
	return runs, payouts, chaos
}

type wpReport struct {
	chaos      *workflowtest.ChaosReport
	wakes      workflowtest.WakeStats
	violations []workflowtest.Violation
	payouts    int
	requests   int
	unknown    int            // payouts that were UNKNOWN_EXTERNAL at least once
	lookups    int            // reconciler lookups
	states     map[string]int // payouts by final state
	faults     map[string]int // bank faults drawn
	settleMax  time.Duration  // longest UNKNOWN_EXTERNAL to at rest
}

// wpDrill runs the drill: the runs on 3 worker subprocesses (each delivering payouts too),
// killed at random every 300-900 ms and every 3rd hit frozen past its lease; the test
// process keeps the bank, the engine's and the outbox's maintenance, and the reconciler.
func wpDrill(t *testing.T, seed uint64, blindResend bool) *wpReport {
	url := testkit.DBURL(t)
	const lease, maintEvery = time.Second, 250 * time.Millisecond
	e := newEnv(t, mustPool(t, url), &workflow.Config{Lease: lease}, nil, map[string]river.QueueConfig{})
	createWPTables(t, e)
	ctx := context.Background()
	runs, payouts, chaosFor := wpSize(t)

	bank := fakebank.New(&fakebank.Config{Strict: true, Delay: wpBankDelay, Seed: seed | 1, Faults: fakebank.Mix{
		DelayAfterApply: 0.25, Error5xxAfterApply: 0.05, Error5xxBeforeApply: 0.05, DropAfterApply: 0.05, RefuseBeforeApply: 0.05}})
	require.NoError(t, bank.Start())
	t.Cleanup(func() { _ = bank.Close() })

	ob, err := wpOutbox(e.pool, bank.URL(), "test", quietLogger(), false)
	require.NoError(t, err)
	require.NoError(t, ob.Register(ctx))
	rec, err := reconcile.New(e.pool, &reconcile.Config{Outbox: ob, Logger: quietLogger(), Interval: wpReconcile, Kinds: map[string]*reconcile.KindConfig{
		wpKind: {Checker: fakebank.Checker{Client: fakebank.NewClient(bank.URL(), nil)}, Grace: wpGrace, Timeout: 2 * time.Second,
			CheckBackoff: func(int) time.Duration { return wpCheckBackoff }},
	}})
	require.NoError(t, err)
	// The survivors' loops: the engine's maintenance (takeovers, the wait backstop), the
	// outbox's poll (expired leases of killed senders to UNKNOWN_EXTERNAL, dispatchers for
	// due payouts) and reconciliation, as River's leader would run them.
	maintainLoop(t, e, maintEvery)
	loopCtx, stopLoops := context.WithCancel(ctx)
	loopsDone := make(chan struct{}, 2)
	// Read while the reconciler's loop may still run (the loops stop at cleanup): atomic.
	var lookups atomic.Int64
	go func() {
		defer func() { loopsDone <- struct{}{} }()
		for loopCtx.Err() == nil {
			if err := ob.Maintain(loopCtx, e.client); err != nil && loopCtx.Err() == nil {
				t.Logf("outbox poll: %v", err)
			}
			sleepCtx(loopCtx, maintEvery)
		}
	}()
	go func() {
		defer func() { loopsDone <- struct{}{} }()
		for loopCtx.Err() == nil {
			res, err := rec.RunOnce(loopCtx, nil)
			if err != nil && loopCtx.Err() == nil {
				t.Logf("reconcile: %v", err)
			}
			if res != nil {
				lookups.Add(int64(res.Checked))
			}
			sleepCtx(loopCtx, wpReconcile)
		}
	}()
	t.Cleanup(func() { stopLoops(); <-loopsDone; <-loopsDone })

	// Runs arrive one every wpArrival, as a day's work does, so the work spans the chaos on
	// any machine: started all at once, 12 runs finished in 4.3 s on a fast CI machine, before
	// the killer's fourth kill (one hit each 300-900 ms, every third a freeze), and the drill
	// proved less than it claims. Until holds the chaos until the last run has started.
	var started atomic.Int64
	startErr := make(chan error, 1)
	go func() {
		defer close(startErr)
		for i := range runs {
			if i > 0 {
				time.Sleep(wpArrival)
			}
			_, err := workflow.Start(ctx, e.client, fmt.Sprintf("wp/%02d", i), wpArgs{Payouts: payouts, Declined: i % 3},
				&workflow.StartOpts{InsertOpts: &river.InsertOpts{Queue: "wf", MaxAttempts: 100}})
			if err != nil {
				startErr <- fmt.Errorf("starting run wp/%02d: %w", i, err)
				return
			}
			started.Add(1)
		}
	}()

	// A settling batch (the dispatcher's recorder, a reconciler pass) wakes many runs in one
	// commit: the workers have a slot for about each run, so that the lateness bound judges
	// the wake, not a queue of woken runs behind 6 slots (measured at 30 runs with 2 slots a
	// process: woken runs waited up to 12 s for a slot, no takeover, no freeze).
	env := workerEnv(url, lease, 10*time.Second, "STEP_SLEEP=100ms", "WAIT_PAYOUT=1", "BANK_URL="+bank.URL(),
		fmt.Sprintf("WF_MAX_WORKERS=%d", runs/3+2))
	if blindResend {
		env = append(env, "BLIND_RESEND=1")
	}
	report, err := workflowtest.RunChaos(ctx, &workflowtest.ChaosConfig{
		Start:     func() (workflowtest.Worker, error) { return workflowtest.Start(t, "wf-worker", env...), nil },
		Workers:   3,
		Seed:      seed,
		KillMin:   300 * time.Millisecond,
		KillMax:   900 * time.Millisecond,
		StopEvery: 3,
		StopFor:   2500 * time.Millisecond,
		Duration:  chaosFor,
		Until: func(ctx context.Context) (bool, error) {
			if started.Load() < int64(runs) {
				return false, nil
			}
			var open int
			err := e.pool.QueryRow(ctx, `SELECT count(*) FROM stepwise_run WHERE status IN ('pending', 'running')`).Scan(&open)
			return open == 0, err
		},
		QuietTimeout: 40 * time.Second,
		Logf:         t.Logf,
	})
	require.NoError(t, err)
	require.NoError(t, <-startErr)
	stopLoops()
	rep := &wpReport{chaos: report, payouts: runs * payouts}
	if !report.Quiet {
		rep.violations = append(rep.violations, workflowtest.Violation{Invariant: 5, Name: "every run finishes", Evidence: fmt.Sprint(report.QuietErr)})
	}

	wakes, early := loadWPWakes(t, e, payouts, report.Workers)
	bound := wpBound(lease, maintEvery)
	stats, vs := workflowtest.CheckWakes(wakes, bound)
	rep.wakes = stats
	rep.violations = append(rep.violations, vs...)
	rep.violations = append(rep.violations, early...)

	log := bank.Requests()
	rep.requests = len(log)
	rep.violations = append(rep.violations, wpBankChecks(t, e, bank, log)...)
	more, err := workflowtest.CheckInvariants(ctx, e.pool, &workflowtest.CheckOpts{
		Quiet:    report.Quiet,
		Requests: bankLog(log),
		Grace:    wpGrace,
		Liveness: unleasedPause(report.Liveness(lease+maintEvery+2*time.Second, 100), lease),
		Domain: []workflowtest.CheckFunc{workflowtest.CheckWaitTables, func(ctx context.Context, q stepwisetype.DBTX) ([]workflowtest.Violation, error) {
			return wpDomain(ctx, q, runs)
		}},
	})
	require.NoError(t, err)
	rep.violations = append(rep.violations, more...)

	rep.states = map[string]int{}
	rows, err := e.pool.Query(ctx, `SELECT state, count(*)::int FROM stepwise_operation GROUP BY state`)
	require.NoError(t, err)
	var st string
	var n int
	_, err = pgx.ForEachRow(rows, []any{&st, &n}, func() error { rep.states[st] = n; return nil })
	require.NoError(t, err)
	var settle float64
	require.NoError(t, e.pool.QueryRow(ctx, `
		SELECT count(DISTINCT u.subject)::int, coalesce(max(extract(epoch FROM r.at - u.at)), 0)
		  FROM stepwise_event u
		  LEFT JOIN LATERAL (SELECT min(at) AS at FROM stepwise_event r WHERE r.subject = u.subject AND r.kind = 'op.transition'
		                       AND r.to_state IN ('SUCCEEDED', 'FAILED_PERMANENT') AND r.at >= u.at) r ON true
		 WHERE u.kind = 'op.transition' AND u.to_state = 'UNKNOWN_EXTERNAL'`).Scan(&rep.unknown, &settle))
	rep.settleMax = time.Duration(settle * float64(time.Second))
	rep.lookups = int(lookups.Load())
	rep.faults = map[string]int{}
	for _, r := range log {
		rep.faults[r.Fault.String()]++
	}
	var takeovers, byMaint int
	require.NoError(t, e.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE kind = 'run.takeover'),
		count(*) FILTER (WHERE kind = 'run.wake' AND actor = 'maintenance') FROM stepwise_event`).Scan(&takeovers, &byMaint))
	t.Logf("wait payout drill: %s; %d runs, %d payouts %v, %d bank requests (faults %v), %d payouts UNKNOWN_EXTERNAL at least once (longest to at rest: %s), %d lookups",
		report, runs, rep.payouts, rep.states, rep.requests, rep.faults, rep.unknown, rep.settleMax.Round(time.Millisecond), rep.lookups)
	t.Logf("wait payout drill wakes: %s (bound %s); %d takeovers, %d wakes by maintenance, %d violations", stats, bound, takeovers, byMaint, len(rep.violations))
	return rep
}

// wpBound is how long a run may sleep with its payouts at rest: drill 10's bound (lease +
// maintenance interval + 2 s) plus 2 s, since a settling batch (the dispatcher's recorder, a
// reconciler pass) wakes several runs in one commit, each then fetched and claimed by
// workers that share 2 cores with the other drills: measured 3.28-3.83 s with no takeover or
// freeze at load 22, the two drill 11 tests at once. The wake itself is judged tightly
// apart: each run is woken in a transaction that put one of its payouts at rest (its
// run.wake event carries that transaction's now(); the last payout to come to rest by
// commit may have the earlier start).
func wpBound(lease, maintEvery time.Duration) time.Duration {
	return waitDrillBound(lease, maintEvery) + 2*time.Second
}

func sleepCtx(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// bankLog turns the bank's request log into what CheckInvariants checks the send discipline on.
func bankLog(log []fakebank.Request) []workflowtest.Request {
	out := make([]workflowtest.Request, 0, len(log))
	for _, r := range log {
		out = append(out, workflowtest.Request{OperationID: r.OperationID, Amount: r.Amount,
			Arrived: r.Arrived, Decided: r.Decided, Ended: r.Ended(), Effect: r.Effect})
	}
	return out
}

// wpBankChecks: at most one effect (payment or decline) per operation in the bank's own
// request log (the bank does not deduplicate: a second send is a second payment), and each
// payout the ledger says SUCCEEDED paid exactly once.
func wpBankChecks(t *testing.T, e *env, bank *fakebank.Bank, log []fakebank.Request) []workflowtest.Violation {
	effects := map[string]int{}
	for _, r := range log {
		if r.Effect {
			effects[r.OperationID]++
		}
	}
	var out []workflowtest.Violation
	for id, n := range effects {
		if n > 1 {
			out = append(out, workflowtest.Violation{Invariant: 3, Name: "no payout sent twice to the bank", Evidence: fmt.Sprintf(
				"operation %s: %d effects at the bank; requests: %+v", id, n, fakebank.RequestsFor(log, id))})
		}
	}
	rows, err := e.pool.Query(context.Background(), `SELECT operation_id::text FROM stepwise_operation WHERE state = 'SUCCEEDED'`)
	require.NoError(t, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	for _, id := range ids {
		if n := bank.Effects(id); n != 1 {
			out = append(out, workflowtest.Violation{Invariant: 3, Name: "each SUCCEEDED payout paid exactly once", Evidence: fmt.Sprintf(
				"operation %s is SUCCEEDED, the bank applied it %d times", id, n)})
		}
	}
	return out
}

// loadWPWakes reads what each step after a wait recorded and judges it against the ledger:
// woken with every operation at rest (in its own transaction, in what Woken counted, and
// after the transition that put the last one at rest). A wake's SatisfiedAt is that last
// transition's time (its transaction's start: no later than its commit, so the asleep time
// is, if anything, overstated).
func loadWPWakes(t *testing.T, e *env, payouts int, workers []workflowtest.WorkerLife) ([]workflowtest.Wake, []workflowtest.Violation) {
	ctx := context.Background()
	paused := map[int][]workflowtest.Interval{}
	for _, w := range workers {
		paused[w.Pid] = append(paused[w.Pid], w.Paused...)
	}
	rows, err := e.pool.Query(ctx, `SELECT l.run_key, l.woken, l.step_at, l.not_at_rest, l.pid,
		(SELECT count(*)::int FROM stepwise_operation o WHERE o.run_key = l.run_key),
		(SELECT max(ev.at) FROM stepwise_operation o JOIN stepwise_event ev ON ev.subject = 'op:' || o.operation_id::text
		  WHERE o.run_key = l.run_key AND ev.kind = 'op.transition' AND ev.to_state IN ('SUCCEEDED', 'FAILED_PERMANENT')),
		(SELECT count(*)::int FROM stepwise_operation o WHERE o.run_key = l.run_key AND NOT EXISTS (
		  SELECT 1 FROM stepwise_event ev WHERE ev.subject = 'op:' || o.operation_id::text AND ev.kind = 'op.transition'
		     AND ev.to_state IN ('SUCCEEDED', 'FAILED_PERMANENT') AND ev.at <= l.step_at)),
		coalesce((SELECT array_agg(at ORDER BY at) FROM stepwise_event t WHERE t.subject = l.run_key AND t.kind = 'run.takeover' AND t.at <= l.step_at), '{}'),
		coalesce((SELECT string_agg(format('%s by %s', w.at, w.actor), ', ' ORDER BY w.id) FROM stepwise_event w WHERE w.subject = l.run_key AND w.kind = 'run.wake'), 'none'),
		EXISTS (SELECT 1 FROM stepwise_event w WHERE w.subject = l.run_key AND w.kind = 'run.wake' AND w.actor <> 'maintenance'
		          AND w.at IN (SELECT ev.at FROM stepwise_operation o JOIN stepwise_event ev ON ev.subject = 'op:' || o.operation_id::text
		                        WHERE o.run_key = l.run_key AND ev.kind = 'op.transition' AND ev.to_state IN ('SUCCEEDED', 'FAILED_PERMANENT')))
		FROM wp_log l ORDER BY l.run_key`)
	require.NoError(t, err)
	var (
		key            string
		raw            []byte
		stepAt         time.Time
		notAtRest, pid int
		ops, restLate  int
		lastRest       *time.Time
		takeovers      []time.Time
		wakeEvents     string
		sameTx         bool
	)
	var wakes []workflowtest.Wake
	var vs []workflowtest.Violation
	early := func(format string, args ...any) {
		vs = append(vs, workflowtest.Violation{Invariant: 2, Name: "no run woken before all its operations are at rest", Evidence: fmt.Sprintf(format, args...)})
	}
	_, err = pgx.ForEachRow(rows, []any{&key, &raw, &stepAt, &notAtRest, &pid, &ops, &lastRest, &restLate, &takeovers, &wakeEvents, &sameTx}, func() error {
		var wk workflow.Woken
		if err := json.Unmarshal(raw, &wk); err != nil {
			return err
		}
		counted := 0
		for st, n := range wk.Operations {
			counted += n
			if st != string(outbox.StateSucceeded) && st != string(outbox.StateFailedPermanent) {
				early("run %s: Woken counted %d operations %s", key, n, st)
			}
		}
		switch {
		case wk.Kind != workflow.WaitOperations:
			early("run %s: woken from a %q wait", key, wk.Kind)
		case notAtRest > 0:
			early("run %s: its step after the wait saw %d operations not at rest in its own transaction", key, notAtRest)
		case ops != payouts || counted != payouts:
			early("run %s: %d operations in the ledger, Woken counted %d, want %d", key, ops, counted, payouts)
		case restLate > 0 || lastRest == nil:
			early("run %s: step after the wait at %s, %d of its operations came to rest only later", key, stamp(stepAt), restLate)
		}
		if !sameTx {
			vs = append(vs, workflowtest.Violation{Invariant: 5, Name: "each run woken by a commit that put one of its payouts at rest", Evidence: fmt.Sprintf(
				"run %s: last payout at rest at %v (transaction start), its wakes: %s", key, lastRest, wakeEvents)})
		}
		w := workflowtest.Wake{Run: key, StepAt: stepAt, TimedOut: wk.TimedOut, Takeovers: takeovers, Paused: paused[pid]}
		w.SatisfiedAt = wk.Since
		if lastRest != nil {
			w.SatisfiedAt = maxTime(wk.Since, *lastRest)
		}
		wakes = append(wakes, w)
		return nil
	})
	require.NoError(t, err)
	return wakes, vs
}

// wpDomain: every run succeeded, its wait's step and its closing step each ran once, in that
// order.
func wpDomain(ctx context.Context, q stepwisetype.DBTX, runs int) ([]workflowtest.Violation, error) {
	checks := []drillCheck{
		{"every run completes", `SELECT format('run %s is %s: %s', key, status, coalesce(last_error, ''))
			FROM stepwise_run WHERE key LIKE 'wp/%' AND status <> 'succeeded' ORDER BY key`},
		{"every run started", fmt.Sprintf(`SELECT format('%%s runs, want %%s', count(*), %d) FROM stepwise_run WHERE key LIKE 'wp/%%%%' HAVING count(*) <> %d`, runs, runs)},
		{"the step after each wait ran once", `SELECT format('run %s: %s steps after its wait logged', r.key, count(l.run_key))
			FROM stepwise_run r LEFT JOIN wp_log l ON l.run_key = r.key WHERE r.key LIKE 'wp/%' AND r.status = 'succeeded'
			GROUP BY r.key HAVING count(l.run_key) <> 1 ORDER BY 1`},
		{"the closing step ran once, after the wait's step", `SELECT format('run %s: %s closing steps, first at %s, wait step at %s', r.key, count(c.run_key), min(c.at), min(l.step_at))
			FROM stepwise_run r LEFT JOIN wp_closed c ON c.run_key = r.key LEFT JOIN wp_log l ON l.run_key = r.key
			WHERE r.key LIKE 'wp/%' AND r.status = 'succeeded'
			GROUP BY r.key HAVING count(DISTINCT c.at) <> 1 OR min(c.at) < min(l.step_at) ORDER BY 1`},
	}
	return runDrillChecks(ctx, q, checks)
}

// Drill 11: runs that pay out through the outbox and WaitForOperations, while workers (which
// also deliver the payouts) are killed -9 and frozen, against a bank that does not
// deduplicate and sometimes answers after the sender's timeout: no run woken before all its
// payouts are at rest, none left asleep past lease + maintenance interval + margin once they
// are, no payout paid twice, every run completes, and the usual invariants (send discipline
// included). STEPWISE_CHAOS_SEED repeats a run; STEPWISE_WAIT_PAYOUT_RUNS makes it bigger.
func TestChaosWaitPayoutsKillAndStop(t *testing.T) {
	t.Parallel()
	seed := chaosSeed(t)
	rep := wpDrill(t, seed, false)
	require.Empty(t, rep.violations, "seed %d: first violation: %s\n%s", seed, first(rep.violations), workflowtest.FormatViolations(rep.violations))
	require.Greater(t, rep.chaos.Kills, 3)
	require.Greater(t, rep.chaos.Stops, 0)
	require.Greater(t, rep.unknown, 0, "no payout became UNKNOWN_EXTERNAL: the reconciler was not drilled")
	require.Equal(t, rep.payouts, rep.states[string(outbox.StateSucceeded)]+rep.states[string(outbox.StateFailedPermanent)])
}

// The drill can fail: the same chaos with senders that resend a payment whose answer they did
// not get, under the same key, is caught by the bank's request log (two payments for one
// operation), which a deduplicating bank would hide.
func TestChaosWaitPayoutsCatchesBlindResend(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("long chaos run")
	}
	seed := chaosSeed(t)
	rep := wpDrill(t, seed, true)
	twice := 0
	for _, v := range rep.violations {
		if v.Name == "no payout sent twice to the bank" {
			twice++
		}
	}
	require.Positive(t, twice, "seed %d: the drill did not catch payouts paid twice; violations: %s", seed, workflowtest.FormatViolations(rep.violations))
	t.Logf("blind resends caught (seed %d): %d payouts paid twice; first violation: %s", seed, twice, first(rep.violations))
}
