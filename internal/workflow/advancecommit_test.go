package workflow_test

import (
	"bytes"
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/internal/testkit"
	"github.com/stepwise-go/stepwise/internal/workflow"
)

// A build deployed before migration 017 ran keeps working: its steps commit in two round
// trips, as earlier builds did, and it says once why. Without the check every continuing step
// failed with "function stepwise_fenced(text, bigint) does not exist" and the run ended in
// its failure budget.
func TestStepsRunWhereMigration017IsMissing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testkit.DB(t)
	_, err := pool.Exec(ctx, `DROP FUNCTION stepwise_fenced(text, bigint)`)
	require.NoError(t, err)
	createItems(t, pool, "items", true)
	var logs syncBuffer
	e := newEnv(t, pool, &workflow.Config{Logger: slog.New(slog.NewTextHandler(&logs, nil))}, &countWorker{}, nil)

	_, err = workflow.Start(ctx, e.client, "count/unmigrated", countArgs{Total: 500, Batch: 50, Table: "items"}, nil)
	require.NoError(t, err)
	run := waitRun(t, pool, "count/unmigrated", 10*time.Second, workflow.RunStatusSucceeded, workflow.RunStatusFailed)
	require.Equal(t, workflow.RunStatusSucceeded, run.Status, "last error: %s", deref(run.LastError))
	require.Zero(t, run.Failures, "no step may have failed on the missing function")
	perN, _ := itemCounts(t, pool, "items", "count/unmigrated")
	requireExactlyOnce(t, perN, 500)
	require.Equal(t, 1, bytes.Count([]byte(logs.String()), []byte("lacks migration 017")), "warned once: %s", logs.String())
}

// A step that ignores its context and returns Continue after the run was cancelled under it
// commits nothing: its write and COMMIT travel together on a context the cancel does not
// reach, so the engine must look at the step's context before sending them. Without that
// look, step 3's items landed here although CancelRun promises the open step rolls back.
func TestCancelledContinueStepCommitsNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testkit.DB(t)
	createItems(t, pool, "items", true)
	w := &countWorker{hook: func(stepCtx context.Context, s *workflow.Step[countArgs, countCursor]) error {
		if s.Number != 3 {
			return nil
		}
		if err := workflow.CancelRun(context.Background(), pool, s.RunKey, "merchant closed"); err != nil {
			return err
		}
		// Busy with something that does not watch the context (a computation, a call on a
		// context of its own) until the cancel has reached the step's context.
		select {
		case <-stepCtx.Done():
		case <-time.After(10 * time.Second):
		}
		return nil
	}}
	e := newEnv(t, pool, &workflow.Config{Heartbeat: 50 * time.Millisecond}, w, nil)

	_, err := workflow.Start(ctx, e.client, "count/cancelled", countArgs{Total: 10, Batch: 1, Table: "items"}, nil)
	require.NoError(t, err)
	run := waitRun(t, pool, "count/cancelled", 15*time.Second, workflow.RunStatusCancelled, workflow.RunStatusSucceeded, workflow.RunStatusFailed)
	require.Equal(t, workflow.RunStatusCancelled, run.Status)
	perN, _ := itemCounts(t, pool, "items", "count/cancelled")
	require.Equal(t, map[int]int{0: 1, 1: 1}, perN, "steps 1 and 2 committed; step 3, open when the cancel came, must not have")
}
