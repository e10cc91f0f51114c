package chaos_test

import (
	"context"
	"os"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/cmd/stepwise-lab/chaos"
	"github.com/stepwise-go/stepwise/internal/testkit"
	"github.com/stepwise-go/stepwise/workflowtest"
)

// TestRetentionSoak is the bounded retention soak CI runs: the slow-bank profile (payouts
// against a bank answering around the sender timeout, workers killed and frozen) with
// retention.Prune running every second with an age of 2 s beside it, and an operator
// resolving payouts by hand on the bank's evidence. Every invariant must hold, and the
// retention checks: no run key restarts from zero, no slot evidence lost, every manual
// decision still attributable. The full size is the command's:
//
//	go run ./cmd/stepwise-lab chaos --profile mix --retention --duration 10m
//
// STEPWISE_CHAOS_SEED repeats a run; STEPWISE_RETENTION_PROFILE runs another bounded profile
// (long, paused-dispatcher, sleepers) under it.
func TestRetentionSoak(t *testing.T) {
	if testing.Short() {
		t.Skip("a chaos profile takes half a minute")
	}
	testkit.Heavy(t) // a fleet of worker processes
	profile := "slow-bank"
	if p := os.Getenv("STEPWISE_RETENTION_PROFILE"); p != "" {
		profile = p
	}
	cfg, err := chaos.ProfileConfig(profile, true)
	require.NoError(t, err)
	cfg.Retention = &chaos.Retention{}
	cfg.Logf, cfg.Progress = t.Logf, testWriter{t}
	if s := os.Getenv("STEPWISE_CHAOS_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		require.NoError(t, err, "STEPWISE_CHAOS_SEED")
		cfg.Seed = v
	}
	cfg.DatabaseURL = testkit.TemplateDBURL(t, "chaos_small_v3", func(ctx context.Context, pool *pgxpool.Pool) error {
		return chaos.Prepare(ctx, pool, &chaos.Config{Merchants: chaos.SmallMerchants})
	})
	cfg.StartWorker = func(env []string) (workflowtest.Worker, error) {
		return workflowtest.Start(t, "chaos-worker", env...), nil
	}
	res, err := chaos.Run(context.Background(), cfg)
	require.NoError(t, err)
	t.Log(res.Summary())
	require.True(t, res.Chaos.Quiet, "the system did not come to rest: %v (seed %d)", res.Chaos.QuietErr, res.Seed)
	require.Empty(t, res.Violations, "seed %d: %d violations:\n%s", res.Seed, len(res.Violations), workflowtest.FormatViolations(res.Violations))
	require.True(t, res.OK())
	require.NotNil(t, res.Retention)
	if cfg.Sleepers == 0 {
		require.Positive(t, res.Retention.PrunedRuns, "the soak must prune runs' history")
	}
	if cfg.Workload == "settle" {
		require.Positive(t, res.Retention.OperationEvents, "the soak must prune payouts' trails")
	}
	require.Zero(t, res.Retention.PruneFails)
}
