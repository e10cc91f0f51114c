package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/internal/outbox"
	"github.com/stepwise-go/stepwise/internal/testkit"
	"github.com/stepwise-go/stepwise/internal/workflow"
)

// payArgs is a workflow run that settles merchants 1..Merchants, 10 per step, and pays each.
type payArgs struct {
	Merchants int `json:"merchants"`
}

func (payArgs) Kind() string { return "test_pay_merchants" }

type payCursor struct {
	After int `json:"after"`
}

type payWorker struct {
	workflow.StepperDefaults[payArgs, payCursor]
	calls  atomic.Int64
	failAt int64 // fail the step with this call number, after it enqueued
	woken  atomic.Bool
}

func (w *payWorker) Step(ctx context.Context, s *workflow.Step[payArgs, payCursor]) (workflow.Next, error) {
	call := w.calls.Add(1)
	if s.Cursor.After >= s.Args.Merchants {
		return workflow.Done(), nil
	}
	var ops []outbox.EnqueueParams
	last := min(s.Cursor.After+10, s.Args.Merchants)
	for m := s.Cursor.After + 1; m <= last; m++ {
		merchant := fmt.Sprintf("m-%d", m)
		if _, err := s.Tx.Exec(ctx, `INSERT INTO settlement VALUES ($1, $2, 'SETTLED')`, merchant, 100*m); err != nil {
			return workflow.Next{}, err
		}
		op := payout("settle/"+merchant, "acct-"+merchant, int64(100*m))
		op.RunKey = s.RunKey
		ops = append(ops, op)
		s.Cursor.After = m
	}
	res, err := outbox.Enqueue(ctx, s.Tx, ops...)
	if err != nil {
		return workflow.Next{}, err
	}
	w.woken.Store(res.Woken)
	if call == w.failAt {
		return workflow.Next{}, errors.New("the step fails after enqueueing")
	}
	return workflow.Continue(), nil
}

// TestWorkflowStepFailsThenRetries is the first acceptance item on a real step function: a
// step that enqueues operations and then fails leaves neither business rows nor operations;
// its retry enqueues them once, the run's operations are delivered, and the business rows move
// with their outcomes.
func TestWorkflowStepFailsThenRetries(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testkit.DB(t)
	_, err := pool.Exec(ctx, `CREATE TABLE settlement (merchant text PRIMARY KEY, amount bigint NOT NULL, status text NOT NULL)`)
	require.NoError(t, err)
	bank, client := startBank(t, nil, 5*time.Second, true)

	quiet := slog.New(slog.DiscardHandler)
	ob, err := outbox.New(pool, &outbox.Config{Logger: quiet, Kinds: map[string]*outbox.KindConfig{"payout": {
		Sender: bankSender{Client: client},
		OnOutcome: func(ctx context.Context, tx pgx.Tx, op *outbox.Operation, oc outbox.Outcome) error {
			if oc.To != outbox.StateSucceeded {
				return nil
			}
			_, err := tx.Exec(ctx, `UPDATE settlement SET status = 'PAID' WHERE 'settle/' || merchant = $1`, op.BusinessKey)
			return err
		},
	}}})
	require.NoError(t, err)
	engine, err := workflow.New(pool, &workflow.Config{Lease: 10 * time.Second, Logger: quiet})
	require.NoError(t, err)

	workers := river.NewWorkers()
	w := &payWorker{failAt: 2} // the second step fails once
	workflow.AddWorker(engine, workers, w)
	rc := &river.Config{Logger: quiet, Workers: workers, TestOnly: true,
		FetchCooldown: 20 * time.Millisecond, FetchPollInterval: 100 * time.Millisecond,
		Queues: map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 4}}}
	require.NoError(t, engine.Install(rc))
	require.NoError(t, ob.Install(rc))
	require.NoError(t, ob.Register(context.Background()))
	rclient, err := river.NewClient(riverpgxv5.New(pool), rc)
	require.NoError(t, err)
	failed, cancelSub := rclient.Subscribe(river.EventKindJobFailed)
	defer cancelSub()
	require.NoError(t, rclient.Start(ctx))
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, rclient.Stop(sctx))
	})

	run, err := workflow.Start(ctx, rclient, "pay/2026-03-01", payArgs{Merchants: 30}, nil)
	require.NoError(t, err)

	select {
	case <-failed:
	case <-time.After(30 * time.Second):
		r, _ := workflow.GetRun(ctx, pool, run.Key)
		t.Fatalf("the failing step did not fail: %d step calls, run %+v", w.calls.Load(), r)
	}
	// The first step committed merchants 1-10 and their payouts; the failed second step's
	// merchants 11-20 and payouts are gone with its transaction.
	var rows, ops int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM settlement WHERE merchant IN ('m-11', 'm-20')`).Scan(&rows))
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM stepwise_operation WHERE business_key IN ('settle/m-11', 'settle/m-20')`).Scan(&ops))
	require.Zero(t, rows)
	require.Zero(t, ops)

	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		run, err = workflow.GetRun(ctx, pool, run.Key)
		require.NoError(t, err)
		n, err := outbox.UnfinishedForRuns(ctx, pool, run.Key)
		require.NoError(t, err)
		if run.Status == workflow.RunStatusSucceeded && n == 0 {
			break
		}
		require.True(t, time.Now().Before(deadline), "run %s, %d operations unfinished", run.Status, n)
	}
	require.True(t, w.woken.Load(), "Enqueue in a step woke the dispatcher through River's context")
	var paid int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM settlement WHERE status = 'PAID'`).Scan(&paid))
	require.Equal(t, 30, paid)
	require.Len(t, bank.Applied(), 30)
	require.Empty(t, bank.DuplicateReferences())
	var withRun int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM stepwise_operation WHERE run_key = $1 AND state = 'SUCCEEDED'`, run.Key).Scan(&withRun))
	require.Equal(t, 30, withRun)
}

