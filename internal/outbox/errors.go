package outbox

import (
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/google/uuid"

	"github.com/stepwise-go/stepwise/internal/errkind"
)

// ErrOperationConflict is returned by Enqueue when an operation with the same id, or the same
// kind and business key, already exists with a different payload, amount or currency. The
// error is a *ConflictError naming both. It means two pieces of code disagree about what one
// external effect is, and sending either could pay the wrong amount: it is never resolved
// silently.
var ErrOperationConflict = errors.New("operation conflicts with an existing one")

// ErrPayloadTooLarge is returned by Enqueue for a payload over MaxPayloadBytes.
var ErrPayloadTooLarge = errors.New("operation payload too large")

// ErrInvalidOperation is returned by Enqueue for an operation that could never be stored: a
// bad kind, business key, payload or currency. The message names the field and the fix.
var ErrInvalidOperation = errors.New("invalid operation")

// ErrNotFound is returned by Get when no operation has the id.
var ErrNotFound = errkind.NotFound("operation not found")

// ErrStateChanged is returned (by reconcile.Resolve, say) when an operation is no longer in
// the state the caller expected: somebody else moved it first. Read it again and decide again.
var ErrStateChanged = errkind.Changed("operation state changed")

// ErrInvalidTransition is returned (by reconcile.Resolve, say) for a move the state machine
// does not allow, such as SUCCEEDED to RETRYABLE.
var ErrInvalidTransition = errors.New("invalid operation state transition")

// ErrUnknownKind is returned when an operation's kind has no KindConfig: by Enqueue when no
// Outbox has registered the kind in the database (a typo, or no process delivers it), and by
// the Outbox's methods for a kind it is not configured for. The message names the kind and
// the known ones.
var ErrUnknownKind = errors.New("operation kind not configured")

// ConflictError is the error of ErrOperationConflict: it names the operation being enqueued
// and the one already in the ledger.
type ConflictError struct {
	New      EnqueueParams
	Existing Operation
	// NewPayloadHash is the sha256 of the new payload's canonical jsonb text, comparable with
	// Existing.PayloadHash.
	NewPayloadHash []byte
}

func (e *ConflictError) Error() string {
	return fmt.Sprintf("%s: enqueuing %s (%s %q, amount %d %s, payload sha256 %s) but %s (%s %q, amount %d %s, payload sha256 %s, state %s) exists; "+
		"the same operation must always carry the same payload — use a new business key for a different effect",
		ErrOperationConflict.Error(),
		e.New.ID, e.New.Kind, e.New.BusinessKey, e.New.Amount, e.New.Currency, shortHash(e.NewPayloadHash),
		e.Existing.ID, e.Existing.Kind, e.Existing.BusinessKey, e.Existing.Amount, e.Existing.Currency,
		shortHash(e.Existing.PayloadHash), e.Existing.State)
}

// Is makes errors.Is(err, ErrOperationConflict) true.
func (e *ConflictError) Is(target error) bool { return target == ErrOperationConflict }

func shortHash(h []byte) string {
	s := hex.EncodeToString(h)
	if len(s) > 12 {
		s = s[:12]
	}
	return s
}

// StateChangedError is the error of ErrStateChanged.
type StateChangedError struct {
	OperationID uuid.UUID
	Expected    State
	Actual      State
	// ExpectedVersion and ActualVersion are set when the caller gave the version it saw
	// (reconcile.ResolveOpts.ExpectedVersion): the state may be the same, the operation
	// has moved since (and come back).
	ExpectedVersion, ActualVersion int64
}

func (e *StateChangedError) Error() string {
	if e.ExpectedVersion != 0 && e.Actual == e.Expected && e.ActualVersion > e.ExpectedVersion {
		return fmt.Sprintf("%s: operation %s is %s again, but not the %s you saw: it changed state %d time(s) since (version %d, not %d); read it again before deciding",
			ErrStateChanged.Error(), e.OperationID, e.Actual, e.Expected, e.ActualVersion-e.ExpectedVersion, e.ActualVersion, e.ExpectedVersion)
	}
	if e.ExpectedVersion != 0 {
		return fmt.Sprintf("%s: operation %s is %s (version %d), not %s (version %d) as expected; read it again before deciding",
			ErrStateChanged.Error(), e.OperationID, e.Actual, e.ActualVersion, e.Expected, e.ExpectedVersion)
	}
	return fmt.Sprintf("%s: operation %s is %s, not %s as expected; read it again before deciding",
		ErrStateChanged.Error(), e.OperationID, e.Actual, e.Expected)
}

// Is makes errors.Is(err, ErrStateChanged) and errors.Is(err, stepwisetype.ErrChanged) true.
func (e *StateChangedError) Is(target error) bool { return errors.Is(ErrStateChanged, target) }

// PermanentError marks a Sender's error as a definite refusal by the external system. Build
// it with Permanent.
type PermanentError struct{ Err error }

func (e *PermanentError) Error() string { return "permanent: " + errString(e.Err) }
func (e *PermanentError) Unwrap() error { return e.Err }

// NotSentError marks a Sender's error as proof that the external system did not act on the
// request. Build it with NotSent.
type NotSentError struct{ Err error }

func (e *NotSentError) Error() string { return "not sent: " + errString(e.Err) }
func (e *NotSentError) Unwrap() error { return e.Err }

func errString(err error) string {
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}

// Permanent marks err as the external system's definite refusal (a declined payment, an
// invalid account): the operation becomes FAILED_PERMANENT and is never sent again. Only
// wrap errors that prove the refusal; when in doubt return err as is, and the operation
// becomes UNKNOWN_EXTERNAL for the reconciler to settle.
func Permanent(err error) error { return &PermanentError{Err: err} }

// NotSent marks err as proof that the request had no effect: it never reached the external
// system, or the external system said it did not process it (429 with a not-processed marker
// it documents). The operation becomes RETRYABLE and is sent again, under the same id, after
// a backoff. A timeout or a reset after the request left is not proof: do not wrap those.
//
// Judge "never reached" by what happened on the wire, not by the error's text. net/http
// resends a POST carrying a canonical Idempotency-Key header by itself when the kept-alive
// connection it was written on dies, and returns the resend's error only: "connection
// refused" can then follow a request the external system processed. Package outbox/httpsend
// sends a request without such resends and returns its failure wrapped in NotSent only when
// the wire proves the other side cannot have received it (no connection was obtained, or the
// header block was never completely written).
func NotSent(err error) error { return &NotSentError{Err: err} }

// IsPermanent reports whether err was marked with Permanent.
func IsPermanent(err error) bool {
	var e *PermanentError
	return errors.As(err, &e)
}

// IsNotSent reports whether err was marked with NotSent.
func IsNotSent(err error) bool {
	var e *NotSentError
	return errors.As(err, &e)
}

// Classify maps a Sender's result to the state the operation moves to. A nil error is
// SUCCEEDED; Permanent is FAILED_PERMANENT; NotSent is RETRYABLE; everything else (timeouts,
// resets, ambiguous 5xx, unclassified errors, a cancelled context, a panic) is
// UNKNOWN_EXTERNAL, because the request may have taken effect and only a lookup can tell.
// Permanent wins over NotSent when an error carries both.
func Classify(err error) State {
	switch {
	case err == nil:
		return StateSucceeded
	case IsPermanent(err):
		return StateFailedPermanent
	case IsNotSent(err):
		return StateRetryable
	default:
		return StateUnknownExternal
	}
}
