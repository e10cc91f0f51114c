package outbox

import (
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/stepwise-go/stepwise/internal/tracing"
)

// The outbox's spans (docs/design.md, *Tracing*). Attributes are built only when the span
// records: with the default no-op provider a send costs the span's start and end.

// endEnqueueSpan ends Enqueue's span with what it wrote.
func endEnqueueSpan(span trace.Span, ops []EnqueueParams, res *EnqueueResult, err error) {
	if span.IsRecording() {
		span.SetAttributes(attribute.Int("stepwise.enqueue.operations", len(ops)))
		if len(ops) > 0 {
			span.SetAttributes(attribute.String("stepwise.operation.kind", ops[0].Kind))
		}
		if len(ops) == 1 {
			span.SetAttributes(attribute.String("stepwise.operation.id", ops[0].ID.String()))
		}
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		} else if res != nil {
			span.SetAttributes(attribute.Int("stepwise.enqueue.inserted", res.Inserted),
				attribute.Int("stepwise.enqueue.existing", len(res.Existing)))
		}
	}
	span.End()
}

// endSendSpan ends a send's span: the operation, its claim, the link to where it was enqueued,
// and the outcome class its answer proves (Classify: SUCCEEDED, RETRYABLE,
// FAILED_PERMANENT or UNKNOWN_EXTERNAL). The state recorded may still differ (RETRYABLE past
// MaxAttempts becomes MANUAL; a stale claim records nothing).
func endSendSpan(span trace.Span, kind string, op *Operation, r sendResult) {
	if span.IsRecording() {
		tracing.LinkTo(span, op.TraceParent)
		class := Classify(r.err)
		span.SetAttributes(
			attribute.String("stepwise.operation.id", op.ID.String()),
			attribute.String("stepwise.operation.kind", kind),
			attribute.String("stepwise.operation.business_key", op.BusinessKey),
			attribute.Int("stepwise.operation.claim", op.Claims),
			attribute.Int("stepwise.operation.attempt", op.Attempts+1),
			attribute.String("stepwise.send.outcome", string(class)),
		)
		if op.RunKey != "" {
			span.SetAttributes(attribute.String("stepwise.run.key", op.RunKey))
		}
		if r.receipt.ExternalRef != "" {
			span.SetAttributes(attribute.String("stepwise.operation.external_ref", r.receipt.ExternalRef))
		}
		if r.abandoned {
			span.SetAttributes(attribute.Bool("stepwise.send.abandoned", true))
		}
		if r.err != nil {
			span.RecordError(r.err)
			span.SetStatus(codes.Error, r.err.Error())
		}
	}
	span.End()
}
