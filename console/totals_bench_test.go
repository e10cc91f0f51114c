package console_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/console"
	"github.com/stepwise-go/stepwise/internal/memwatch"
	"github.com/stepwise-go/stepwise/internal/reconcile"
	"github.com/stepwise-go/stepwise/internal/testkit"
)

// Days of the totals ledger: 1,000,000 payouts sent on the big day, 100,000 on the small
// one, 300,000 on the day before (history a day's totals must not read), none on the empty.
var (
	totalsBigDay   = time.Date(2026, 3, 2, 0, 0, 0, 0, time.UTC)
	totalsSmallDay = time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	totalsEmptyDay = time.Date(2026, 2, 1, 0, 0, 0, 0, time.UTC)
)

// seedTotals fills the totals ledger in bulk (generate_series), as a settlement service's
// payouts table looks after those days: SUCCEEDED payouts spread over each day, 0.1% of them
// settled by the reconciler after their dispatcher died (a claim, no send time), 1% FAILED.
func seedTotals(ctx context.Context, pool *pgxpool.Pool) error {
	for _, d := range []struct {
		day time.Time
		n   int
	}{{totalsBigDay, 1_000_000}, {totalsSmallDay, 100_000}, {totalsSmallDay.AddDate(0, 0, -1), 300_000}} {
		_, err := pool.Exec(ctx, `INSERT INTO stepwise_operation (operation_id, kind, business_key, payload, payload_hash, amount, currency,
				run_key, state, attempts, claims, claimed_at, last_sent_at, created_at, updated_at, finished_at)
			SELECT gen_random_uuid(), 'payout', to_char($1::timestamptz, 'YYYY-MM-DD') || '/m-' || i,
				'{"account":"DE89370400440532013000","reference":"settlement of the day"}', '\x00',
				1000 + i % 5000, CASE WHEN i % 10 = 0 THEN 'USD' ELSE 'EUR' END, 'settle/' || to_char($1::timestamptz, 'YYYY-MM-DD') || '/' || (i % 4),
				CASE WHEN i % 100 = 7 THEN 'FAILED_PERMANENT' ELSE 'SUCCEEDED' END, 1, 1, t - interval '5 ms',
				CASE WHEN i % 1000 = 3 THEN NULL ELSE t END, $1::timestamptz - interval '1 hour', t, t
			FROM generate_series(1, $2::int) i, LATERAL (SELECT $1::timestamptz + i * (interval '86000 s' / $2::int) AS t) tt`, d.day, d.n)
		if err != nil {
			return fmt.Errorf("seeding totals: %w", err)
		}
	}
	_, err := pool.Exec(ctx, `VACUUM ANALYZE stepwise_operation`)
	return err
}

// bankDay is the statement the bank holds for a day of the seeded ledger: every SUCCEEDED
// payout applied, same amounts, held in memory as a statement client holds its parsed answer.
func bankDay(b *testing.B, pool *pgxpool.Pool, day time.Time) []reconcile.StatementEntry {
	rows, err := pool.Query(context.Background(), `SELECT operation_id, amount, currency, greatest(last_sent_at, claimed_at) FROM stepwise_operation
		WHERE kind = 'payout' AND state = 'SUCCEEDED' AND greatest(last_sent_at, claimed_at) >= $1 AND greatest(last_sent_at, claimed_at) < $2`, day, day.AddDate(0, 0, 1))
	require.NoError(b, err)
	var out []reconcile.StatementEntry
	var id uuid.UUID
	var amount int64
	var cur string
	var at time.Time
	_, err = pgx.ForEachRow(rows, []any{&id, &amount, &cur, &at}, func() error {
		out = append(out, reconcile.StatementEntry{Key: id.String(), ExternalRef: fmt.Sprintf("pay_%08d", len(out)), Amount: amount, Currency: cur, At: at})
		return nil
	})
	require.NoError(b, err)
	return out
}

// keep holds a measured allocation alive until it is measured.
var keep []reconcile.StatementEntry

