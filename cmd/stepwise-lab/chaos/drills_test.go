package chaos_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/cmd/sample-settlement/bankfake"
	"github.com/stepwise-go/stepwise/cmd/sample-settlement/settlement"
	"github.com/stepwise-go/stepwise/cmd/stepwise-lab/chaos"
	"github.com/stepwise-go/stepwise/internal/testkit"
	"github.com/stepwise-go/stepwise/internal/workflow"
	"github.com/stepwise-go/stepwise/workflowtest"
	"github.com/stepwise-go/stepwise/workflowtest/fakebank"
)

// drillMerchants sizes the date: 2,000 merchants in 8 shards at 2 merchants a step are 125
// steps per run, long enough for a drill's fault to land mid-settlement (each drill waits
// for steps before striking), short enough for every CI run. The chaos run's 20,000 took
// 164-180 s per drill at load 35, most of it settling after the fault had been survived.
const drillMerchants = 2000

// drillBundle is a prepared date (see drillMerchants), the runs started and no worker yet.
type drillBundle struct {
	url    string
	pool   *pgxpool.Pool
	bank   *fakebank.Client
	plan   settlement.Plan
	client *river.Client[pgx.Tx]
	env    func(dbURL string) []string
}

func setupDrill(t *testing.T) *drillBundle {
	t.Helper()
	ctx := context.Background()
	url := testkit.TemplateDBURL(t, "chaos_drill_v1", func(ctx context.Context, pool *pgxpool.Pool) error {
		return chaos.Prepare(ctx, pool, &chaos.Config{Merchants: drillMerchants})
	})
	pool, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	bank := fakebank.New(&fakebank.Config{Seed: 1})
	require.NoError(t, bank.Start())
	t.Cleanup(func() { _ = bank.Close() })
	plan, err := settlement.Plan{Shards: 8}.Compile()
	require.NoError(t, err)
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, _, err := plan.Start(ctx, client, tx, chaos.Date, "drill")
		return err
	}))
	return &drillBundle{url: url, pool: pool, bank: fakebank.NewClient(bank.URL(), nil), plan: plan, client: client,
		env: func(dbURL string) []string {
			return []string{"DATABASE_URL=" + dbURL, "BANK_URL=" + bank.URL(), "CHAOS_LEASE=2s", "CHAOS_SHARDS=8", "CHAOS_BATCH=2"}
		}}
}

// waitRest waits until every run has finished and every payout is proven or MANUAL, for as
// long as the date makes progress (steps committed, payouts at rest, events written): a
// loaded machine slows the drill, and only a drill that stops moving fails.
func (b *drillBundle) waitRest(t *testing.T) {
	t.Helper()
	testkit.WaitProgress(t, "the date at rest", 0, 0, func(ctx context.Context) (bool, int64, error) {
		var open, progress int64
		err := b.pool.QueryRow(ctx, `SELECT
			(SELECT count(*) FROM stepwise_run WHERE status IN ('pending', 'running')) +
			(SELECT count(*) FROM stepwise_operation WHERE state NOT IN ('SUCCEEDED', 'FAILED_PERMANENT', 'MANUAL')),
			(SELECT coalesce(sum(steps), 0) FROM stepwise_checkpoint) +
			(SELECT count(*) FROM stepwise_operation WHERE state IN ('SUCCEEDED', 'FAILED_PERMANENT', 'MANUAL')) +
			(SELECT count(*) FROM stepwise_event)`).Scan(&open, &progress)
		return open == 0, progress, err
	})
}

func (b *drillBundle) requireInvariants(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	vs, err := workflowtest.CheckInvariants(ctx, b.pool, &workflowtest.CheckOpts{Quiet: true})
	require.NoError(t, err)
	require.Empty(t, vs, workflowtest.FormatViolations(vs))
	res, err := settlement.CheckInvariants(ctx, b.pool, bankfake.New(b.bank), b.plan, chaos.Date)
	require.NoError(t, err)
	require.NoError(t, res.Err())
}

