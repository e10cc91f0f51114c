// Package ledger is the operation ledger's plumbing shared by outbox, reconcile and console:
// the select list of an operation row and the hooks through which reconcile and console reach
// outbox internals. It keeps that plumbing out of outbox's public API (go doc ./outbox shows
// only what users call).
//
// Package outbox installs the hooks in its init; every user of the hooks imports outbox, so
// they are set before any call. The hooks carry outbox's own types as any, because this
// package cannot import outbox (outbox imports it); the generic wrappers assert them back, and
// a mismatch panics on the first call, in the tests.
package ledger

import (
	"context"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// columnsTmpl is the select list of an operation row, in the order outbox scans it, with {a}
// standing for a table alias.
const columnsTmpl = `{a}.operation_id, {a}.kind, {a}.business_key, {a}.payload, {a}.payload_hash,
	coalesce({a}.amount, 0), coalesce({a}.currency, ''), coalesce({a}.run_key, ''), {a}.state, {a}.attempts,
	{a}.checks, {a}.lease_until, coalesce({a}.leased_by, ''), {a}.next_attempt_at, {a}.next_check_at,
	{a}.last_sent_at, {a}.unknown_since, coalesce({a}.external_ref, ''), coalesce({a}.last_error, ''),
	coalesce({a}.last_lookup, ''), coalesce({a}.manual_reason, ''), {a}.created_at, {a}.updated_at,
	{a}.finished_at, {a}.claims, {a}.claimed_at, {a}.in_flight_until, {a}.version, coalesce({a}.trace_parent, '')`

// Columns returns the select list that Scan reads, with every column qualified by alias (as
// "o").
func Columns(alias string) string { return strings.ReplaceAll(columnsTmpl, "{a}", alias) }

// Move is one transition of one operation asked by the reconciler or a person: outbox's own
// transition without the dispatcher's claim and request. From and To are outbox.State values.
type Move struct {
	OperationID uuid.UUID
	// From is the state the mover saw; the move happens only if the operation is still in it.
	From, To string
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

// Hooks is what package outbox installs with Install.
type Hooks struct {
	// Scan scans a row selected with Columns, followed by extra destinations, into an
	// *outbox.Operation.
	Scan func(row pgx.Row, extra ...any) (any, error)
	// TransitionTx moves operations in tx with ob's outcome callbacks (ob is an
	// *outbox.Outbox) and returns the []outbox.OperationOutcome recorded; moves whose guard
	// no longer holds are absent. A move into RETRYABLE also wakes its kind's dispatcher in
	// tx when ctx carries a River client.
	TransitionTx func(ctx context.Context, ob any, tx pgx.Tx, ms []Move) (any, error)
	// TransitionOneTx is TransitionTx for one move, returning the *outbox.Operation, or an
	// error matching outbox.ErrStateChanged or outbox.ErrNotFound.
	TransitionOneTx func(ctx context.Context, ob any, tx pgx.Tx, m Move) (any, error)
}

var hooks Hooks

// Install sets the hooks. Package outbox calls it once, in its init.
func Install(h Hooks) { hooks = h }

// Scan scans a row selected with Columns (and extra destinations) into Op, *outbox.Operation.
func Scan[Op any](row pgx.Row, extra ...any) (Op, error) {
	v, err := hooks.Scan(row, extra...)
	if err != nil {
		var zero Op
		return zero, err
	}
	return v.(Op), nil
}

// TransitionTx moves operations in tx through the Outbox ob; Out is outbox.OperationOutcome.
func TransitionTx[Out any](ctx context.Context, ob any, tx pgx.Tx, ms []Move) ([]Out, error) {
	v, err := hooks.TransitionTx(ctx, ob, tx, ms)
	if err != nil {
		return nil, err
	}
	return v.([]Out), nil
}

// TransitionOneTx moves one operation in tx through the Outbox ob; Op is *outbox.Operation.
func TransitionOneTx[Op any](ctx context.Context, ob any, tx pgx.Tx, m Move) (Op, error) {
	v, err := hooks.TransitionOneTx(ctx, ob, tx, m)
	if err != nil {
		var zero Op
		return zero, err
	}
	return v.(Op), nil
}
