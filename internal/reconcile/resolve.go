package reconcile

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/stepwise-go/stepwise/internal/audittext"
	"github.com/stepwise-go/stepwise/internal/outbox"
)

// ResolveOpts is a person's decision about an operation the reconciler could not settle.
type ResolveOpts struct {
	// OperationID is the operation decided on. Required.
	OperationID uuid.UUID
	// Outcome is the decision: SUCCEEDED (it happened), FAILED_PERMANENT (it did not and
	// will not), or RETRYABLE (it did not: send it again, under the same id). Required.
	Outcome outbox.State
	// ExpectedState is the state the person saw when deciding: MANUAL or UNKNOWN_EXTERNAL.
	// The decision is refused with outbox.ErrStateChanged if the operation has moved since.
	// Required.
	ExpectedState outbox.State
	// ExpectedVersion is the operation's Version the person saw, or 0 to check the state
	// only. With it, the decision is refused with outbox.ErrStateChanged if the operation moved
	// since, even if it is back in ExpectedState: MANUAL because "never sent", then sent
	// again, then MANUAL because "the bank holds 999 EUR" is another question, and an answer
	// to the first (FAILED_PERMANENT) would record a payment the bank made as failed. A tool
	// that shows operations to people should pass it.
	ExpectedVersion int64
	// Actor names the person, for the audit trail. Required.
	Actor string
	// Reason says why, for the audit trail (a ticket, what the bank's support said).
	// Required. Actor and Reason hold no control characters and no invisible or
	// bidirectional formatting characters (Unicode Cc, Cf, Zl, Zp): they would make the
	// audit trail read otherwise than it was written.
	Reason string
	// ExternalRef is the external system's reference, when the person found one.
	ExternalRef string
}

// Resolve records a person's decision about a MANUAL or UNKNOWN_EXTERNAL operation: audited,
// with the kind's outcome callback in the same transaction, and only if the operation is still
// in the state (and, with ExpectedVersion, the version) the person saw (outbox.ErrStateChanged
// otherwise, an *outbox.StateChangedError saying what it is now). A RETRYABLE decision also wakes the
// dispatcher when ctx carries a River client (see outbox.ContextWithClient); otherwise the
// outbox's poll sends it.
func (r *Reconciler) Resolve(ctx context.Context, params *ResolveOpts) (*outbox.Operation, error) {
	var op *outbox.Operation
	err := pgx.BeginFunc(ctx, r.db, func(tx pgx.Tx) error {
		var err error
		op, err = r.ResolveTx(ctx, tx, params)
		return err
	})
	return op, err
}

// ResolveTx is Resolve in the caller's transaction, for a tool that records the decision
// beside its own writes (a support ticket's state, say).
func (r *Reconciler) ResolveTx(ctx context.Context, tx pgx.Tx, params *ResolveOpts) (*outbox.Operation, error) {
	if params == nil {
		return nil, fmt.Errorf("%w: params are nil", ErrInvalidResolution)
	}
	p := *params
	switch {
	case p.OperationID == uuid.Nil:
		return nil, fmt.Errorf("%w: OperationID is required", ErrInvalidResolution)
	case p.Outcome != outbox.StateSucceeded && p.Outcome != outbox.StateFailedPermanent && p.Outcome != outbox.StateRetryable:
		return nil, fmt.Errorf("%w: outcome %q: a person may decide SUCCEEDED, FAILED_PERMANENT or RETRYABLE", ErrInvalidResolution, p.Outcome)
	case p.ExpectedState != outbox.StateManual && p.ExpectedState != outbox.StateUnknownExternal:
		return nil, fmt.Errorf("%w: expected state %q: only MANUAL and UNKNOWN_EXTERNAL operations are resolved by hand; pass the state you saw",
			ErrInvalidResolution, p.ExpectedState)
	case p.Actor == "":
		return nil, fmt.Errorf("%w: Actor is required: the audit trail names who decided", ErrInvalidResolution)
	case p.Reason == "":
		return nil, fmt.Errorf("%w: Reason is required: the audit trail says why", ErrInvalidResolution)
	case p.ExpectedVersion < 0:
		return nil, fmt.Errorf("%w: ExpectedVersion %d: pass the operation's Version as read, or 0 to check the state only", ErrInvalidResolution, p.ExpectedVersion)
	}
	if err := audittext.Check("Actor", p.Actor); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidResolution, err)
	}
	if err := audittext.Check("Reason", p.Reason); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidResolution, err)
	}
	if p.ExpectedVersion != 0 {
		// Guards against a decision on a stale screen whose state came back (ABA). The row
		// lock holds the version until this transaction ends, so the transition below moves
		// the operation the person saw, not a later episode of it.
		var state outbox.State
		var version int64
		err := tx.QueryRow(ctx, `SELECT state, version FROM stepwise_operation WHERE operation_id = $1 FOR UPDATE`, p.OperationID).Scan(&state, &version)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil, fmt.Errorf("resolving operation %s: %w", p.OperationID, outbox.ErrNotFound)
		}
		if err != nil {
			return nil, fmt.Errorf("resolving operation %s: reading its version: %w", p.OperationID, err)
		}
		if version != p.ExpectedVersion {
			return nil, fmt.Errorf("resolving operation %s: %w", p.OperationID, &outbox.StateChangedError{OperationID: p.OperationID,
				Expected: p.ExpectedState, Actual: state, ExpectedVersion: p.ExpectedVersion, ActualVersion: version})
		}
	}
	op, err := r.ob.MoveOneTx(ctx, tx, outbox.Move{
		OperationID: p.OperationID,
		From:        p.ExpectedState,
		To:          p.Outcome,
		Actor:       p.Actor,
		Reason:      p.Reason,
		ExternalRef: p.ExternalRef,
		Detail:      map[string]any{"resolution": "manual"},
	})
	if err != nil {
		return nil, fmt.Errorf("resolving operation %s: %w", p.OperationID, err)
	}
	return op, nil
}
