package reconcile

import (
	"context"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/stepwise-go/stepwise/internal/ledger"
	"github.com/stepwise-go/stepwise/outbox"
)

// ResolveParams is a person's decision about an operation the reconciler could not settle.
type ResolveParams struct {
	// OperationID is the operation decided on. Required.
	OperationID uuid.UUID
	// Outcome is the decision: SUCCEEDED (it happened), FAILED_PERMANENT (it did not and
	// will not), or RETRYABLE (it did not: send it again, under the same id). Required.
	Outcome outbox.State
	// ExpectedState is the state the person saw when deciding: MANUAL or UNKNOWN_EXTERNAL.
	// The decision is refused with ErrStateChanged if the operation has moved since.
	// Required.
	ExpectedState outbox.State
	// Actor names the person, for the audit trail. Required.
	Actor string
	// Reason says why, for the audit trail (a ticket, what the bank's support said).
	// Required.
	Reason string
	// ExternalRef is the external system's reference, when the person found one.
	ExternalRef string
}

// Resolve records a person's decision about a MANUAL or UNKNOWN_EXTERNAL operation: audited,
// with the kind's outcome callback in the same transaction, and only if the operation is still
// in the state the person saw (ErrStateChanged otherwise). A RETRYABLE decision also wakes the
// dispatcher when ctx carries a River client (see outbox.ContextWithClient); otherwise the
// outbox's poll sends it.
func (r *Reconciler) Resolve(ctx context.Context, params *ResolveParams) (*outbox.Operation, error) {
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
func (r *Reconciler) ResolveTx(ctx context.Context, tx pgx.Tx, params *ResolveParams) (*outbox.Operation, error) {
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
	}
	op, err := ledger.TransitionOneTx[*outbox.Operation](ctx, r.ob, tx, ledger.Move{
		OperationID: p.OperationID,
		From:        string(p.ExpectedState),
		To:          string(p.Outcome),
		Actor:       p.Actor,
		Reason:      p.Reason,
		ExternalRef: p.ExternalRef,
		Detail:      map[string]any{"resolution": "manual"},
	})
	if err != nil {
		return nil, fmt.Errorf("resolving operation %s: %w", p.OperationID, err)
	}
	if op.State == outbox.StateRetryable {
		if _, err := ledger.Wake(ctx, tx, op.Kind); err != nil {
			return nil, err
		}
	}
	return op, nil
}
