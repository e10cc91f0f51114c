package outbox

import (
	"context"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// This file is what package reconcile and the console use of the ledger beyond the public
// API: the select list of an operation row, its scanner, and the Outbox's transitions
// without the dispatcher's claim. All of it is exported from this internal package only;
// the public package outbox shows none of it.

// columnsTmpl is the select list of an operation row, in the order ScanOperation reads it,
// with {a} standing for a table alias.
const columnsTmpl = `{a}.operation_id, {a}.kind, {a}.business_key, {a}.payload, {a}.payload_hash,
	coalesce({a}.amount, 0), coalesce({a}.currency, ''), coalesce({a}.run_key, ''), {a}.state, {a}.attempts,
	{a}.checks, {a}.lease_until, coalesce({a}.leased_by, ''), {a}.next_attempt_at, {a}.next_check_at,
	{a}.last_sent_at, {a}.unknown_since, coalesce({a}.external_ref, ''), coalesce({a}.last_error, ''),
	coalesce({a}.last_lookup, ''), coalesce({a}.manual_reason, ''), {a}.created_at, {a}.updated_at,
	{a}.finished_at, {a}.claims, {a}.claimed_at, {a}.in_flight_until, {a}.version, coalesce({a}.trace_parent, '')`

// Columns returns the select list that ScanOperation reads, with every column qualified by
// alias (as "o").
func Columns(alias string) string { return strings.ReplaceAll(columnsTmpl, "{a}", alias) }

// Move is one transition of one operation asked by the reconciler or a person: the Outbox's
// own transition without the dispatcher's claim and request.
type Move struct {
	OperationID uuid.UUID
	// From is the state the mover saw; the move happens only if the operation is still in it.
	From, To State
	// Checks, when not zero, must equal the operation's checks: a reconciler records the
	// result of its own lookup only, never over an overlapping pass's.
	Checks int
	// Actor is who moves it, for the audit event. Required.
	Actor       string
	ExternalRef string
	Error       string
	Reason      string
	Lookup      string
	// NextAt is when a RETRYABLE operation is sent again, or an UNKNOWN_EXTERNAL one checked.
	NextAt time.Time
	Detail map[string]any
}

func (m Move) transition() transition {
	return transition{OperationID: m.OperationID, From: m.From, To: m.To, Checks: m.Checks,
		Actor: m.Actor, ExternalRef: m.ExternalRef, Error: m.Error, Reason: m.Reason, Lookup: m.Lookup,
		NextAt: m.NextAt, Detail: m.Detail}
}

// MoveTx moves operations in tx with the kinds' outcome callbacks and returns the outcomes
// recorded; moves whose guard no longer holds are absent.
//
// A move into RETRYABLE also wakes its kind's dispatcher in tx, with the River client of ctx
// (a worker's context, or ContextWithClient); without one the poll finds the operation. The
// dispatcher's own moves do not: it is running, and sends them again itself.
func (o *Outbox) MoveTx(ctx context.Context, tx pgx.Tx, ms []Move) ([]OperationOutcome, error) {
	ts := make([]transition, len(ms))
	for i, m := range ms {
		ts[i] = m.transition()
	}
	out, err := o.transitionTx(ctx, tx, ts)
	if err != nil {
		return nil, err
	}
	var retry []string
	for _, oo := range out {
		if oo.Outcome.To == StateRetryable {
			retry = append(retry, oo.Op.Kind)
		}
	}
	if _, err := wake(ctx, tx, retry...); err != nil {
		return nil, err
	}
	return out, nil
}

// MoveOneTx is MoveTx for one move. It returns the operation after the move, or an error
// matching ErrStateChanged or ErrNotFound.
func (o *Outbox) MoveOneTx(ctx context.Context, tx pgx.Tx, m Move) (*Operation, error) {
	op, err := o.transitionOneTx(ctx, tx, m.transition())
	if err != nil {
		return nil, err
	}
	if op.State == StateRetryable {
		if _, err := wake(ctx, tx, op.Kind); err != nil {
			return nil, err
		}
	}
	return op, nil
}
