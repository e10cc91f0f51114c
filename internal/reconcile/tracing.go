package reconcile

import (
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/stepwise-go/stepwise/internal/outbox"
	"github.com/stepwise-go/stepwise/internal/tracing"
)

// endCheckSpan ends a reconciler check's span (docs/design.md, *Tracing*): the operation, the
// number of the check, the link to where the operation was enqueued, what the lookup said and
// the state it decides (stepwise.check.decided: the state the operation moves to, or
// UNKNOWN_EXTERNAL when it waits for a later check). Built only when the span records.
func endCheckSpan(span trace.Span, kind string, op *outbox.Operation, d decision, lookupErr error) {
	if span.IsRecording() {
		tracing.LinkTo(span, op.TraceParent)
		decided := string(d.to)
		if d.stay {
			decided = string(outbox.StateUnknownExternal)
		}
		span.SetAttributes(
			attribute.String("stepwise.operation.id", op.ID.String()),
			attribute.String("stepwise.operation.kind", kind),
			attribute.String("stepwise.operation.business_key", op.BusinessKey),
			attribute.Int("stepwise.check", op.Checks),
			attribute.String("stepwise.check.result", d.result),
			attribute.String("stepwise.check.decided", decided),
		)
		if op.RunKey != "" {
			span.SetAttributes(attribute.String("stepwise.run.key", op.RunKey))
		}
		if d.ref != "" {
			span.SetAttributes(attribute.String("stepwise.operation.external_ref", d.ref))
		}
		if lookupErr != nil {
			span.RecordError(lookupErr)
			span.SetStatus(codes.Error, lookupErr.Error())
		}
	}
	span.End()
}
