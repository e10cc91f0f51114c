package reconcile

import (
	"context"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/stepwise-go/stepwise/internal/reconcile"
	"github.com/stepwise-go/stepwise/stepwisetype"
)

// The reconciler itself lives in an internal package, run by stepwise.Client; this package is
// what a program implements (Checker, Statement) and calls (CompareTotals).

// Checker looks an operation up in the external system by its operation_id, when its outcome
// is unknown (stepwise.KindConfig.Checker):
//
//	Lookup(ctx context.Context, op *outbox.Operation) (LookupResult, error)
//
// An error is not an answer: the operation is checked again later.
type Checker = reconcile.Checker

// CheckerFunc is a function as a Checker.
type CheckerFunc = reconcile.CheckerFunc

// LookupResult is what the external system says about an operation: its Status, and for a
// found one its ExternalRef, Amount and Currency (compared with the ledger's).
type LookupResult = reconcile.LookupResult

// LookupStatus is the external system's answer about an operation.
type LookupStatus = reconcile.LookupStatus

// The answers a Checker gives.
const (
	// LookupFoundSucceeded: the external system applied the operation. SUCCEEDED.
	LookupFoundSucceeded = reconcile.LookupFoundSucceeded
	// LookupFoundFailed: the external system has it, refused. FAILED_PERMANENT.
	LookupFoundFailed = reconcile.LookupFoundFailed
	// LookupPending: the external system has it and has not decided. Checked again later.
	LookupPending = reconcile.LookupPending
	// LookupNotFound: the external system does not know the id. After the grace period,
	// RETRYABLE: sent again under the same id.
	LookupNotFound = reconcile.LookupNotFound
)

// Statement lists what the external system applied over a period, for CompareTotals
// (stepwise.KindConfig.Statement):
//
//	Entries(ctx context.Context, from, to time.Time) ([]StatementEntry, error)
type Statement = reconcile.Statement

// StatementFunc is a function as a Statement.
type StatementFunc = reconcile.StatementFunc

// StatementEntry is one effect on the external system's statement: the idempotency key it
// was applied under, its reference, amount and currency.
type StatementEntry = reconcile.StatementEntry

// TotalsParams selects what CompareTotals compares: a kind over [From, To). At most
// MaxDifferences differences of each DifferenceKind are listed (default 1,000); the rest
// are only counted.
type TotalsParams = reconcile.TotalsParams

// Totals is CompareTotals' answer: count and sum per currency on each side, and the
// differences. Match reports whether there are none; String prints it.
type Totals = reconcile.Totals

// Sum is a count and an amount in one currency.
type Sum = reconcile.Sum

// Difference is one effect that differs between the ledger and the statement.
type Difference = reconcile.Difference

// DifferenceKind is how an effect differs.
type DifferenceKind = reconcile.DifferenceKind

// The ways an effect differs.
const (
	DifferenceOnlyHere      = reconcile.DifferenceOnlyHere      // SUCCEEDED here, absent there
	DifferenceOnlyThere     = reconcile.DifferenceOnlyThere     // applied there, not SUCCEEDED here
	DifferenceAmountDiffers = reconcile.DifferenceAmountDiffers // on both sides, amounts or currencies differ
	DifferenceDuplicate     = reconcile.DifferenceDuplicate     // applied more than once there
)

// CompareTotals compares the ledger's SUCCEEDED operations of a kind over a period with the
// external system's Statement, effect by effect. The period's operations are streamed, never
// held: its memory does not grow with the day.
func CompareTotals(ctx context.Context, q stepwisetype.DBTX, stmt Statement, params *TotalsParams) (*Totals, error) {
	return reconcile.CompareTotals(ctx, q, stmt, params)
}

// Config tunes the reconciler (stepwise.Config.Reconcile); the kinds themselves are
// configured in stepwise.Config.Kinds. Every zero field takes its default
// (stepwise.Config.WithDefaults shows them).
type Config struct {
	// Actor names the reconciler in audit events.
	//
	// Defaults to "reconcile".
	Actor string

	// Interval is how often a reconciliation pass runs: a River periodic job on the leader,
	// and the maintenance loop of every started client.
	//
	// Defaults to 10s.
	Interval time.Duration

	// Slice is the longest one pass runs before it returns to River; the next pass goes on
	// where it stopped.
	//
	// Defaults to 1m.
	Slice time.Duration

	// Logger receives what cannot be returned: a transition whose outcome callback failed.
	// Records logged inside a traced check carry its trace_id and span_id.
	//
	// Defaults to stepwise.Config.Logger.
	Logger *slog.Logger

	// TracerProvider gives the tracer of the "stepwise.check" span of each lookup, linked to
	// the span that enqueued the operation (docs/design.md, *Tracing*).
	//
	// Defaults to stepwise.Config.TracerProvider.
	TracerProvider trace.TracerProvider
}

// Defaults of the reconciling limits of stepwise.KindConfig: the value an unset (zero) field
// takes. Config's own defaults (the pass's pacing) are in its fields' documentation.
const (
	BatchSizeDefault   = reconcile.BatchSizeDefault   // KindConfig.CheckBatchSize, at least (4 × CheckConcurrency when that is more)
	ConcurrencyDefault = reconcile.ConcurrencyDefault // KindConfig.CheckConcurrency
	TimeoutDefault     = reconcile.TimeoutDefault     // KindConfig.CheckTimeout
	GraceDefault       = reconcile.GraceDefault       // KindConfig.Grace
	GiveUpAfterDefault = reconcile.GiveUpAfterDefault // KindConfig.GiveUpAfter
	MaxChecksDefault   = reconcile.MaxChecksDefault   // KindConfig.MaxChecks
)

// DefaultCheckBackoff waits 5s, 10s, 20s, ... up to an hour before the next lookup, each with
// ±25% jitter (stepwise.KindConfig.CheckBackoff when unset).
func DefaultCheckBackoff(check int) time.Duration { return reconcile.DefaultCheckBackoff(check) }

// ErrInvalidResolution is returned by stepwise.Client.OperationResolve for a decision it
// cannot record: nil opts, an ExpectedVersion below 1, a missing or multi-line Actor or
// Reason, or an outcome or expected state a person may not choose (the outcome must be
// SUCCEEDED, FAILED_PERMANENT or RETRYABLE, the expected state MANUAL or UNKNOWN_EXTERNAL).
var ErrInvalidResolution = reconcile.ErrInvalidResolution
