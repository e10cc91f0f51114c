package retention_test

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strings"
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
// one commit, as workflow's step does) on a live run, while retention.Prune prunes the
// history of 200k old succeeded runs: three audit events each deleted and the run row
// marked, 800k rows written (the run rows and checkpoints stay: a key names one run forever).
//
// The measurement is paired: the pruning is cut into windows (Prune stopped at the window's
// end and resumed at the next: every batch commits on its own), and each window is paired
// with a quiet window of the same length right before or after it (the order alternates), so
// both meet the same load from the rest of the machine. Each pair gives a ratio, mean step
// time while pruning over mean step time without; the benchmark reports their median as
// "slowdown_ratio" (goal: below 1.10), with their spread in the log, and the pruning rate.
// Run it once, it seeds its own million rows (BENCH_WINDOW sets the window, default 2s):
//
//	go test ./retention/ -run '^$' -bench StepsWhilePruning -benchtime=1x
func BenchmarkStepsWhilePruning(b *testing.B) {
	ctx := context.Background()
	pool := testkit.DB(b)
	const oldRuns = 200_000 // x (run + checkpoint + 3 events) = 1M rows, of which 800k are pruned
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
	// stepsFor runs steps back to back for d.
	stepsFor := func(d time.Duration) []time.Duration {
		var out []time.Duration
		for end := time.Now().Add(d); time.Now().Before(end); {
			out = append(out, step())
		}
		return out
	}
	window := 2 * time.Second
	if v := os.Getenv("BENCH_WINDOW"); v != "" {
		window, err = time.ParseDuration(v)
		require.NoError(b, err)
	}
	cfg := &retention.Config{OlderThan: 7 * 24 * time.Hour}

	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		var total retention.Result
		var pruning time.Duration
		var ratios []float64
		var quietAll, duringAll []time.Duration
		for round := 0; ; round++ {
			// pruneFor prunes for d while the steps run, and says whether pruning is done.
			pruneFor := func(d time.Duration) ([]time.Duration, bool) {
				pctx, cancel := context.WithCancel(ctx)
				done := make(chan *retention.Result, 1)
				start := time.Now()
				go func() {
					res, err := retention.Prune(pctx, pool, cfg)
					if err != nil && pctx.Err() == nil {
						b.Error(err)
					}
					done <- res
				}()
				var steps []time.Duration
				var res *retention.Result
				for end := start.Add(d); time.Now().Before(end); {
					steps = append(steps, step())
					select {
					case res = <-done:
						end = time.Now() // finished early: end the window here
					default:
					}
				}
				cancel()
				if res == nil {
					res = <-done
				}
				pruning += time.Since(start)
				finished := pctx.Err() == nil || res.Total() == 0
				total.Runs += res.Runs
				total.RunEvents += res.RunEvents
				total.OperationEvents += res.OperationEvents
				total.Batches += res.Batches
				total.Skipped += res.Skipped
				return steps, finished
			}
			var quiet, during []time.Duration
			var finished bool
			if round%2 == 0 {
				quiet = stepsFor(window)
				during, finished = pruneFor(window)
			} else {
				during, finished = pruneFor(window)
				quiet = stepsFor(window)
			}
			if len(during) > 20 { // a window cut short by the end of pruning is too short to compare
				ratios = append(ratios, float64(mean(during))/float64(mean(quiet)))
				quietAll, duringAll = append(quietAll, quiet...), append(duringAll, during...)
			}
			if finished {
				break
			}
		}
		var left int64
		require.NoError(b, pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM stepwise_run WHERE key LIKE 'old/%' AND history_pruned_at IS NULL) +
			(SELECT count(*) FROM stepwise_event WHERE subject LIKE 'old/%')`).Scan(&left))
		require.Zero(b, left, "old history left after pruning")
		require.NotEmpty(b, ratios)
		sorted := append([]float64(nil), ratios...)
		sort.Float64s(sorted)
		median := sorted[len(sorted)/2]
		if len(sorted)%2 == 0 {
			median = (sorted[len(sorted)/2-1] + sorted[len(sorted)/2]) / 2
		}
		b.ReportMetric(median, "slowdown_ratio")
		b.ReportMetric(float64(total.Total())/pruning.Seconds(), "pruned_rows/s")
		b.Logf("pruned %d rows (%d runs) in %s of pruning windows, %d batches, %d skipped; %d paired windows of %s: step mean without %s, with %s; p99 without %s, with %s",
			total.Total(), total.Runs, pruning.Round(time.Millisecond), total.Batches, total.Skipped, len(ratios), window,
			mean(quietAll), mean(duringAll), pct(quietAll, 99), pct(duringAll, 99))
		b.Logf("slowdown per pair (pruning/quiet, in order): %s; median %.3f, range %.3f-%.3f (goal < 1.10)",
			formatRatios(ratios), median, sorted[0], sorted[len(sorted)-1])
		if i+1 < b.N {
			b.Skip("the million old rows are pruned; run with -benchtime=1x")
		}
	}
}

func formatRatios(rs []float64) string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = fmt.Sprintf("%.2f", r)
	}
	return strings.Join(out, " ")
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
