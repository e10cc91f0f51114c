package retention_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/internal/testkit"
	"github.com/stepwise-go/stepwise/retention"
)

// history writes a run (checkpoint, run row, two audit events) finished (or not) at when,
// optionally with one operation in state opState whose audit events are as old.
func history(t *testing.T, pool *pgxpool.Pool, key, status string, when time.Time, opState string) uuid.UUID {
	t.Helper()
	ctx := context.Background()
	var finished *time.Time
	if status != "running" {
		finished = &when
	}
	_, err := pool.Exec(ctx, `INSERT INTO stepwise_checkpoint (key, updated_at) VALUES ($1, $2)`, key, when)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO stepwise_run (key, workflow, input, status, created_at, updated_at, finished_at)
		VALUES ($1, 'settle', '{}', $2, $3, $3, $4)`, key, status, when, finished)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO stepwise_event (subject, kind, at) VALUES ($1, 'lease.claim', $2), ($1, 'run.finish', $2)`, key, when)
	require.NoError(t, err)
	if opState == "" {
		return uuid.Nil
	}
	id := uuid.New()
	_, err = pool.Exec(ctx, `INSERT INTO stepwise_operation (operation_id, kind, business_key, payload, payload_hash, run_key, state, next_check_at, created_at, updated_at)
		VALUES ($1, 'payout', $2, '{"amount": 1}', '\x00', $3, $4, CASE WHEN $4 = 'UNKNOWN_EXTERNAL' THEN now() END, $5, $5)`, id, "bk-"+key, key, opState, when)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO stepwise_event (subject, kind, to_state, at) VALUES ('op:' || $1::text, 'op.transition', 'PROCESSING', $2), ('op:' || $1::text, 'op.transition', $3, $2)`, id, when, opState)
	require.NoError(t, err)
	return id
}

func count(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), sql, args...).Scan(&n))
	return n
}

// Prune deletes finished history older than the age, in batches, and keeps everything still
// alive or still needed: running runs, recent runs, runs whose payout is not settled, failed
// and cancelled runs (they can be resumed), every run row and checkpoint (the key names one
// run forever), every operation row (the tombstone that keeps its operation_id known) and
// every schedule slot (the record of what a date did).
func TestPruneDeletesOldFinishedHistoryOnly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testkit.DB(t)
	now := time.Now()
	old, recent := now.Add(-10*24*time.Hour), now.Add(-time.Hour)

	oldOps := map[string]uuid.UUID{}
	for _, k := range []string{"old-1", "old-2", "old-3", "old-4", "old-5"} {
		oldOps[k] = history(t, pool, k, "succeeded", old, "SUCCEEDED")
	}
	history(t, pool, "old-failed", "failed", old, "")
	history(t, pool, "old-cancelled", "cancelled", old, "FAILED_PERMANENT")
	unsettled := history(t, pool, "old-unknown", "succeeded", old, "UNKNOWN_EXTERNAL")
	history(t, pool, "old-running", "running", old, "")
	history(t, pool, "recent", "succeeded", recent, "SUCCEEDED")

	// Closed slots of a schedule: two old (one skipped, one done), an open one, the newest.
	_, err := pool.Exec(ctx, `INSERT INTO stepwise_schedule (name, spec, zone, gap, misfire, overlap, shards, watermark)
		VALUES ('daily', '0 1 * * *', 'UTC', 'run_after', '{}', 'allow_all', 1, now())`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO stepwise_schedule_slot (schedule, slot, status, reason, shards, version, materialized_at, runs_done_at) VALUES
		('daily', $1, 'skipped', 'overlap_skip', 1, 1, NULL, NULL),
		('daily', $2, 'materialized', NULL, 1, 1, $2, $2),
		('daily', $3, 'materialized', NULL, 1, 1, $3, NULL),
		('daily', $4, 'materialized', NULL, 1, 1, $4, $4)`, old.Add(-2*time.Hour), old.Add(-time.Hour), old, recent)
	require.NoError(t, err)

	res, err := retention.Prune(ctx, pool, &retention.Config{OlderThan: 7 * 24 * time.Hour, BatchSize: 2, Pause: time.Millisecond})
	require.NoError(t, err)
	t.Logf("pruned: %+v", res)

	require.EqualValues(t, 5, res.Runs, "old-1..5; failed and cancelled runs only by name")
	require.EqualValues(t, 10, res.RunEvents)
	require.EqualValues(t, 12, res.OperationEvents, "two events of each of the six settled old operations")
	require.Greater(t, res.Batches, 4, "batches of 2 rows")

	require.Equal(t, []string{"old-1", "old-2", "old-3", "old-4", "old-5", "old-cancelled", "old-failed", "old-running", "old-unknown", "recent"},
		keys(t, pool), "run rows are never deleted: a key names one run forever")
	require.Equal(t, 10, count(t, pool, `SELECT count(*) FROM stepwise_checkpoint`))
	require.Equal(t, []string{"old-1", "old-2", "old-3", "old-4", "old-5"},
		column(t, pool, `SELECT key FROM stepwise_run WHERE history_pruned_at IS NOT NULL ORDER BY key`))
	require.Equal(t, []string{"old-cancelled", "old-cancelled", "old-failed", "old-failed", "old-running", "old-running", "old-unknown", "old-unknown", "recent", "recent"},
		column(t, pool, `SELECT subject FROM stepwise_event WHERE subject NOT LIKE 'op:%' ORDER BY subject`))
	require.Equal(t, 8, count(t, pool, `SELECT count(*) FROM stepwise_operation`), "operations are tombstones: never deleted")
	for k, id := range oldOps {
		require.Equal(t, 1, count(t, pool, `SELECT count(*) FROM stepwise_operation WHERE operation_id = $1 AND state = 'SUCCEEDED'`, id), k)
	}
	require.Equal(t, 2, count(t, pool, `SELECT count(*) FROM stepwise_event WHERE subject = 'op:' || $1::text`, unsettled), "an unsettled operation keeps its trail")
	require.Equal(t, 4, count(t, pool, `SELECT count(*) FROM stepwise_schedule_slot`), "slots are the record of each date: never deleted")

	// A second pass finds nothing.
	res, err = retention.Prune(ctx, pool, &retention.Config{OlderThan: 7 * 24 * time.Hour})
	require.NoError(t, err)
	require.Zero(t, res.Total())
}

