// Package tracing is the OpenTelemetry plumbing shared by workflow, outbox and reconcile: the
// tracer each gets from its configured TracerProvider, the W3C traceparent carried with a
// run's job and with an operation, and the log handler that stamps records with the trace
// and span ids of the context they are logged in.
//
// Nothing here configures an exporter: without one (otel's default, global no-op provider)
// every span is non-recording and the helpers below do no work beyond what the no-op API
// costs (docs/design.md, *Tracing*).
package tracing

import (
	"context"
	"log/slog"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// Scope is the instrumentation scope name of Stepwise's spans.
const Scope = "github.com/stepwise-go/stepwise/stepwisetype"

// Tracer returns Stepwise's tracer from tp, or from otel's global provider when tp is nil.
// The global provider delegates to whatever otel.SetTracerProvider installs later, so a
// component built before the application sets up tracing still traces.
func Tracer(tp trace.TracerProvider) trace.Tracer {
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	return tp.Tracer(Scope)
}

// TraceParent returns the W3C traceparent of the span context in ctx, or "" when ctx holds
// none (tracing off, or no span started).
func TraceParent(ctx context.Context) string {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return ""
	}
	c := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, c)
	return c["traceparent"]
}

// SpanContext parses a W3C traceparent written by TraceParent; the zero SpanContext (not
// valid) for "" or anything unparsable, so a damaged value never fails the work it rides on.
func SpanContext(traceparent string) trace.SpanContext {
	if traceparent == "" {
		return trace.SpanContext{}
	}
	ctx := propagation.TraceContext{}.Extract(context.Background(), propagation.MapCarrier{"traceparent": traceparent})
	return trace.SpanContextFromContext(ctx)
}

// LinkTo adds a link from span to the span named by traceparent, when span records and the
// traceparent is valid.
func LinkTo(span trace.Span, traceparent string) {
	if traceparent == "" || !span.IsRecording() {
		return
	}
	if sc := SpanContext(traceparent); sc.IsValid() {
		span.AddLink(trace.Link{SpanContext: sc})
	}
}

// Logger returns l with a handler that adds trace_id and span_id to every record logged with
// a context holding a valid span context, so an operator can go from a log line to its trace.
// A logger already wrapped is returned as it is.
func Logger(l *slog.Logger) *slog.Logger {
	if l == nil {
		return nil
	}
	if _, ok := l.Handler().(*logHandler); ok {
		return l
	}
	return slog.New(&logHandler{inner: l.Handler()})
}

type logHandler struct{ inner slog.Handler }

func (h *logHandler) Enabled(ctx context.Context, level slog.Level) bool {
	return h.inner.Enabled(ctx, level)
}

func (h *logHandler) Handle(ctx context.Context, r slog.Record) error {
	if ctx != nil {
		if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
			r = r.Clone()
			r.AddAttrs(slog.String("trace_id", sc.TraceID().String()), slog.String("span_id", sc.SpanID().String()))
		}
	}
	return h.inner.Handle(ctx, r)
}

func (h *logHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &logHandler{inner: h.inner.WithAttrs(attrs)}
}

func (h *logHandler) WithGroup(name string) slog.Handler {
	return &logHandler{inner: h.inner.WithGroup(name)}
}
