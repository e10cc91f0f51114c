package outbox

import (
	"context"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/trace"

	"github.com/stepwise-go/stepwise/internal/outbox"
	"github.com/stepwise-go/stepwise/stepwisetype"
)

// The ledger's machinery lives in an internal package, run by stepwise.Client; this package
// is what a program touches: the operation and its states, Enqueue, the Sender a kind is
// delivered through, and the errors and classifications a Sender returns.

// Operation is one external operation in the ledger, as a Sender receives it and the
// client's OperationGet returns it. Its ID is the operation_id the external system sees
// (IdempotencyKey).
type Operation = outbox.Operation

// State is where an operation is in its life; see the package documentation for the table
// of states and transitions.
type State = outbox.State

// The states of an operation.
const (
	StatePending         = outbox.StatePending
	StateProcessing      = outbox.StateProcessing
	StateSucceeded       = outbox.StateSucceeded
	StateFailedPermanent = outbox.StateFailedPermanent
	StateRetryable       = outbox.StateRetryable
	StateUnknownExternal = outbox.StateUnknownExternal
	StateManual          = outbox.StateManual
)

// MaxPayloadBytes bounds an operation's Payload, checked by Enqueue before any SQL runs
// (ErrPayloadTooLarge). A kind (at most 48 characters) and a business key (at most 255 bytes)
// are checked too; their errors name the limit.
const MaxPayloadBytes = outbox.MaxPayloadBytes

// EnqueueParams describes one operation to Enqueue: its kind, business key, payload and, for
// money, amount and currency.
type EnqueueParams = outbox.EnqueueParams

// EnqueueResult is what Enqueue did: the operations inserted and those already there.
type EnqueueResult = outbox.EnqueueResult

// Enqueue records operations in tx, the transaction of the business change that causes them,
// so that they commit or vanish with it. The operation_id defaults to OperationID(kind,
// business key): enqueueing the same operation twice is a no-op, and the same id with a
// different payload, amount or currency is ErrOperationConflict. A kind no process
// registered (stepwise.Client.Start, RegisterKinds) is ErrUnknownKind. In a step, or any job
// a stepwise.Client works, the kind's dispatcher is woken right after tx commits; outside
// them, enqueue through stepwise.Client.OperationEnqueueTx for the same. Elsewhere (no
// client in ctx, or a worker of a River client stepwise.NewClient did not build) nothing is
// woken, and the poll finds the operations, within the outbox's PollInterval.
func Enqueue(ctx context.Context, tx pgx.Tx, ops ...EnqueueParams) (*EnqueueResult, error) {
	return outbox.Enqueue(ctx, tx, ops...)
}

// OperationID is the default operation_id of an operation: a UUID v5 of its kind and
// business key, so that a step run twice names the same operations.
func OperationID(kind, businessKey string) uuid.UUID { return outbox.OperationID(kind, businessKey) }

// DatedOperationID is an operation_id for a ledger that will hold years: a UUID v8 whose first
// 48 bits are the business date (its midnight, in Unix milliseconds) and the rest a hash of
// kind and business key. A day's operations then sit together in every index keyed by the
// id, where OperationID's random ids make each new operation write a page of a years-long
// index that nobody wrote since the last checkpoint. Set EnqueueParams.ID to it; the date (its
// UTC calendar day) must come from the step's input, never the clock, so that a step run twice
// names the same operations. Switch a kind to it from a business date no running build has
// enqueued yet, never for a date in progress: a step whose commit a failover lost would
// enqueue again, under the new id, a payment the bank already has under the old one.
func DatedOperationID(date time.Time, kind, businessKey string) uuid.UUID {
	return outbox.DatedOperationID(date, kind, businessKey)
}

// RegisterKinds records kinds in the database so that Enqueue accepts them, for a program
// that enqueues before any stepwise.Client configured with those kinds has started (its
// Start registers them too). actor names who registered them. It is idempotent.
func RegisterKinds(ctx context.Context, db stepwisetype.DBTX, actor string, kinds ...string) error {
	return outbox.RegisterKinds(ctx, db, actor, kinds...)
}

// Sender performs the operations of a kind against the external system
// (stepwise.KindConfig.Sender), under op.IdempotencyKey():
//
//	Send(ctx context.Context, op *Operation) (Receipt, error)
//
// Its error decides the next state (Classify): return NotSent only with proof that the
// request never left, Permanent for a definite refusal; anything else is UNKNOWN_EXTERNAL.
type Sender = outbox.Sender

// SendFunc is a function as a Sender.
type SendFunc = outbox.SendFunc

// Receipt is what a Sender returns for an operation the external system confirmed.
type Receipt = outbox.Receipt

// Outcome is one recorded transition of an operation, as an outcome callback sees it.
type Outcome = outbox.Outcome

// OperationOutcome is an operation with the transition just recorded for it.
type OperationOutcome = outbox.OperationOutcome

// OutcomeFunc moves business state with one operation's transition, in the transaction
// that records it (stepwise.KindConfig.OnOutcome).
type OutcomeFunc = outbox.OutcomeFunc

// OutcomeBatchFunc is OutcomeFunc for a batch of transitions recorded together
// (stepwise.KindConfig.OnOutcomeBatch).
type OutcomeBatchFunc = outbox.OutcomeBatchFunc