func column(t *testing.T, pool *pgxpool.Pool, sql string) []string {
	t.Helper()
	rows, err := pool.Query(context.Background(), sql)
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return out
}

func keys(t *testing.T, pool *pgxpool.Pool) []string {
	rows, err := pool.Query(context.Background(), `SELECT key FROM stepwise_run ORDER BY key`)
	require.NoError(t, err)
	ks, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return ks
}

// A batch never waits for a row a step (or anything else) holds: the locked run is skipped,
// and the rest is pruned.
func TestPruneSkipsLockedRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testkit.DB(t)
	old := time.Now().Add(-10 * 24 * time.Hour)
	history(t, pool, "held", "succeeded", old, "")
	history(t, pool, "free", "succeeded", old, "")

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `SELECT 1 FROM stepwise_run WHERE key = 'held' FOR UPDATE`)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `UPDATE stepwise_checkpoint SET steps = steps + 1 WHERE key = 'held'`)
	require.NoError(t, err)

	start := time.Now()
	res, err := retention.Prune(ctx, pool, &retention.Config{OlderThan: 7 * 24 * time.Hour})
	took := time.Since(start)
	require.NoError(t, err)
	t.Logf("pruned with a row held: %+v in %s", res, took)
	require.EqualValues(t, 1, res.Runs)
	require.Equal(t, []string{"free"}, column(t, pool, `SELECT key FROM stepwise_run WHERE history_pruned_at IS NOT NULL`))
	require.Equal(t, 2, count(t, pool, `SELECT count(*) FROM stepwise_event WHERE subject = 'held'`))
	require.Less(t, took, 10*time.Second, "Prune must not wait for the held row")
}

func TestConfigErrorsNameTheFix(t *testing.T) {
	t.Parallel()
	pool := testkit.DB(t)
	for _, tc := range []struct {
		cfg  *retention.Config
		want string
	}{
		{nil, "set Config.OlderThan"},
		{&retention.Config{}, "OlderThan is 0s; want at least 24h"},
		{&retention.Config{OlderThan: time.Hour}, "want at least 24h"},
		{&retention.Config{OlderThan: 48 * time.Hour, BatchSize: 1_000_000}, "BatchSize is 1000000; want 1 to 10000"},
		{&retention.Config{OlderThan: 48 * time.Hour, Pause: -time.Second}, "Pause"},
	} {
		_, err := retention.Prune(context.Background(), pool, tc.cfg)
		require.ErrorContains(t, err, tc.want)
	}
}

// Progress reports, after each batch, what the pass has committed: the rows it counts are
// gone from the database when it is called, and the last call holds the pass's Result. A
// Progress that blocks holds the pass between two batches: nothing is deleted meanwhile.
func TestProgressReportsCommittedBatches(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testkit.DB(t)
	old := time.Now().Add(-10 * 24 * time.Hour)
	for _, k := range []string{"p-1", "p-2", "p-3", "p-4", "p-5"} {
		history(t, pool, k, "succeeded", old, "SUCCEEDED")
	}
	const events = `SELECT count(*) FROM stepwise_event`
	all := count(t, pool, events)

	var calls []retention.Result
	res, err := retention.Prune(ctx, pool, &retention.Config{OlderThan: 7 * 24 * time.Hour, BatchSize: 2, Pause: time.Millisecond,
		Progress: func(r retention.Result) {
			calls = append(calls, r)
			gone := all - count(t, pool, events)
			require.EqualValues(t, r.RunEvents+r.OperationEvents, gone, "call %d: Progress counts what is committed, no more, no less", len(calls))
			if len(calls) == 2 {
				time.Sleep(300 * time.Millisecond)
				require.Equal(t, gone, all-count(t, pool, events), "a batch ran while Progress held the pass")
			}
		}})
	require.NoError(t, err)
	require.Len(t, calls, res.Batches, "one call a batch")
	require.Equal(t, *res, calls[len(calls)-1], "the last call holds the pass's result")
	require.EqualValues(t, 5, res.Runs)
	require.EqualValues(t, 10, res.OperationEvents)
	for i := 1; i < len(calls); i++ {
		require.GreaterOrEqual(t, calls[i].Total(), calls[i-1].Total(), "totals only grow")
	}
}
