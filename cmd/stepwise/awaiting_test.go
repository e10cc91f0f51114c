package main

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/internal/testkit"
)

// A run that an old worker released for a newer one (a rolling deploy) says so in "runs
// show": what it waits for, and the cursor's version.
func TestRunsShowAwaitingNewerWorker(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testkit.DBURL(t)
	pool, err := pgxpool.New(ctx, db)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	startRun(t, pool, "settle/2026-12-01", "2026-12-01")
	_, err = pool.Exec(ctx, `UPDATE stepwise_checkpoint SET cursor = '{"after": 20, "batch": 2}', cursor_version = 2, steps = 2 WHERE key = 'settle/2026-12-01'`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE stepwise_run SET awaits_cursor_version = 2, awaits_since = '2026-12-01T10:00:00Z' WHERE key = 'settle/2026-12-01'`)
	require.NoError(t, err)

	r := stepwise(t, db, "runs", "show", "settle/2026-12-01").ok(t)
	require.Contains(t, r.stdout, "after 2 steps (cursor version 2)")
	require.Contains(t, r.stdout, "deploy     waiting for a worker that reads cursor version 2 (since 2026-12-01T10:00:00Z)")
	var shown runShow
	stepwise(t, db, "runs", "show", "--json", "settle/2026-12-01").ok(t).json(t, &shown)
	require.Equal(t, 2, shown.CursorVersion)
	require.NotNil(t, shown.RunJSON.Awaiting)
	require.Equal(t, 2, shown.RunJSON.Awaiting.CursorVersion)
}

// A run waiting for a signal says so in "runs show": what it waits for, since when, when it
// times out and what is missing, in text and in --json.
// README: stepwise runs show
func TestRunsShowWaitingRun(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testkit.DBURL(t)
	pool, err := pgxpool.New(ctx, db)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	startRun(t, pool, "close/2026-12-01", "2026-12-01")
	_, err = pool.Exec(ctx, `INSERT INTO stepwise_wait (run_key, kind, signal_name, since, deadline)
		VALUES ('close/2026-12-01', 'signal', 'statement', '2026-12-01T10:00:00Z', '2026-12-01T22:00:00Z')`)
	require.NoError(t, err)

	r := stepwise(t, db, "runs", "show", "close/2026-12-01").ok(t)
	require.Contains(t, r.stdout, `waits      for signal since 2026-12-01 10:00:00Z, times out 2026-12-01 22:00:00Z: signal "statement" not received`)
	var shown runShow
	stepwise(t, db, "runs", "show", "--json", "close/2026-12-01").ok(t).json(t, &shown)
	require.NotNil(t, shown.RunJSON.Wait)
	require.Equal(t, "statement", shown.RunJSON.Wait.Signal)
}
