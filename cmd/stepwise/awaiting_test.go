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
