package schedule_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/internal/schedule"
	"github.com/stepwise-go/stepwise/internal/testkit"
)

// BenchmarkScheduleTick measures materialization: each iteration is one tick that catches up
// 50 per-minute slots of 4 shards (200 runs with their River jobs, one transaction). It
// reports runs/s and slots/s, the rate a catch-up after an outage can reach.
func BenchmarkScheduleTick(b *testing.B) {
	const perTick, shards = 50, 4
	sb := setupScheduler(b, testkit.DB(b), nil)
	require.NoError(b, schedule.Add(sb.sched,
		settleSchedule("bench", "* * * * *", schedule.CatchUpAll{Max: 1 << 30, PerTick: perTick}, schedule.OverlapAllowAll, shards)))
	sb.tick(b, "bench")
	ctx := context.Background()
	b.ResetTimer()
	start := time.Now()
	for range b.N {
		sb.clock.Add(perTick * time.Minute)
		res, err := sb.sched.Tick(ctx, sb.client)
		if err != nil {
			b.Fatal(err)
		}
		if n := len(res.Schedule("bench").Materialized); n != perTick {
			b.Fatalf("tick materialized %d slots, want %d", n, perTick)
		}
	}
	elapsed := time.Since(start).Seconds()
	b.ReportMetric(float64(b.N*perTick*shards)/elapsed, "runs/s")
	b.ReportMetric(float64(b.N*perTick)/elapsed, "slots/s")
}

// BenchmarkScheduleTickIdle measures a tick with nothing due: the steady-state cost of a
// schedule between its slots (row lock, definition check, in-flight slot refresh).
func BenchmarkScheduleTickIdle(b *testing.B) {
	sb := setupScheduler(b, testkit.DB(b), nil)
	require.NoError(b, schedule.Add(sb.sched,
		settleSchedule("idle", "@daily", schedule.CatchUpAll{}, schedule.OverlapBufferAll, 8)))
	sb.tick(b, "idle")
	ctx := context.Background()
	b.ResetTimer()
	start := time.Now()
	for range b.N {
		if _, err := sb.sched.Tick(ctx, sb.client); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "ticks/s")
}
