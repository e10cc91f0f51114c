package workflow_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/riverqueue/river"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/stepwise-go/stepwise/internal/testkit"
	"github.com/stepwise-go/stepwise/internal/workflow"
)

// TestTraceOfATakeover: maintenance's takeover of a run whose worker vanished has a span
// (run key, outcome taken_over) and the job it queues carries that span's traceparent, so the
// run's next attempt links to the takeover rather than to nothing. Guards against a takeover
// that an operator following a slow run's trace cannot see.
func TestTraceOfATakeover(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	exporter := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exporter))
	e := newEnv(t, testkit.DB(t), &workflow.Config{Lease: time.Second, TracerProvider: tp}, nil, map[string]river.QueueConfig{})
	_, err := workflow.Start(ctx, e.client, "stalled", countArgs{Total: 10, Batch: 1, Table: "items"}, nil)
	require.NoError(t, err)
	fakeAttempt(t, e, "stalled")

	res, err := e.engine.Maintain(ctx, e.client)
	require.NoError(t, err)
	require.Equal(t, []string{"stalled"}, res.TakenOver)

	var takeover *tracetest.SpanStub
	for _, s := range exporter.GetSpans() {
		if s.Name == "stepwise.takeover" {
			takeover = &s
		}
	}
	require.NotNil(t, takeover, "no stepwise.takeover span")
	got := map[string]string{}
	for _, kv := range takeover.Attributes {
		got[string(kv.Key)] = kv.Value.String()
	}
	require.Equal(t, "stalled", got["stepwise.run.key"])
	require.Equal(t, "taken_over", got["stepwise.takeover.outcome"])

	run, err := workflow.GetRun(ctx, e.pool, "stalled")
	require.NoError(t, err)
	var traceParent string
	require.NoError(t, e.pool.QueryRow(ctx, `SELECT coalesce(metadata->>'stepwise_traceparent', '') FROM river_job WHERE id = $1`, *run.RiverJobID).Scan(&traceParent))
	sc := takeover.SpanContext
	require.Equal(t, fmt.Sprintf("00-%s-%s-01", sc.TraceID(), sc.SpanID()), traceParent,
		"the takeover's job carries the takeover span's traceparent")
}
