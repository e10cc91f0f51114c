package retention_test

import (
	"context"
	"sort"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/internal/testkit"
	"github.com/stepwise-go/stepwise/retention"
)

// BenchmarkStepsWhilePruning measures what pruning costs the step path: the latency of
// step-shaped transactions (the fenced checkpoint advance, a business row, an audit event,
// one commit, as workflow's step does) on a live run, first alone, then while
// retention.Prune deletes 1M old rows (200k finished runs with their checkpoints and three
// audit events each), then alone again. It reports the ratio of the mean step time while
// pruning to the mean of the two baselines around it (goal: below 1.10), as
// "slowdown_ratio", with the pruning rate. Run it once, it seeds its own million rows:
//
//	go test ./retention/ -run '^$' -bench StepsWhilePruning -benchtime=1x
func BenchmarkStepsWhilePruning(b *testing.B) {
	ctx := context.Background()
	pool := testkit.DB(b)
	const oldRuns = 200_000 // x (run + checkpoint + 3 events) = 1M rows
	seedStart := time.Now()
	_, err := pool.Exec(ctx, `
		INSERT INTO stepwise_checkpoint (key, updated_at)
		SELECT 'old/' || g, now() - interval '30 days' FROM generate_series(1, $1) g;
		`, oldRuns)
	require.NoError(b, err)
	_, err = pool.Exec(ctx, `
		INSERT INTO stepwise_run (key, workflow, input, status, created_at, updated_at, finished_at)
		SELECT 'old/' || g, 'settle', '{"date": "2026-01-01"}', 'succeeded', now() - interval '30 days', now() - interval '30 days', now() - interval '30 days'
		  FROM generate_series(1, $1) g`, oldRuns)
	require.NoError(b, err)
	_, err = pool.Exec(ctx, `
		INSERT INTO stepwise_event (subject, kind, actor, token, at)
		SELECT 'old/' || g, k, 'worker/job-1/attempt-1', 1, now() - interval '30 days'
		  FROM generate_series(1, $1) g, unnest(ARRAY['lease.claim', 'lease.release', 'run.finish']) k`, oldRuns)
	require.NoError(b, err)
	_, err = pool.Exec(ctx, `ANALYZE stepwise_run; ANALYZE stepwise_event; ANALYZE stepwise_checkpoint`)
	require.NoError(b, err)
	b.Logf("seeded %d old rows in %s", oldRuns*5, time.Since(seedStart).Round(time.Millisecond))

	// The live run the steps advance, and a business table for its writes.
	_, err = pool.Exec(ctx, `
		CREATE TABLE bench_business (id bigserial PRIMARY KEY, run_key text, step bigint, amount bigint);
		INSERT INTO stepwise_checkpoint (key, owner, lease_until, fencing_token) VALUES ('live', 'bench', now() + interval '1 hour', 1);
		INSERT INTO stepwise_run (key, workflow, input, status) VALUES ('live', 'settle', '{}', 'running')`)
	require.NoError(b, err)

	step := func() time.Duration {
		start := time.Now()
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO bench_business (run_key, step, amount) SELECT 'live', s, 100 FROM generate_series(1, 20) s`); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `UPDATE stepwise_checkpoint SET cursor = to_jsonb(steps + 1), steps = steps + 1, updated_at = now()
				WHERE key = 'live' AND fencing_token = 1 AND lease_until > now()`); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO stepwise_event (subject, kind, actor, token) VALUES ('live', 'step', 'bench', 1)`)
			return err
		})
		require.NoError(b, err)
		return time.Since(start)
	}
	measure := func(n int) []time.Duration {
		out := make([]time.Duration, n)
		for i := range out {
			out[i] = step()
		}
		return out
	}

	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		before := measure(1000)
		var during []time.Duration
		done := make(chan *retention.Result, 1)
		pruneStart := time.Now()
		go func() {
			res, err := retention.Prune(ctx, pool, &retention.Config{OlderThan: 7 * 24 * time.Hour})
			if err != nil {
				b.Error(err)
			}
			done <- res
		}()
		var res *retention.Result
	loop:
		for {
			select {
			case res = <-done:
				break loop
			default:
				during = append(during, step())
			}
		}
		pruneTook := time.Since(pruneStart)
		after := measure(1000)
		require.NotNil(b, res)

		base := (mean(before) + mean(after)) / 2
		ratio := float64(mean(during)) / float64(base)
		b.ReportMetric(ratio, "slowdown_ratio")
		b.ReportMetric(float64(res.Total())/pruneTook.Seconds(), "pruned_rows/s")
		b.Logf("pruned %d rows (%d runs) in %s, %d batches, %d skipped; step mean before %s, during %s (%d steps), after %s; p99 before %s, during %s; slowdown %.3f (goal < 1.10)",
			res.Total(), res.Runs, pruneTook.Round(time.Millisecond), res.Batches, res.Skipped,
			mean(before), mean(during), len(during), mean(after), pct(before, 99), pct(during, 99), ratio)
		if i+1 < b.N {
			b.Skip("the million old rows are pruned; run with -benchtime=1x")
		}
	}
}

func mean(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	var sum time.Duration
	for _, d := range ds {
		sum += d
	}
	return sum / time.Duration(len(ds))
}

func pct(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[(len(s)-1)*p/100]
}

var _ = (*pgxpool.Pool)(nil)
