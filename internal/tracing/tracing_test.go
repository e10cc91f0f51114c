package tracing

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// TestLoggerCarriesTraceAndSpanIDs: a record logged with a span's context carries its ids, one
// logged without a span carries none, and attributes and groups of the wrapped logger still
// go through it.
func TestLoggerCarriesTraceAndSpanIDs(t *testing.T) {
	var buf bytes.Buffer
	l := Logger(slog.New(slog.NewTextHandler(&buf, nil))).With("component", "test")
	if Logger(l) != l {
		t.Fatal("a wrapped logger is wrapped again")
	}
	tp := sdktrace.NewTracerProvider()
	ctx, span := tp.Tracer("t").Start(context.Background(), "s")
	l.InfoContext(ctx, "inside")
	span.End()
	l.InfoContext(context.Background(), "outside")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("want 2 lines, got %q", buf.String())
	}
	sc := span.SpanContext()
	for _, want := range []string{"component=test", "trace_id=" + sc.TraceID().String(), "span_id=" + sc.SpanID().String()} {
		if !strings.Contains(lines[0], want) {
			t.Errorf("inside a span: %q lacks %q", lines[0], want)
		}
	}
	if strings.Contains(lines[1], "trace_id") {
		t.Errorf("outside a span: %q carries a trace id", lines[1])
	}
}

// TestTraceParentRoundTrip: what TraceParent writes, SpanContext reads back; nothing and
// garbage read as no span context, so a damaged column never fails a send.
func TestTraceParentRoundTrip(t *testing.T) {
	tp := sdktrace.NewTracerProvider()
	ctx, span := tp.Tracer("t").Start(context.Background(), "s")
	defer span.End()
	got := SpanContext(TraceParent(ctx))
	if got.TraceID() != span.SpanContext().TraceID() || got.SpanID() != span.SpanContext().SpanID() {
		t.Fatalf("round trip: %v, want %v", got, span.SpanContext())
	}
	for _, bad := range []string{"", "00-zz", strings.Repeat("x", 55)} {
		if SpanContext(bad).IsValid() {
			t.Errorf("%q read as a valid span context", bad)
		}
	}
	if TraceParent(context.Background()) != "" {
		t.Error("a context without a span has a traceparent")
	}
}

// TestNoopStepAllocations bounds what tracing costs a step with the default provider (otel's
// global, no-op until one is installed): the step span's start and end, the checks of
// whether it records, and Enqueue's look at the caller's span. Guards against attributes or
// options built outside span.IsRecording(), which would allocate on every step of every
// user who never turned tracing on.
func TestNoopStepAllocations(t *testing.T) {
	for name, tracer := range map[string]trace.Tracer{"global": Tracer(nil), "noop": Tracer(noop.NewTracerProvider())} {
		ctx := context.Background()
		allocs := testing.AllocsPerRun(1000, func() {
			sctx, span := tracer.Start(ctx, "stepwise.step")
			if span.IsRecording() {
				t.Fatal("the default provider records")
			}
			// Enqueue: the traceparent to store, and whether to open its own span.
			if TraceParent(sctx) != "" || trace.SpanFromContext(sctx).IsRecording() {
				t.Fatal("a no-op span has a traceparent")
			}
			span.End()
		})
		t.Logf("%s provider: %.0f allocations per step for tracing", name, allocs)
		if allocs > 3 {
			t.Errorf("%s provider: tracing allocates %.0f objects per step; want at most 3", name, allocs)
		}
	}
}
