package workflow_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/riverqueue/river"
	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/internal/testkit"
	"github.com/stepwise-go/stepwise/internal/workflow"
)

type closeDayArgs struct {
	Date string `json:"date"`
}

func (closeDayArgs) Kind() string { return "test_close_day" }

type reconcileDayArgs struct {
	Date string `json:"date"`
}

func (reconcileDayArgs) Kind() string { return "test_reconcile_day" }

// TestStepStartRunIsOneRunOfItsOwnThatCommitsWithTheStep: a step that closes a day starts the
// day's reconciliation with Step.StartRun. Its first attempt starts it and then fails: the
// run it started is rolled back with the step (no run row, no River job), so nothing works a
// day that was never closed. The second attempt starts it again, and it commits with the
// step: one run, no parent (cancelling or resuming the day's close does not reach it), one
// River job. Starting the step's own key with another input is refused with ErrRunConflict
// and leaves the step's transaction usable.
func TestStepStartRunIsOneRunOfItsOwnThatCommitsWithTheStep(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testkit.DB(t)
	engine, err := workflow.New(pool, &workflow.Config{Logger: quietLogger()})
	require.NoError(t, err)
	workers := river.NewWorkers()
	var attempts atomic.Int32
	var conflict atomic.Value
	leftByTheFailedAttempt := atomic.Int32{}
	leftByTheFailedAttempt.Store(-1)
	workflow.AddWorker(engine, workers, workflow.StepFunc(func(ctx context.Context, s *workflow.Step[closeDayArgs, struct{}]) (workflow.Next, error) {
		if attempts.Load() == 1 {
			// Outside the step's transaction: what the failed attempt left behind.
			var n int32
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM stepwise_run WHERE key = $1`, "reconcile/"+s.Args.Date).Scan(&n); err != nil {
				return workflow.Next{}, err
			}
			leftByTheFailedAttempt.Store(n)
		}
		if _, err := s.StartRun(ctx, "reconcile/"+s.Args.Date, reconcileDayArgs{Date: s.Args.Date}, nil); err != nil {
			return workflow.Next{}, err
		}
		_, err := s.StartRun(ctx, s.RunKey, reconcileDayArgs{Date: s.Args.Date}, nil)
		conflict.Store(errors.Is(err, workflow.ErrRunConflict))
		if attempts.Add(1) == 1 {
			return workflow.Next{}, errors.New("the day's report failed to write")
		}
		return workflow.Done(), nil
	}))
	workflow.AddWorker(engine, workers, workflow.StepFunc(func(ctx context.Context, s *workflow.Step[reconcileDayArgs, struct{}]) (workflow.Next, error) {
		return workflow.Done(), nil
	}))
	e := newEnvWith(t, pool, engine, workers)

	_, err = workflow.Start(ctx, e.client, "close/2026-12-04", closeDayArgs{Date: "2026-12-04"}, nil)
	require.NoError(t, err)
	waitRun(t, pool, "close/2026-12-04", 30*time.Second, workflow.RunStatusSucceeded)
	require.EqualValues(t, 2, attempts.Load(), "the first attempt failed after starting the run")
	require.Equal(t, true, conflict.Load(), "the step's own key with another input is a conflict")
	require.EqualValues(t, 0, leftByTheFailedAttempt.Load(), "the run started by the failed attempt was rolled back with its step")

	run := waitRun(t, pool, "reconcile/2026-12-04", 30*time.Second, workflow.RunStatusSucceeded)
	require.Nil(t, run.Parent, "a run of its own, not a child")
	var jobs int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM river_job WHERE kind = 'test_reconcile_day'`).Scan(&jobs))
	require.Equal(t, 1, jobs, "the failed attempt's start was rolled back with its step")
}
