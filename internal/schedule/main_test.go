package schedule_test

import (
	"context"
	"io"
	"log/slog"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise"
	"github.com/stepwise-go/stepwise/internal/testkit"
	"github.com/stepwise-go/stepwise/internal/workflow"
)

func TestMain(m *testing.M) {
	os.Exit(testkit.Main(m))
}

func quietLogger() *slog.Logger {
	if os.Getenv("STEPWISE_TEST_VERBOSE") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

func mustPool(t testing.TB, url string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), url)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// waitRun polls until the run is in one of statuses, or fails the test after timeout.
func waitRun(t testing.TB, pool *pgxpool.Pool, key string, timeout time.Duration, statuses ...workflow.RunStatus) *workflow.Run {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		run, err := workflow.GetRun(context.Background(), pool, key)
		require.NoError(t, err)
		if slices.Contains(statuses, run.Status) {
			return run
		}
		if time.Now().After(deadline) {
			t.Fatalf("run %q is %s after %s, want one of %v", key, run.Status, timeout, statuses)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// fastRetry retries failed jobs after 50ms instead of River's back-off.
type fastRetry struct{}

func (fastRetry) NextRetry(*rivertype.JobRow) time.Time { return time.Now().Add(50 * time.Millisecond) }

// operator is the operator client a person's tools use to read and pause schedules.
func operator(t testing.TB, pool *pgxpool.Pool) *stepwise.Client {
	t.Helper()
	c, err := stepwise.NewOperatorClient(pool)
	require.NoError(t, err)
	return c
}
