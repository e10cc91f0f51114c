package settlement

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/google/uuid"

	"github.com/stepwise-go/stepwise"
	"github.com/stepwise-go/stepwise/outbox"
	"github.com/stepwise-go/stepwise/stepwisetype"
)

// Resolution is a person's decision about a payout the machines could not settle.
type Resolution struct {
	// OperationID is the payout's operation id.
	OperationID uuid.UUID
	// From is the state the person saw; the resolution applies only if the payout is still
	// in it, so a decision taken on a stale screen never overrides the reconciler's (or a
	// colleague's). Empty means "the current state", which must then be MANUAL or
	// UNKNOWN_EXTERNAL.
	From outbox.State
	// SeenVersion is the payout's Version the person saw. Required (1 or more): a payout that
	// left From and came back (MANUAL because never sent, then sent, then MANUAL because the
	// bank holds another amount) looks the same by state, and is refused as stale by version.
	SeenVersion int64
	// To is SUCCEEDED (the bank paid: e.g. confirmed by phone), FAILED_PERMANENT (it did not
	// and will not) or RETRYABLE (send again, under the same operation id).
	To outbox.State
	// Actor is who decides, for the audit trail. Required.
	Actor string
	// Reason says why, for the audit trail. Required.
	Reason string
}

// Resolve applies a person's decision to a payout through the client (OperationResolve):
// in one transaction the ledger move, its audit event, and the settlement's status through the
// payout's outcome callback, as for any other outcome — and only if the payout is still in
// the state and at the version the person saw (ErrStaleState otherwise, nothing changed). An operation id that
// names no payout is ErrNoSuchSettlement.
func Resolve(ctx context.Context, client *stepwise.Client, r Resolution) (*outbox.Operation, error) {
	switch r.To {
	case outbox.StateSucceeded, outbox.StateFailedPermanent, outbox.StateRetryable:
	default:
		return nil, fmt.Errorf("resolving to %q: want SUCCEEDED, FAILED_PERMANENT or RETRYABLE", r.To)
	}
	switch r.From {
	case "", outbox.StateManual, outbox.StateUnknownExternal:
	default:
		return nil, fmt.Errorf("resolving from %q: only MANUAL and UNKNOWN_EXTERNAL payouts are resolved by hand; leave From empty for the current state", r.From)
	}
	if strings.TrimSpace(r.Reason) == "" {
		return nil, errors.New("resolving needs a reason: it is kept in the audit trail")
	}
	if strings.TrimSpace(r.Actor) == "" {
		return nil, errors.New("resolving needs an actor: who decides, for the audit trail")
	}
	if r.SeenVersion < 1 {
		// Guards against a decision on what the payout is when this runs rather than on what
		// the person saw: there is no resolution by state alone.
		return nil, fmt.Errorf("resolving payout %s: SeenVersion %d: pass the payout's Version the person decided on (1 or more)", r.OperationID, r.SeenVersion)
	}
	cur, err := readPayout(ctx, client, r.OperationID)
	if err != nil {
		return nil, err
	}
	from := r.From
	if from == "" {
		// "The state I am looking at": read now, and the move below is still conditional on
		// it, so a change in between is refused, not overwritten.
		from = cur.State
		if from != outbox.StateManual && from != outbox.StateUnknownExternal {
			return nil, fmt.Errorf("%w: payout %s (%s) is %s; only MANUAL and UNKNOWN_EXTERNAL payouts are resolved by hand",
				ErrNotResolvable, r.OperationID, cur.BusinessKey, cur.State)
		}
	}
	seen := r.SeenVersion
	op, err := client.OperationResolve(ctx, r.OperationID, &stepwise.OperationResolveOpts{
		Outcome: r.To, ExpectedState: from, ExpectedVersion: seen, Actor: r.Actor, Reason: r.Reason,
	})
	var changed *outbox.StateChangedError
	switch {
	case errors.As(err, &changed):
		now, _ := client.OperationGet(ctx, r.OperationID)
		when := ""
		if now != nil {
			when = fmt.Sprintf(" (last change %s)", now.UpdatedAt.UTC().Format("2006-01-02 15:04:05Z"))
		}
		why := ""
		if now != nil && now.ManualReason != "" {
			why = fmt.Sprintf("; why MANUAL now: %q", now.ManualReason)
		}
		// What the person saw: the version always, the state when they said it (with From
		// empty, the state compared was the one read just now, not theirs).
		saw := fmt.Sprintf("version %d", changed.ExpectedVersion)
		if r.From != "" {
			saw = fmt.Sprintf("%s at version %d", r.From, changed.ExpectedVersion)
		}
		return nil, fmt.Errorf("%w: payout %s (%s) is %s at version %d now, not %s as you saw%s%s; nothing was changed: look again before deciding",
			ErrStaleState, r.OperationID, cur.BusinessKey, changed.Actual, changed.ActualVersion, saw, when, why)
	case err != nil:
		return nil, err
	}
	return op, nil
}

// readPayout reads the payout id names: ErrNoSuchSettlement for an id that names no
// operation, or an operation of another kind.
func readPayout(ctx context.Context, client *stepwise.Client, id uuid.UUID) (*outbox.Operation, error) {
	cur, err := client.OperationGet(ctx, id)
	if errors.Is(err, stepwisetype.ErrNotFound) {
		return nil, fmt.Errorf("%w: operation %s does not exist; find open payouts with \"report --date D --json\"", ErrNoSuchSettlement, id)
	}
	if err != nil {
		return nil, err
	}
	if cur.Kind != PayoutKind {
		return nil, fmt.Errorf("%w: operation %s is a %q, not a payout", ErrNoSuchSettlement, id, cur.Kind)
	}
	return cur, nil
}

// Resolvable reads the payout id names and says whether a person may decide on it now: a
// payout (ErrNoSuchSettlement otherwise), MANUAL or UNKNOWN_EXTERNAL (ErrNotResolvable), and
// in from when from is set (ErrStaleState). It changes nothing; it is how a tool shows the
// person the version to decide on (Resolution.SeenVersion).
func Resolvable(ctx context.Context, client *stepwise.Client, id uuid.UUID, from outbox.State) (*outbox.Operation, error) {
	cur, err := readPayout(ctx, client, id)
	if err != nil {
		return nil, err
	}
	if from != "" && cur.State != from {
		return nil, fmt.Errorf("%w: payout %s (%s) is %s now, not %s as you saw; nothing was changed: look again before deciding",
			ErrStaleState, id, cur.BusinessKey, cur.State, from)
	}
	if cur.State != outbox.StateManual && cur.State != outbox.StateUnknownExternal {
		return nil, fmt.Errorf("%w: payout %s (%s) is %s; only MANUAL and UNKNOWN_EXTERNAL payouts are resolved by hand",
			ErrNotResolvable, id, cur.BusinessKey, cur.State)
	}
	return cur, nil
}