// processCPU is the CPU time this process has used (user and system).
func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkTotalsOfADay: the console's Totals page for a day of 1,000,000 payouts, of
// 100,000, and of none, on a ledger holding all three (and a day before them): time per page
// and the peak heap the comparison adds on top of the statement the bank returned. Target:
// ≤ 2 s for 1M, and a peak that does not grow with the day. A fresh console per page, so
// nothing is served from the comparison it keeps. Skipped under -short (seeding takes a
// minute or two the first time; the template is kept for later runs).
func BenchmarkTotalsOfADay(b *testing.B) {
	if testing.Short() {
		b.Skip("seeds 1,400,000 payouts; run without -short")
	}
	dbURL := testkit.TemplateDBURL(b, "console_totals_v1", seedTotals)
	cfg, err := pgxpool.ParseConfig(dbURL)
	require.NoError(b, err)
	log := &statementLog{}
	cfg.ConnConfig.Tracer = log
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(b, err)
	b.Cleanup(pool.Close)

	for _, c := range []struct {
		name string
		day  time.Time
	}{{"1M", totalsBigDay}, {"100k", totalsSmallDay}, {"empty", totalsEmptyDay}} {
		b.Run(c.name, func(b *testing.B) {
			entries := bankDay(b, pool, c.day)
			// A fresh copy per read, in the order applied, as a statement client returns it
			// (CompareTotals sorts the copy in place).
			stmt := reconcile.StatementFunc(func(context.Context, time.Time, time.Time) ([]reconcile.StatementEntry, error) {
				return slices.Clone(entries), nil
			})
			stmtBytes := memwatch.HeapPeak(func() { keep = slices.Clone(entries) })
			keep = nil
			target := "/console/totals?kind=payout&date=" + c.day.Format(time.DateOnly)
			page := func() string {
				h, err := console.New(pool, &console.Config{Prefix: "/console", Logger: slog.New(slog.DiscardHandler),
					Authenticate: console.BasicAuth(testUser, testPassword), Statements: map[string]reconcile.Statement{"payout": stmt}})
				require.NoError(b, err)
				return serve(b, h, target)
			}
			// Plans of the comparison's statements, once.
			log.record(true)
			body := page()
			require.Contains(b, body, `id="totals-match"`, "the seeded statement matches the ledger")
			for _, q := range log.record(false) {
				if !strings.Contains(q.sql, "stepwise_operation") {
					continue
				}
				rows, err := pool.Query(context.Background(), "EXPLAIN (ANALYZE, COSTS off, SUMMARY on) "+q.sql, q.args...)
				require.NoError(b, err)
				plan, err := pgx.CollectRows(rows, pgx.RowTo[string])
				require.NoError(b, err)
				b.Logf("plan:\n%s\n  %s", oneLine(q.sql), strings.Join(plan, "\n  "))
			}
			var total, cpu time.Duration
			var peak uint64
			runs := 0
			for b.Loop() {
				var took time.Duration
				p := memwatch.HeapPeak(func() {
					start, cpu0 := time.Now(), processCPU()
					page()
					took = time.Since(start)
					cpu += processCPU() - cpu0
				})
				total += took
				peak = max(peak, p)
				runs++
			}
			avg := total / time.Duration(runs)
			own := int64(peak) - int64(stmtBytes)
			b.ReportMetric(float64(avg.Microseconds())/1000, "ms/page")
			b.ReportMetric(float64(cpu.Microseconds())/1000/float64(runs), "cpu-ms/page")
			b.ReportMetric(float64(peak)/(1<<20), "peak-MiB")
			b.ReportMetric(float64(own)/(1<<20), "beyond-statement-MiB")
			b.Logf("%s: %d payouts, %.0f ms per page (%.0f ms of this process's CPU), peak heap +%.1f MiB, of which the statement's copy %.1f MiB: %.1f MiB beyond it",
				c.name, len(entries), float64(avg.Microseconds())/1000, float64(cpu.Microseconds())/1000/float64(runs),
				float64(peak)/(1<<20), float64(stmtBytes)/(1<<20), float64(own)/(1<<20))
			if c.name == "1M" && avg > 2*time.Second {
				b.Errorf("%s per page for 1M payouts, want ≤ 2 s", avg)
			}
		})
	}
}
