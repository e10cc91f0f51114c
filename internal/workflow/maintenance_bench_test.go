package workflow_test

import (
	"context"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/internal/runwait"
	"github.com/stepwise-go/stepwise/internal/testkit"
	"github.com/stepwise-go/stepwise/internal/workflow"
)

// BenchmarkMaintainPass measures one maintenance pass with a backlog of 100,000 pending runs
// (their River jobs available) and 1,000 running runs (jobs running, leases live), and logs
// each scan's plan. The target: ≤ 5 ms a pass, with index-driven plans, so that a backlog
// cannot slow the takeover of crashed runs. Seeding takes
// a few seconds, so the benchmark is skipped under -short.
//
//	go test ./workflow/ -run '^$' -bench BenchmarkMaintainPass -benchtime 200x
func BenchmarkMaintainPass(b *testing.B) {
	if testing.Short() {
		b.Skip("seeds 101,000 runs; skipped under -short")
	}
	ctx := context.Background()
	pool := testkit.DB(b)
	e := newEnv(b, pool, &workflow.Config{Lease: 30 * time.Second}, nil, map[string]river.QueueConfig{})
	seed := func(prefix string, n int, state string, running bool) {
		_, err := pool.Exec(ctx, `INSERT INTO stepwise_checkpoint (key, owner, lease_until, fencing_token)
			SELECT $1 || g, CASE WHEN $3 THEN 'worker' END, CASE WHEN $3 THEN now() + interval '1 hour' END, CASE WHEN $3 THEN 1 ELSE 0 END
			  FROM generate_series(1, $2::int) g`, prefix, n, running)
		require.NoError(b, err)
		_, err = pool.Exec(ctx, `INSERT INTO river_job (args, kind, max_attempts, queue, state, priority, metadata, attempt, attempted_at)
			SELECT '{"total":1,"batch":1,"table":"items"}', 'test_count', 25, 'default', $3::river_job_state, 1,
			       jsonb_build_object('stepwise_run', $1 || g), CASE WHEN $4 THEN 1 ELSE 0 END,
			       CASE WHEN $4 THEN now() - interval '1 hour' END
			  FROM generate_series(1, $2::int) g`, prefix, n, state, running)
		require.NoError(b, err)
		_, err = pool.Exec(ctx, `INSERT INTO stepwise_run (key, workflow, input, river_job_id, status)
			SELECT metadata->>'stepwise_run', kind, args, id, CASE WHEN $2 THEN 'running' ELSE 'pending' END
			  FROM river_job WHERE metadata->>'stepwise_run' LIKE $1 || '%'`, prefix, running)
		require.NoError(b, err)
	}
	started := time.Now()
	seed("pending/", 100_000, "available", false)
	seed("running/", 1_000, "running", true)
	for _, table := range []string{"stepwise_checkpoint", "stepwise_run", "river_job"} {
		_, err := pool.Exec(ctx, "ANALYZE "+table)
		require.NoError(b, err)
	}
	b.Logf("seeded 100,000 pending and 1,000 running runs in %s", time.Since(started).Round(time.Millisecond))

	var lastJob int64
	require.NoError(b, pool.QueryRow(ctx, `SELECT max(id) FROM (SELECT id FROM river_job WHERE state = 'running' ORDER BY id LIMIT 100) p`).Scan(&lastJob))
	for name, q := range workflow.MaintenanceScansForTest(e.engine, 0, lastJob) {
		rows, err := pool.Query(ctx, "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) "+q[0].(string), q[1:]...)
		require.NoError(b, err)
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(b, err)
		b.Logf("plan of the %s scan:\n%s", name, strings.Join(lines, "\n"))
	}

	// Baseline, same data, same run: the stuck-run scan as it was before (616d8b1), which
	// walked every unfinished run.
	var baseline time.Duration
	for range 5 {
		began := time.Now()
		rows, err := pool.Query(ctx, `
			SELECT r.key, r.river_job_id, j.state::text, r.attempts, r.workflow, r.input, j.queue, j.priority, j.max_attempts
			  FROM stepwise_run r
			  JOIN stepwise_checkpoint c ON c.key = r.key
			  LEFT JOIN river_job j ON j.id = r.river_job_id
			 WHERE r.status IN ('pending', 'running')
			   AND (c.lease_until IS NULL OR c.lease_until < now())
			   AND ((j.state = 'running' AND j.attempted_at < now() - $1 * interval '1 millisecond')
			        OR j.id IS NULL OR j.state IN ('completed', 'discarded', 'cancelled'))
			 ORDER BY r.updated_at LIMIT 100`, int64(30000))
		require.NoError(b, err)
		rows.Close()
		baseline += time.Since(began)
	}
	b.Logf("baseline: the old stuck-run scan took %s on the same data", (baseline / 5).Round(10*time.Microsecond))

	res, err := e.engine.Maintain(ctx, e.client)
	require.NoError(b, err)
	require.Empty(b, res.TakenOver, "live leases must not be taken over")
	b.ResetTimer()
	for b.Loop() {
		if _, err := e.engine.Maintain(ctx, e.client); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/1000, "ms/pass")
	b.ReportMetric(float64(baseline.Microseconds())/5/1000, "ms/old-scan")
}