// Config tunes the dispatchers (stepwise.Config.Outbox); the kinds themselves are configured
// in stepwise.Config.Kinds. Every zero field takes its default (stepwise.Config.WithDefaults
// shows them).
type Config struct {
	// ID names this process in the ledger's lease (leased_by) and audit events.
	//
	// Defaults to "<hostname>/<pid>".
	ID string

	// Logger receives what cannot be returned: a batch whose outcome callback keeps failing.
	// Records logged inside a traced send carry its trace_id and span_id.
	//
	// Defaults to stepwise.Config.Logger.
	Logger *slog.Logger

	// TracerProvider gives the tracer of the "stepwise.send" span of each send, linked to
	// the span that enqueued the operation (docs/design.md, *Tracing*).
	//
	// Defaults to stepwise.Config.TracerProvider.
	TracerProvider trace.TracerProvider

	// PollInterval is how often the poll (a River periodic job on the leader, and the
	// maintenance loop of every started client) looks for due operations no dispatcher was
	// woken for: operations enqueued outside a River worker, RETRYABLE ones whose backoff
	// elapsed, and PROCESSING ones whose lease expired.
	//
	// Defaults to 1s, River's minimum for a periodic job.
	PollInterval time.Duration

	// Slice is how long one dispatcher job delivers before it returns to River and queues
	// itself again, so that a busy kind never looks stuck to River.
	//
	// Defaults to 30s.
	Slice time.Duration

	// DispatcherLease is how long a kind's dispatcher may go without proving it is alive
	// (it heartbeats every DispatcherLease/4) before the poll starts a takeover dispatcher
	// beside it: delivery after a kill -9 resumes about DispatcherLease + PollInterval later.
	// Shorter recovers faster but risks a takeover beside a dispatcher stalled on a slow
	// database; a takeover beside a live dispatcher is safe (claims skip locked rows,
	// outcomes are fenced by claim), only wasteful.
	//
	// Defaults to 5s.
	DispatcherLease time.Duration
}

// Defaults of the sending limits of stepwise.KindConfig: the value an unset (zero) field
// takes. Config's own defaults (the dispatchers' pacing) are in its fields' documentation.
const (
	BatchSizeDefault   = outbox.BatchSizeDefault   // KindConfig.BatchSize
	ConcurrencyDefault = outbox.ConcurrencyDefault // KindConfig.Concurrency
	TimeoutDefault     = outbox.TimeoutDefault     // KindConfig.Timeout
	LeaseDefault       = outbox.LeaseDefault       // KindConfig.Lease
	MaxAttemptsDefault = outbox.MaxAttemptsDefault // KindConfig.MaxAttempts
)

// DefaultRetryBackoff waits 1s, 2s, 4s, ... up to 10 minutes before the attempt-th resend,
// each with ±25% jitter (stepwise.KindConfig.RetryBackoff when unset).
func DefaultRetryBackoff(attempt int) time.Duration { return outbox.DefaultRetryBackoff(attempt) }

// Permanent marks err as a definite refusal by the external system: FAILED_PERMANENT.
func Permanent(err error) error { return outbox.Permanent(err) }

// NotSent marks err as proof that the request never reached the external system: RETRYABLE,
// resent later under the same id. Return it only with that proof; anything else is
// UNKNOWN_EXTERNAL, for the reconciler.
func NotSent(err error) error { return outbox.NotSent(err) }

// IsPermanent reports whether err is, or wraps, an error made by Permanent.
func IsPermanent(err error) bool { return outbox.IsPermanent(err) }

// IsNotSent reports whether err is, or wraps, an error made by NotSent.
func IsNotSent(err error) bool { return outbox.IsNotSent(err) }

// Classify is the state a Sender's error leads to: SUCCEEDED for nil, FAILED_PERMANENT for
// Permanent, RETRYABLE for NotSent, UNKNOWN_EXTERNAL for anything else.
func Classify(err error) State { return outbox.Classify(err) }

// ConflictError is returned (matching ErrOperationConflict) by Enqueue for an operation whose
// id is already in the ledger with another payload, amount or currency.
type ConflictError = outbox.ConflictError

// StateChangedError is returned (matching stepwisetype.ErrChanged) by a move that expected a state
// or version the operation is no longer in.
type StateChangedError = outbox.StateChangedError

// Errors of the ledger. An operation id that is not in the ledger is an error matching
// stepwisetype.ErrNotFound; a move refused because the operation changed, one matching
// stepwisetype.ErrChanged (a *StateChangedError says how).
var (
	ErrOperationConflict = outbox.ErrOperationConflict
	ErrPayloadTooLarge   = outbox.ErrPayloadTooLarge
	ErrInvalidOperation  = outbox.ErrInvalidOperation
	ErrInvalidTransition = outbox.ErrInvalidTransition
	ErrUnknownKind       = outbox.ErrUnknownKind
)

// Request is one request of an operation (stepwise.Client.OperationRequestList): a Send call
// begun under a claim, or a claim lost with a dispatcher that died holding it (StartedAt nil:
// a request may or may not have begun). With Operation.Claims it tells an operation sent
// twice from one merely claimed twice.
type Request = outbox.Request
