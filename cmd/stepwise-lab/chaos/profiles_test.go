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

// The bounded chaos profiles: each runs in well under a minute against the strict bank and is
// judged by every invariant, the request-log and needless-takeover checks included. Run one
// with e.g. `go test ./cmd/stepwise-lab/chaos/ -run TestProfileLong -v`;
// STEPWISE_CHAOS_SEED repeats a run.

func TestProfileLong(t *testing.T)             { runProfile(t, "long") }
func TestProfileSlowBank(t *testing.T)         { runProfile(t, "slow-bank") }
func TestProfilePausedDispatcher(t *testing.T) { runProfile(t, "paused-dispatcher") }
func TestProfileSleepers(t *testing.T)         { runProfile(t, "sleepers") }

func runProfile(t *testing.T, name string) {
	if testing.Short() {
		t.Skip("a chaos profile takes half a minute")
	}
	testkit.Heavy(t) // a fleet of worker processes
	cfg, err := chaos.ProfileConfig(name, true)
	require.NoError(t, err)
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
	require.Empty(t, res.Violations, "profile %s seed %d: %d violations:\n%s", name, res.Seed, len(res.Violations), workflowtest.FormatViolations(res.Violations))
	require.True(t, res.OK())
	require.Positive(t, res.Chaos.Kills+res.Chaos.Stops, "the profile must hit workers")
}