// seedWaitingRuns writes n runs that wait for their operations as a step's commit leaves them
// (run 'running' released, its timeout job scheduled a day out, the wait row, three PENDING
// operations each), with generate_series, and analyzes the tables.
func seedWaitingRuns(tb testing.TB, pool *pgxpool.Pool, n int) {
	tb.Helper()
	ctx := context.Background()
	_, err := pool.Exec(ctx, `INSERT INTO stepwise_checkpoint (key) SELECT 'w/' || g FROM generate_series(1, $1::int) g`, n)
	require.NoError(tb, err)
	_, err = pool.Exec(ctx, `INSERT INTO river_job (args, kind, max_attempts, queue, state, priority, metadata, scheduled_at)
		SELECT '{}', 'test_wait', 25, 'default', 'scheduled', 1, jsonb_build_object('stepwise_run', 'w/' || g), now() + interval '1 day'
		  FROM generate_series(1, $1::int) g`, n)
	require.NoError(tb, err)
	_, err = pool.Exec(ctx, `INSERT INTO stepwise_run (key, workflow, input, river_job_id, status, released_at, wake_at)
		SELECT metadata->>'stepwise_run', kind, args, id, 'running', now(), scheduled_at FROM river_job WHERE metadata->>'stepwise_run' LIKE 'w/%'`)
	require.NoError(tb, err)
	_, err = pool.Exec(ctx, `INSERT INTO stepwise_wait (run_key, kind, deadline) SELECT 'w/' || g, 'operations', now() + interval '1 day' FROM generate_series(1, $1::int) g`, n)
	require.NoError(tb, err)
	_, err = pool.Exec(ctx, `INSERT INTO stepwise_operation (operation_id, kind, business_key, payload, payload_hash, run_key, state)
		SELECT gen_random_uuid(), 'test_wait_op', 'w/' || g || '/' || i, '{}', '\x00', 'w/' || g, 'PENDING'
		  FROM generate_series(1, $1::int) g, generate_series(1, 3) i`, n)
	require.NoError(tb, err)
	for _, table := range []string{"stepwise_checkpoint", "stepwise_run", "river_job", "stepwise_wait", "stepwise_operation"} {
		_, err := pool.Exec(ctx, "ANALYZE "+table)
		require.NoError(tb, err)
	}
}

// BenchmarkMaintainPassWaiting measures one maintenance pass with 10,000 runs waiting for
// their operations (seedWaitingRuns), against the ≤ 5 ms target, and the statements a pass
// sends (a pgx tracer on the pool: every statement, BEGIN and COMMIT included;
// pg_stat_statements is not loaded on a default server), beside those of a pass with no runs
// on the same pool: waiting runs must add none per run.
//
//	go test ./workflow/ -run '^$' -bench BenchmarkMaintainPassWaiting -benchtime 200x
func BenchmarkMaintainPassWaiting(b *testing.B) {
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(testkit.DBURL(b))
	require.NoError(b, err)
	cfg.MaxConns = 4
	tracer := &countingTracer{}
	cfg.ConnConfig.Tracer = tracer
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(b, err)
	b.Cleanup(pool.Close)
	e := newEnv(b, pool, &workflow.Config{Lease: 30 * time.Second}, nil, map[string]river.QueueConfig{})
	pass := func() int {
		before := tracer.count()
		if _, err := e.engine.Maintain(ctx, e.client); err != nil {
			b.Fatal(err)
		}
		return tracer.count() - before
	}
	pass()
	empty := pass()
	// The same pass with no runs, same process and pool: the machine's own floor.
	var emptyTimes []time.Duration
	for range 30 {
		began := time.Now()
		pass()
		emptyTimes = append(emptyTimes, time.Since(began))
	}
	const n = 10_000
	started := time.Now()
	seedWaitingRuns(b, pool, n)
	b.Logf("seeded %d waiting runs (3 operations each) in %s", n, time.Since(started).Round(time.Millisecond))
	pass()
	// Where a pass's time goes: each scan alone, median of 9, and the backstop's transaction.
	scans := workflow.MaintenanceScansForTest(e.engine, 0, 0)
	scans["backstop"] = nil
	for _, name := range slices.Sorted(maps.Keys(scans)) {
		q := scans[name]
		var ds []time.Duration
		for range 9 {
			began := time.Now()
			if q == nil {
				require.NoError(b, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					_, _, err := runwait.Backstop(ctx, tx, "", 100, 60_000)
					return err
				}))
			} else {
				rows, err := pool.Query(ctx, q[0].(string), q[1:]...)
				require.NoError(b, err)
				rows.Close()
				require.NoError(b, rows.Err())
			}
			ds = append(ds, time.Since(began))
		}
		b.Logf("%s scan with %d waiting runs: median %s", name, n, percentile(ds, 0.5).Round(10*time.Microsecond))
	}
	statements := 0
	b.ResetTimer()
	for b.Loop() {
		statements = max(statements, pass())
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/1000, "ms/pass")
	b.ReportMetric(float64(statements), "stmts/pass")
	b.ReportMetric(float64(empty), "stmts/empty-pass")
	b.ReportMetric(float64(percentile(emptyTimes, 0.5).Microseconds())/1000, "ms/empty-pass")
}
