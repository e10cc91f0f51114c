package retention_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/internal/testkit"
	"github.com/stepwise-go/stepwise/retention"
)

// signal stores a signal to run key, sent at sent, consumed at consumed (nil: not taken).
func signal(t *testing.T, pool *pgxpool.Pool, key, id string, sent time.Time, consumed *time.Time) {
	t.Helper()
	_, err := pool.Exec(context.Background(), `INSERT INTO stepwise_signal (run_key, name, signal_id, payload, sent_at, consumed_at)
		VALUES ($1, 'go', $2, '{}', $3, $4)`, key, id, sent, consumed)
	require.NoError(t, err)
}

// Signals are a run's history like its events: those of a run whose history is pruned go
// with it (taken ones, and untaken ones of a succeeded run, which no wait can take any more),
// and so does a signal that waited OlderThan for a run that was never started. What a run
// that can still go on may take stays: the signals and the open wait of a failed or
// cancelled run (Resume re-enters its wait), even when it is named in FailedRuns, and
// everything of unfinished or younger runs. A dry run counts the signals a pass deletes.
func TestPruneSignalsAndWaits(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testkit.DB(t)
	now := time.Now()
	old, recent := now.Add(-10*24*time.Hour), now.Add(-time.Hour)

	history(t, pool, "done", "succeeded", old, "SUCCEEDED")
	signal(t, pool, "done", "taken", old.Add(-time.Minute), &old)
	signal(t, pool, "done", "late", old.Add(time.Minute), nil) // sent after the run finished: never taken
	history(t, pool, "done-young", "succeeded", recent, "")
	signal(t, pool, "done-young", "taken", recent, &recent)
	history(t, pool, "live", "running", old, "")
	signal(t, pool, "live", "taken", old, &old)
	signal(t, pool, "live", "pending", old, nil)
	history(t, pool, "gave-up", "cancelled", old, "")
	signal(t, pool, "gave-up", "taken", old.Add(-time.Hour), &old)
	signal(t, pool, "gave-up", "pending", old, nil)
	_, err := pool.Exec(ctx, `INSERT INTO stepwise_wait (run_key, kind, signal_name, since, deadline) VALUES ('gave-up', 'signal', 'go', $1, $2)`,
		old, now.Add(time.Hour))
	require.NoError(t, err)
	history(t, pool, "failed", "failed", old, "")
	signal(t, pool, "failed", "taken", old, &old)
	signal(t, pool, "nobody", "orphan", old, nil)    // its run was never started
	signal(t, pool, "not-yet", "early", recent, nil) // sent before its run starts: kept for it

	cfg := &retention.Config{OlderThan: 7 * 24 * time.Hour, FailedRuns: []string{"gave-up"}, BatchSize: 1, Pause: time.Millisecond}
	cfg.DryRun = true
	dry, err := retention.Prune(ctx, pool, cfg)
	require.NoError(t, err)
	cfg.DryRun = false
	res, err := retention.Prune(ctx, pool, cfg)
	require.NoError(t, err)
	t.Logf("pruned: %+v (dry run: %+v)", res, dry)

	require.Equal(t, []string{"done-young/taken", "failed/taken", "gave-up/pending", "live/pending", "live/taken", "not-yet/early"},
		column(t, pool, `SELECT run_key || '/' || signal_id FROM stepwise_signal ORDER BY 1`))
	require.Equal(t, []string{"gave-up"}, column(t, pool, `SELECT run_key FROM stepwise_wait`),
		"a cancelled run named in FailedRuns can still be resumed into its wait")
	require.EqualValues(t, 4, res.Signals, "done's two, gave-up's taken one, nobody's")
	require.Equal(t, res.Signals, dry.Signals, "the dry run counts what the pass deletes")
	require.EqualValues(t, res.Runs+res.RunEvents+res.OperationEvents+res.Signals, res.Total())

	res, err = retention.Prune(ctx, pool, &retention.Config{OlderThan: 7 * 24 * time.Hour, FailedRuns: []string{"gave-up"}})
	require.NoError(t, err)
	require.Zero(t, res.Total(), "a second pass finds nothing")
}
