package workflowtest_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/workflowtest"
)

// TestCheckWakesFailsOnLateAndTimedOutWakes: a wake asleep past the bound and a timed-out wait
// are violations; a wake whose run was taken over in between is measured from the takeover.
func TestCheckWakesFailsOnLateAndTimedOutWakes(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	bound := 3 * time.Second
	stats, vs := workflowtest.CheckWakes([]workflowtest.Wake{
		{Run: "prompt", SatisfiedAt: at(0), StepAt: at(50)},
		{Run: "late", SatisfiedAt: at(0), StepAt: at(3500)},
		{Run: "taken-over", SatisfiedAt: at(0), StepAt: at(4000), Takeovers: []time.Time{at(-100), at(2500)}},
		{Run: "timed-out", SatisfiedAt: at(0), StepAt: at(100), TimedOut: true},
	}, bound)
	require.Len(t, vs, 2, "%v", vs)
	require.Equal(t, workflowtest.NameWakeLate, vs[0].Name)
	require.Contains(t, vs[0].Evidence, "run late")
	require.Equal(t, workflowtest.NameWaitTimedOut, vs[1].Name)
	require.Contains(t, vs[1].Evidence, "run timed-out")
	require.Equal(t, 4, stats.Wakes)
	require.Equal(t, 1, stats.TakenOver)
	require.Equal(t, 3500*time.Millisecond, stats.Max)
	require.Equal(t, 4000*time.Millisecond, stats.RawMax)
	require.Equal(t, 1500*time.Millisecond, workflowtest.Wake{SatisfiedAt: at(0), StepAt: at(4000), Takeovers: []time.Time{at(2500)}}.Asleep())
}

// A wake whose worker was frozen after satisfaction is measured from the thaw.
func TestWakeAsleepFromThaw(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	w := workflowtest.Wake{SatisfiedAt: at(0), StepAt: at(3000), Paused: []workflowtest.Interval{{From: at(100), To: at(2600)}, {From: at(5000), To: at(6000)}}}
	require.Equal(t, 400*time.Millisecond, w.Asleep())
}