// runKeyWorker enqueues one payout without a RunKey, then tries one under another run's key.
type runKeyWorker struct {
	workflow.StepperDefaults[runKeyArgs, payCursor]
	foreign chan error
}

type runKeyArgs struct{}

func (runKeyArgs) Kind() string { return "test_run_key_from_step" }

func (w *runKeyWorker) Step(ctx context.Context, s *workflow.Step[runKeyArgs, payCursor]) (workflow.Next, error) {
	if _, err := outbox.Enqueue(ctx, s.Tx, payout("forgot-run-key", "acct-1", 100)); err != nil {
		return workflow.Next{}, err
	}
	// A savepoint, so that the refused enqueue leaves the step's transaction usable.
	sp, err := s.Tx.Begin(ctx)
	if err != nil {
		return workflow.Next{}, err
	}
	other := payout("someone-elses-run", "acct-2", 200)
	other.RunKey = "another/run"
	_, err = outbox.Enqueue(ctx, sp, other)
	_ = sp.Rollback(ctx)
	w.foreign <- err
	return workflow.Done(), nil
}

// TestEnqueueInStepTakesRunKey: a step that forgets Operation.RunKey still ties its operations
// to its run (or a batch would count as complete while its payouts are PENDING), and a RunKey
// naming another run is refused.
func TestEnqueueInStepTakesRunKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testkit.DB(t)
	quiet := slog.New(slog.DiscardHandler)
	ob, err := outbox.New(pool, &outbox.Config{Logger: quiet, Kinds: map[string]*outbox.KindConfig{"payout": {
		Sender: outbox.SendFunc(func(context.Context, *outbox.Operation) (outbox.Receipt, error) { return outbox.Receipt{}, nil }),
	}}})
	require.NoError(t, err)
	engine, err := workflow.New(pool, &workflow.Config{Lease: 10 * time.Second, Logger: quiet})
	require.NoError(t, err)
	rc := &river.Config{Logger: quiet, Workers: river.NewWorkers(), TestOnly: true,
		FetchCooldown: 20 * time.Millisecond, FetchPollInterval: 100 * time.Millisecond,
		Queues: map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 2}}}
	w := &runKeyWorker{foreign: make(chan error, 10)}
	workflow.AddWorker(engine, rc.Workers, w)
	require.NoError(t, engine.Install(rc))
	require.NoError(t, ob.Install(rc))
	require.NoError(t, ob.Register(context.Background()))
	rclient, err := river.NewClient(riverpgxv5.New(pool), rc)
	require.NoError(t, err)
	require.NoError(t, rclient.Start(ctx))
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, rclient.Stop(sctx))
	})

	run, err := workflow.Start(ctx, rclient, "runkey/1", runKeyArgs{}, nil)
	require.NoError(t, err)
	select {
	case err := <-w.foreign:
		require.ErrorIs(t, err, outbox.ErrInvalidOperation)
		require.ErrorContains(t, err, `"another/run"`)
		require.ErrorContains(t, err, `"runkey/1"`)
	case <-time.After(30 * time.Second):
		t.Fatal("the step did not run")
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		r, err := workflow.GetRun(ctx, pool, run.Key)
		require.NoError(t, err)
		if r.Status == workflow.RunStatusSucceeded {
			break
		}
		require.True(t, time.Now().Before(deadline), "run %s", r.Status)
	}
	var runKey *string
	require.NoError(t, pool.QueryRow(ctx, `SELECT run_key FROM stepwise_operation WHERE business_key = 'forgot-run-key'`).Scan(&runKey))
	require.NotNil(t, runKey, "the operation enqueued in the step without a RunKey carries no run key")
	require.Equal(t, run.Key, *runKey)
	var foreign int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM stepwise_operation WHERE business_key = 'someone-elses-run'`).Scan(&foreign))
	require.Zero(t, foreign)
}
