//go:build unix

package workflow_test

import (
	"context"
	"fmt"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// BenchmarkStepTracing measures what tracing costs a step, paired in one run: the same steps
// (one row and one outbox operation each, enqueued inside River's worker) as hand-written pgx
// (floor), as Stepwise runs with the default provider (noop: otel's global provider, nothing
// installed) and as Stepwise runs with an SDK provider that samples and records every span
// (sdk: batched to an exporter that drops them, so the export's own I/O is left out). Chunks
// rotate floor/noop/sdk, sdk/noop/floor, so load drifting on a shared machine lands on all
// alike. Reported: noop/floor and sdk/floor (throughput ratios, 1.00: free), sdk/noop, and per
// step of each variant the heap allocations and the CPU time of this process (user + system,
// River's background included). On a shared machine the throughput ratios move with the
// database's load; the process's CPU per step is what tracing itself adds.
//
//	go test ./workflow -run '^$' -bench StepTracing -benchtime 3000x
func BenchmarkStepTracing(b *testing.B) {
	const rows = 1
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()),
		sdktrace.WithBatcher(tracetest.NewNoopExporter()))
	b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	noop := newOvhRig(b, ovhDB(b), rows, true, 2, nil)
	traced := newOvhRig(b, ovhDB(b), rows, true, 2, tp)

	chunk := max(b.N/12, 1)
	var took [3]time.Duration
	var mallocs [3]uint64
	var cpu [3]time.Duration
	var ms runtime.MemStats
	var ru syscall.Rusage
	cpuNow := func() time.Duration {
		require.NoError(b, syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	order := [][3]int{{0, 1, 2}, {2, 1, 0}}
	b.ResetTimer()
	for i := range 4 {
		for _, v := range order[i%2] {
			key := fmt.Sprintf("trc/%d/%d", i, v)
			runtime.ReadMemStats(&ms)
			before, cpuBefore := ms.Mallocs, cpuNow()
			switch v {
			case 0:
				took[v] += noop.floor(b, key, chunk)
			case 1:
				took[v] += noop.stepwise(b, key, chunk)
			case 2:
				took[v] += traced.stepwise(b, key, chunk)
			}
			cpu[v] += cpuNow() - cpuBefore
			runtime.ReadMemStats(&ms)
			mallocs[v] += ms.Mallocs - before
		}
	}
	b.StopTimer()
	require.Positive(b, took[2])
	steps := float64(4 * chunk)
	b.ReportMetric(took[0].Seconds()/took[1].Seconds(), "noop/floor")
	b.ReportMetric(took[0].Seconds()/took[2].Seconds(), "sdk/floor")
	b.ReportMetric(took[1].Seconds()/took[2].Seconds(), "sdk/noop")
	b.ReportMetric(float64(mallocs[0])/steps, "floor_allocs/step")
	b.ReportMetric(float64(mallocs[1])/steps, "noop_allocs/step")
	b.ReportMetric(float64(mallocs[2])/steps, "sdk_allocs/step")
	b.ReportMetric(float64(cpu[0].Microseconds())/steps, "floor_cpu_µs/step")
	b.ReportMetric(float64(cpu[1].Microseconds())/steps, "noop_cpu_µs/step")
	b.ReportMetric(float64(cpu[2].Microseconds())/steps, "sdk_cpu_µs/step")
}
