package workflowtest_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/workflowtest"
)

// TestRunChaosRecordsWorkerLives: the report knows every process it started, when the killed
// ones died and when the frozen ones were paused, under the IDs WorkerID gave them; Target
// aims the hits.
func TestRunChaosRecordsWorkerLives(t *testing.T) {
	began := time.Now()
	var targeted int
	report, err := workflowtest.RunChaos(context.Background(), &workflowtest.ChaosConfig{
		Start:     func() (workflowtest.Worker, error) { return workflowtest.Start(t, "ready-and-block"), nil },
		Workers:   2,
		Seed:      7,
		KillMin:   100 * time.Millisecond,
		KillMax:   200 * time.Millisecond,
		StopEvery: 2,
		StopFor:   300 * time.Millisecond,
		Duration:  1500 * time.Millisecond,
		Until:     func(context.Context) (bool, error) { return false, nil },
		WorkerID:  func(w workflowtest.Worker) string { return fmt.Sprintf("w%d", w.Pid()) },
		Target: func(_ context.Context, ids []string) int {
			targeted++
			if ids[1] != "" {
				return 1 // always the second slot when it can be hit
			}
			return -1
		},
		QuietTimeout: time.Millisecond,
	})
	require.NoError(t, err)
	t.Log(report)
	require.Positive(t, targeted)
	require.Positive(t, report.Kills)
	require.Positive(t, report.Stops)
	require.Len(t, report.Workers, report.Starts)
	var died, paused int
	for _, w := range report.Workers {
		require.Equal(t, fmt.Sprintf("w%d", w.Pid), w.ID)
		require.False(t, w.Started.Before(began))
		if !w.Died.IsZero() {
			died++
			require.True(t, w.Died.After(w.Started))
		}
		for _, p := range w.Paused {
			paused++
			require.False(t, p.To.IsZero(), "every pause is closed by SIGCONT: %+v", p)
			require.GreaterOrEqual(t, p.To.Sub(p.From), 300*time.Millisecond)
		}
	}
	require.Equal(t, report.Kills, died)
	require.Equal(t, report.Stops, paused)
	live := report.Liveness(5*time.Second, 0)
	require.Len(t, live.Workers, len(report.Workers))
}
