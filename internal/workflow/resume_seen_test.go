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

// TestResumeTxRefusesARunThatFailedAgain (ABA): alice reads a run failed on a bank
// outage. Before she resumes it, bob does; it runs and fails again, on an account the bank
// froze. The status alice saw (failed) is the status now, but not the failure she decided
// on: her resume is refused with what the run is now, and the run stays failed.
func TestResumeTxRefusesARunThatFailedAgain(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testkit.DB(t)
	createItems(t, pool, "items", true)
	var failure atomic.Value
	failure.Store("bank unreachable")
	w := &countWorker{hook: func(ctx context.Context, s *workflow.Step[countArgs, countCursor]) error {
		if s.Cursor.Next == 30 {
			if f := failure.Load().(string); f != "" {
				return errors.New(f)
			}
		}
		return nil
	}}
	e := newEnv(t, pool, nil, w, nil)
	_, err := workflow.Start(ctx, e.client, "aba", countArgs{Total: 50, Batch: 10, Table: "items"},
		&workflow.StartOpts{InsertOpts: &river.InsertOpts{MaxAttempts: 1}})
	require.NoError(t, err)
	seen := waitRun(t, pool, "aba", 10*time.Second, workflow.RunStatusFailed, workflow.RunStatusSucceeded)
	require.Equal(t, workflow.RunStatusFailed, seen.Status)
	require.GreaterOrEqual(t, seen.Version, int64(3), "pending, running, failed: one version per status change")

	// Bob resumes on what he saw; the run fails again, for another reason.
	failure.Store("bank refuses account acct-9: frozen by compliance")
	require.NoError(t, resumeSeen(ctx, pool, e.client, "aba", seen.Version, "bob", "INC-1: the bank is back"))
	again := waitRun(t, pool, "aba", 10*time.Second, workflow.RunStatusFailed, workflow.RunStatusSucceeded)
	require.Equal(t, workflow.RunStatusFailed, again.Status)
	require.Greater(t, again.Version, seen.Version)

	err = resumeSeen(ctx, pool, e.client, "aba", seen.Version, "alice", "INC-1: the bank is back")
	var changed *workflow.RunChangedError
	require.ErrorAs(t, err, &changed)
	require.ErrorIs(t, err, workflow.ErrRunChanged)
	require.Equal(t, again.Version, changed.Version)
	require.Contains(t, err.Error(), "frozen by compliance", "the refusal says what the run is now")
	now, err := workflow.GetRun(ctx, pool, "aba")
	require.NoError(t, err)
	require.Equal(t, workflow.RunStatusFailed, now.Status)
	require.Equal(t, again.Version, now.Version, "nothing moved")
	var resumes int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM stepwise_event WHERE subject = 'aba' AND kind = 'run.resume'`).Scan(&resumes))
	require.Equal(t, 1, resumes, "only bob's resume is recorded")

	// Audit text: one line, read as typed.
	for _, bad := range []struct{ actor, reason string }{{"alice\nroot", "x"}, {"alice", "INC-1 \u202eok"}, {"alice", "INC\u200b-1"}} {
		err := resumeSeen(ctx, pool, e.client, "aba", now.Version, bad.actor, bad.reason)
		require.Error(t, err)
		require.ErrorContains(t, err, "U+")
	}
	require.ErrorContains(t, resumeSeen(ctx, pool, e.client, "aba", 0, "alice", "x"), "seen version 0")
	require.ErrorIs(t, resumeSeen(ctx, pool, e.client, "aba-none", 1, "alice", "x"), workflow.ErrRunNotFound)

	// With the version alice reads now, she decides again, and the resume goes through.
	failure.Store("")
	require.NoError(t, resumeSeen(ctx, pool, e.client, "aba", now.Version, "alice", "INC-2: compliance released acct-9"))
	done := waitRun(t, pool, "aba", 10*time.Second, workflow.RunStatusSucceeded)
	require.Equal(t, workflow.RunStatusSucceeded, done.Status)
	perN, _ := itemCounts(t, pool, "items", "aba")
	requireExactlyOnce(t, perN, 50)
}