// Drill 4 on the sample service: one worker's database connection is cut mid-settlement (a
// TCP proxy between it and Postgres drops every connection and refuses new ones). It can no
// longer renew its leases; the other worker takes its runs over, and the date ends with every
// invariant holding.
func TestDrillConnectionCutOnSample(t *testing.T) {
	if testing.Short() {
		t.Skip("drill takes half a minute")
	}
	testkit.Heavy(t) // worker processes beside the sample's pools
	b := setupDrill(t)
	ctx := context.Background()
	proxy, proxied := testkit.NewProxy(t, b.url)

	cutOff := workflowtest.Start(t, "chaos-worker", b.env(proxied)...)
	_, err := cutOff.WaitForLine(ctx, "ready")
	require.NoError(t, err)
	// Let it claim and work runs (it is the only worker so far).
	testkit.WaitProgress(t, "the first worker working runs", 0, 0, func(ctx context.Context) (bool, int64, error) {
		var held, steps int64
		err := b.pool.QueryRow(ctx, `SELECT
			(SELECT count(*) FROM stepwise_checkpoint c JOIN stepwise_run r ON r.key = c.key WHERE r.status = 'running' AND c.steps > 5),
			(SELECT coalesce(sum(steps), 0) FROM stepwise_checkpoint)`).Scan(&held, &steps)
		return held > 0, steps, err
	})

	healthy := workflowtest.Start(t, "chaos-worker", b.env(b.url)...)
	_, err = healthy.WaitForLine(ctx, "ready")
	require.NoError(t, err)
	proxy.Cut()
	cutAt := time.Now()

	b.waitRest(t)
	var takeovers int
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FROM stepwise_event WHERE kind = 'run.takeover' AND at > $1`, cutAt).Scan(&takeovers))
	t.Logf("date at rest %s after the cut; %d runs taken over from the cut-off worker", time.Since(cutAt).Round(time.Millisecond), takeovers)
	require.Positive(t, takeovers, "the cut-off worker's runs must be taken over")
	b.requireInvariants(t)
}

// Drill 6 on the sample service: a hot run whose every step fails (a shard outside the plan)
// among the date's eight healthy runs. It backs off through River's attempts and ends failed,
// visibly; the healthy runs settle the date beside it.
func TestDrillHotFailingRunOnSample(t *testing.T) {
	if testing.Short() {
		t.Skip("drill takes half a minute")
	}
	testkit.Heavy(t) // worker processes beside the sample's pools
	b := setupDrill(t)
	ctx := context.Background()
	_, err := workflow.Start(ctx, b.client, "settle/hot", settlement.SettleArgs{Date: "2026-11-26", Shard: 9, Shards: 8},
		&workflow.StartOpts{InsertOpts: &river.InsertOpts{Queue: settlement.SettleQueue, MaxAttempts: 3}})
	require.NoError(t, err)

	began := time.Now()
	for i := 0; i < 2; i++ {
		w := workflowtest.Start(t, "chaos-worker", b.env(b.url)...)
		_, err := w.WaitForLine(ctx, "ready")
		require.NoError(t, err)
	}
	testkit.WaitProgress(t, "the healthy runs finished", 0, 0, func(ctx context.Context) (bool, int64, error) {
		var open, steps int64
		err := b.pool.QueryRow(ctx, `SELECT
			(SELECT count(*) FROM stepwise_run WHERE key <> 'settle/hot' AND status IN ('pending', 'running')),
			(SELECT coalesce(sum(steps), 0) FROM stepwise_checkpoint)`).Scan(&open, &steps)
		return open == 0, steps, err
	})
	healthyDone := time.Since(began)

	b.waitRest(t)
	hot, err := workflow.GetRun(ctx, b.pool, "settle/hot")
	require.NoError(t, err)
	require.Equal(t, workflow.RunStatusFailed, hot.Status)
	require.Equal(t, 3, hot.Attempts)
	require.Contains(t, *hot.LastError, "3 failures in a row without progress")
	require.Contains(t, *hot.LastError, "shard 9 of 8")
	t.Logf("healthy runs finished after %s; the hot run failed after %d attempts (%s in all): %s",
		healthyDone.Round(time.Millisecond), hot.Attempts, time.Since(began).Round(time.Millisecond), *hot.LastError)
	b.requireInvariants(t)
}
