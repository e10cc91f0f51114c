package workflowtest_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/internal/testkit"
	"github.com/stepwise-go/stepwise/workflowtest"
)

// CheckInvariants limited to some runs (CheckOpts.Runs, what the sample's
// invariants command passes for one date) reads their rows through indexes, not the whole
// history; and it still sees their violations, and only theirs.
func TestCheckInvariantsLimitedToRuns(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testkit.DB(t)
	// History: 20000 finished runs of 500 dates, 20000 operations, 4 events per run.
	_, err := pool.Exec(ctx, `
		INSERT INTO stepwise_checkpoint (key) SELECT 'settle/' || (g / 40) || '/' || (g % 40) FROM generate_series(0, 19999) g;
		INSERT INTO stepwise_run (key, workflow, input, status, schedule, slot, shard, finished_at)
		SELECT 'settle/' || (g / 40) || '/' || (g % 40), 'settle', '{}', 'succeeded', 'daily',
		       timestamptz '2026-01-01' + (g / 40) * interval '1 day', g % 40, now()
		  FROM generate_series(0, 19999) g;
		INSERT INTO stepwise_operation (operation_id, kind, business_key, payload, payload_hash, run_key, state)
		SELECT gen_random_uuid(), 'payout', g::text, '{}', '\x00', 'settle/' || (g / 400) || '/' || (g / 10 % 40), 'SUCCEEDED'
		  FROM generate_series(0, 19999) g;
		INSERT INTO stepwise_event (subject, kind, actor, token, to_state)
		SELECT 'settle/' || (g / 40) || '/' || (g % 40), k, 'w', t, 'succeeded'
		  FROM generate_series(0, 19999) g, (VALUES ('lease.claim', 1), ('lease.claim', 2), ('run.finish', 2), ('lease.release', 2)) v(k, t);
		ANALYZE stepwise_run; ANALYZE stepwise_operation; ANALYZE stepwise_event`)
	require.NoError(t, err)
	date := []string{"settle/7/0", "settle/7/1", "settle/7/2"}

	explain := func(sql string, args []any) string {
		var lines []string
		require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			rows, err := tx.Query(ctx, "EXPLAIN "+sql, args...)
			if err != nil {
				return err
			}
			lines, err = pgx.CollectRows(rows, pgx.RowTo[string])
			return err
		}))
		return strings.Join(lines, "\n")
	}
	scans := func(plan string) []string {
		var out []string
		for _, table := range []string{"stepwise_operation", "stepwise_event", "stepwise_run"} {
			if strings.Contains(plan, "Seq Scan on "+table) {
				out = append(out, table)
			}
		}
		return out
	}
	whole, _ := workflowtest.ScopedCheckSQL(nil)
	limited, args := workflowtest.ScopedCheckSQL(date)
	var wholeScans int
	for i := range limited {
		if len(scans(explain(whole[i], nil))) > 0 {
			wholeScans++
		}
		plan := explain(limited[i], args)
		require.Empty(t, scans(plan), "check %d scans a whole table when limited to runs:\n%s\n%s", i, limited[i], plan)
	}
	t.Logf("%d checks: %d scan a whole table over the whole database, none limited to %d runs", len(limited), wholeScans, len(date))
	require.Positive(t, wholeScans, "the unlimited checks read the history (the test's history is too small to show it)")

	// A violation in one of the runs is found; one in another run is not reported.
	_, err = pool.Exec(ctx, `INSERT INTO stepwise_event (subject, kind, actor, token, to_state) VALUES
		('settle/7/1', 'run.finish', 'w', 1, 'succeeded'), ('settle/9/1', 'run.finish', 'w', 1, 'succeeded')`)
	require.NoError(t, err)
	vs, err := workflowtest.CheckInvariants(ctx, pool, &workflowtest.CheckOpts{Runs: date})
	require.NoError(t, err)
	require.Len(t, vs, 1, "%v", vs)
	require.Contains(t, vs[0].Evidence, "settle/7/1")
	vs, err = workflowtest.CheckInvariants(ctx, pool, nil)
	require.NoError(t, err)
	require.Len(t, vs, 2, "%v", vs)
}
