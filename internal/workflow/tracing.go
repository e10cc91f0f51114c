package workflow

import (
	"errors"

	"github.com/riverqueue/river/rivertype"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/stepwise-go/stepwise/internal/checkpoint"
)

// The Engine's spans (docs/design.md, *Tracing*). Every helper here does its work only when
// the span records: with the default no-op provider a step costs the span's start and end,
// nothing more (step_bench_test.go measures it).

// endAttemptSpan ends an attempt's span with how the attempt ended. A snooze or a cancel is
// how River is told what comes next, not an error of the attempt.
func endAttemptSpan(span trace.Span, err error) {
	if span.IsRecording() {
		var (
			snooze *rivertype.JobSnoozeError
			cancel *rivertype.JobCancelError
		)
		outcome := "returned"
		switch {
		case err == nil:
		case errors.As(err, &snooze):
			outcome = "snoozed"
			span.SetAttributes(attribute.String("stepwise.attempt.snooze", snooze.Duration.String()))
		case errors.As(err, &cancel):
			outcome = "cancelled"
			span.SetAttributes(attribute.String("stepwise.attempt.cancel", cancel.Error()))
		default:
			outcome = "error"
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
		span.SetAttributes(attribute.String("stepwise.attempt.outcome", outcome))
	}
	span.End()
}

// endClaimSpan ends a claim's span: claimed, held (another owner's live lease), moved (the
// run changed between the read and the claim), undecodable_cursor, awaiting_newer_worker (a
// cursor newer than this worker reads, released untouched) or error.
func endClaimSpan(span trace.Span, key, owner string, lease *checkpoint.Lease, outcome string, err error) {
	if span.IsRecording() {
		span.SetAttributes(attribute.String("stepwise.run.key", key), attribute.String("stepwise.claim.owner", owner),
			attribute.String("stepwise.claim.outcome", outcome))
		if lease != nil {
			span.SetAttributes(attribute.Int64("stepwise.token", lease.Token), attribute.Int64("stepwise.steps", lease.Steps))
		}
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
	}
	span.End()
}

// nextNames are the names of a step's outcomes on its span.
var nextNames = [...]string{nextUnset: "unset", nextContinue: "continue", nextDone: "done", nextSleep: "sleep", nextFail: "fail", nextWait: "wait"}

// recordStepSpan records a step on its (recording) span: run key, step number, fencing token,
// the items the step reported (items < 0: none reported), and what came of it.
func recordStepSpan(span trace.Span, key string, number, token int64, items int, res stepResult, err error) {
	span.SetAttributes(attribute.String("stepwise.run.key", key), attribute.Int64("stepwise.step", number),
		attribute.Int64("stepwise.token", token))
	if items >= 0 {
		span.SetAttributes(attribute.Int("stepwise.step.items", items))
	}
	if err != nil {
		if errors.Is(err, checkpoint.ErrFenced) {
			span.SetAttributes(attribute.Bool("stepwise.fenced", true))
		}
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
		return
	}
	span.SetAttributes(attribute.String("stepwise.step.next", nextNames[res.next.kind]), attribute.Bool("stepwise.step.released", res.released))
}

// endTakeoverSpan ends the span of maintenance's rescue of one run: taken_over (re-enqueued
// under a new job, whose attempts link to this span), failed (a crash loop, or its job
// ended), or skipped (its worker came back, or another pass got there first).
func endTakeoverSpan(span trace.Span, s stuckRun, outcome string, err error) {
	if span.IsRecording() {
		span.SetAttributes(attribute.String("stepwise.run.key", s.key), attribute.Int64("stepwise.token", s.token),
			attribute.String("stepwise.takeover.outcome", outcome))
		if s.jobID != nil {
			span.SetAttributes(attribute.Int64("stepwise.job.id", *s.jobID))
		}
		if err != nil && !errors.Is(err, errSkip) {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
	}
	span.End()
}
