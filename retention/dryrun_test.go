package retention_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/internal/testkit"
	"github.com/stepwise-go/stepwise/retention"
)

// A dry run deletes nothing, and counts exactly what the real pass then deletes: an operator
// who reads "would delete 5 runs' history" and applies gets those 5, not more.
func TestPruneDryRunCountsWhatApplyDeletes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testkit.DB(t)
	now := time.Now()
	old, recent := now.Add(-10*24*time.Hour), now.Add(-time.Hour)
	for _, k := range []string{"old-1", "old-2", "old-3"} {
		history(t, pool, k, "succeeded", old, "SUCCEEDED")
	}
	history(t, pool, "old-failed", "failed", old, "")
	history(t, pool, "old-named", "failed", old, "")
	history(t, pool, "old-unknown", "succeeded", old, "UNKNOWN_EXTERNAL")
	history(t, pool, "recent", "succeeded", recent, "SUCCEEDED")
	_, err := pool.Exec(ctx, `INSERT INTO stepwise_event (subject, kind, actor, at) VALUES ('old-1', 'run.resume', 'ana', $1)`, old)
	require.NoError(t, err)
	events := count(t, pool, `SELECT count(*) FROM stepwise_event`)

	cfg := &retention.Config{OlderThan: 7 * 24 * time.Hour, FailedRuns: []string{"old-named"}, DryRun: true}
	dry, err := retention.Prune(ctx, pool, cfg)
	require.NoError(t, err)
	t.Logf("dry run: %+v kept %+v", dry, dry.Kept)
	require.True(t, dry.DryRun)
	require.Equal(t, events, count(t, pool, `SELECT count(*) FROM stepwise_event`), "a dry run deletes nothing")
	require.Zero(t, count(t, pool, `SELECT count(*) FROM stepwise_run WHERE history_pruned_at IS NOT NULL`), "a dry run marks nothing")
	require.EqualValues(t, 4, dry.Runs, "old-1..3 and the named failed run")
	require.EqualValues(t, 8, dry.RunEvents, "two machine events each; old-1's resume is a decision")
	require.EqualValues(t, 6, dry.OperationEvents, "two events of each old settled operation")
	require.Equal(t, retention.Kept{Runs: 7, Operations: 5, Decisions: 1, FailedRuns: 1, UnsettledRuns: 1, YoungerRuns: 1}, *dry.Kept,
		"every row; old-1's resume; old-failed (resumable); old-unknown (its payout is open); recent (younger)")

	cfg.DryRun = false
	res, err := retention.Prune(ctx, pool, cfg)
	require.NoError(t, err)
	require.Equal(t, [3]int64{dry.Runs, dry.RunEvents, dry.OperationEvents}, [3]int64{res.Runs, res.RunEvents, res.OperationEvents},
		"the dry run's counts are what the pass deleted")
	require.Nil(t, res.Kept)

	// A dry run refuses a bad name as the real pass does, before reading anything else.
	_, err = retention.Prune(ctx, pool, &retention.Config{OlderThan: 7 * 24 * time.Hour, FailedRuns: []string{"recent"}, DryRun: true})
	require.ErrorContains(t, err, `run "recent" is succeeded`)
}
