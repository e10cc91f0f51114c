package outbox

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/stepwise-go/stepwise/internal/runwait"
)

// transition is one move of one operation, for transitionTx.
type transition struct {
	OperationID uuid.UUID
	// From is the state the mover saw. The move happens only if the operation is still in it.
	From State
	To   State
	// Claim, when not zero, must equal the operation's claims: a dispatcher records the
	// outcome of its own claim only, never over a later one.
	Claim int
	// Checks, when not zero, must equal the operation's checks: a reconciler records the
	// result of its own lookup only, never over an overlapping pass's.
	Checks int
	// Actor is who moves it, for the audit event. Required.
	Actor string
	// ExternalRef, when not empty, is kept as the external system's reference.
	ExternalRef string
	// Error, when not empty, becomes last_error (bounded).
	Error string
	// Reason is the reason of a move to MANUAL, or of a manual resolution.
	Reason string
	// Lookup, when not empty, is the reconciler's last lookup result.
	Lookup string
	// NextAt is when a RETRYABLE operation is sent again, or when an UNKNOWN_EXTERNAL one is
	// checked. Defaults to now.
	NextAt time.Time
	// Detail is extra audit detail for the event.
	Detail map[string]any

	// request is what the dispatcher knows about the request of the claim it records (set
	// only by package outbox, for moves out of PROCESSING).
	request *requestRecord
}

// requestRecord describes the request made under one claim, for stepwise_operation_request.
// Times are durations before the recording statement, so that every stamp in the ledger comes
// from the database's clock while the durations come from the dispatcher's monotonic clock.
type requestRecord struct {
	// lost: the dispatcher died holding the claim; a request may have begun. Otherwise a
	// Send call began startAgo before the statement and returned endAgo before it.
	lost     bool
	startAgo time.Duration
	endAgo   time.Duration
	// timeout is the kind's send Timeout: the request cannot be in flight longer (from our
	// side) than its start plus this.
	timeout time.Duration
}

// transitionSQL applies a batch of transitions with one UPDATE and one INSERT of audit events:
// set-based, never one round trip per operation. The WHERE clause is the state machine's
// guard: the state the mover saw and, when given, its claim or check.
var transitionSQL = `
WITH n AS (
	SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::int[], $5::int[], $6::text[], $7::text[],
		$8::text[], $9::text[], $10::timestamptz[], $11::text[], $12::jsonb[], $13::text[], $14::bigint[], $15::bigint[], $16::bigint[])
		AS n(id, from_state, to_state, claim, checks, external_ref, err, reason, lookup, next_at, actor, detail,
			req, start_ago_us, end_ago_us, timeout_us)
), u AS (
	UPDATE stepwise_operation o SET
		state           = n.to_state,
		lease_until     = NULL,
		leased_by       = NULL,
		external_ref    = coalesce(n.external_ref, o.external_ref),
		last_error      = coalesce(n.err, o.last_error),
		last_lookup     = coalesce(n.lookup, o.last_lookup),
		manual_reason   = CASE WHEN n.to_state = 'MANUAL' THEN n.reason ELSE o.manual_reason END,
		next_attempt_at = CASE WHEN n.to_state = 'RETRYABLE' THEN coalesce(n.next_at, now()) ELSE o.next_attempt_at END,
		next_check_at   = CASE WHEN n.to_state = 'UNKNOWN_EXTERNAL' THEN coalesce(n.next_at, now()) END,
		unknown_since   = CASE WHEN n.to_state = 'UNKNOWN_EXTERNAL' THEN now() END,
		checks          = CASE WHEN n.to_state = 'UNKNOWN_EXTERNAL' THEN 0 ELSE o.checks END,
		updated_at      = now(),
		finished_at     = CASE WHEN n.to_state IN ('SUCCEEDED', 'FAILED_PERMANENT') THEN now() END,
		-- attempts counts requests: one begun, or one that may have begun under a claim lost
		-- with its dispatcher. A claim dropped before Send is not a request.
		attempts        = o.attempts + CASE WHEN n.req IS NOT NULL THEN 1 ELSE 0 END,
		last_sent_at    = CASE WHEN n.req = 'sent'
			THEN statement_timestamp() - n.start_ago_us * interval '1 microsecond' ELSE o.last_sent_at END,
		-- Until when a request may still be on the wire, for the reconciler's grace: the
		-- request's start plus the send timeout, or the end of the claim (now, as the dispatcher
		-- records it; its lease expiry when the dispatcher died), whichever is later.
		in_flight_until = CASE WHEN n.from_state = 'PROCESSING' THEN greatest(o.in_flight_until,
			CASE WHEN n.req = 'sent' THEN statement_timestamp() - (n.start_ago_us - n.timeout_us) * interval '1 microsecond' END,
			CASE WHEN n.req = 'lost' THEN o.lease_until ELSE statement_timestamp() END)
			ELSE o.in_flight_until END
	FROM n
	WHERE o.operation_id = n.id
		AND o.state = n.from_state
		AND (n.claim = 0 OR o.claims = n.claim)
		AND (n.checks = 0 OR o.checks = n.checks)
	RETURNING o.*, n.from_state AS from_state, n.actor AS actor, n.err AS err, n.reason AS reason,
		jsonb_strip_nulls(jsonb_build_object('error', n.err, 'external_ref', n.external_ref,
			'reason', n.reason, 'lookup', n.lookup)) || coalesce(n.detail, '{}') AS detail,
		n.req AS req, n.end_ago_us AS end_ago_us
), e AS (
	INSERT INTO stepwise_event (subject, kind, from_state, to_state, actor, attempt, detail)
	SELECT 'op:' || u.operation_id, 'op.transition', u.from_state, u.state, u.actor, u.claims, u.detail FROM u
), r AS (
	-- The request of the claim, in the same statement as the outcome: no extra round trip.
	INSERT INTO stepwise_operation_request (operation_id, claim, actor, started_at, ended_at, outcome, error)
	SELECT u.operation_id, u.claims, u.actor,
		CASE WHEN u.req = 'sent' THEN u.last_sent_at END,
		CASE WHEN u.req = 'sent' THEN statement_timestamp() - u.end_ago_us * interval '1 microsecond' END,
		u.state, u.err
	FROM u WHERE u.req IS NOT NULL
	ON CONFLICT (operation_id, claim) DO NOTHING
)
SELECT ` + columnsOfU + `, from_state, actor, coalesce(err, ''), coalesce(reason, '') FROM u`

var columnsOfU = Columns("u")

// transitionTx moves operations along the state machine in tx, writes an audit event per
// move, and calls each kind's outcome callback in the same tx, so that business state moves
// with the ledger or not at all. A transition whose guard no longer holds (the operation left
// From, or its attempt or check moved on) is skipped: it is absent from the result. Use
// transitionOneTx to get ErrStateChanged for a single move instead.
//
// Package reconcile moves UNKNOWN_EXTERNAL and MANUAL operations with it.
func (o *Outbox) transitionTx(ctx context.Context, tx pgx.Tx, ts []transition) ([]OperationOutcome, error) {
	if len(ts) == 0 {
		return nil, nil
	}
	n := len(ts)
	var (
		ids      = make([][16]byte, n) // bytes, which pgx sends natively (see pgtx.UUIDs)
		froms    = make([]string, n)
		tos      = make([]string, n)
		claims   = make([]int32, n)
		checks   = make([]int32, n)
		reqs     = make([]*string, n)
		startAgo = make([]int64, n)
		endAgo   = make([]int64, n)
		timeouts = make([]int64, n)
		refs     = make([]*string, n)
		errs     = make([]*string, n)
		reasons  = make([]*string, n)
		lookups  = make([]*string, n)
		nextAts  = make([]*time.Time, n)
		actors   = make([]string, n)
		details  = make([]*string, n)
		seenIDs  = make(map[uuid.UUID]bool, n)
	)
	for i := range ts {
		t := &ts[i]
		if !CanTransition(t.From, t.To) || t.To == StateProcessing {
			return nil, fmt.Errorf("%w: operation %s from %s to %s", ErrInvalidTransition, t.OperationID, t.From, t.To)
		}
		if t.Actor == "" {
			return nil, fmt.Errorf("outbox: transition of operation %s has no Actor; name who moves it, for the audit trail", t.OperationID)
		}
		if seenIDs[t.OperationID] {
			return nil, fmt.Errorf("outbox: operation %s appears twice in one batch of transitions", t.OperationID)
		}
		seenIDs[t.OperationID] = true
		ids[i], froms[i], tos[i], actors[i] = t.OperationID, string(t.From), string(t.To), t.Actor
		claims[i], checks[i] = int32(t.Claim), int32(t.Checks)
		if rq := t.request; rq != nil {
			kind := "sent"
			if rq.lost {
				kind = "lost"
			}
			reqs[i] = &kind
			startAgo[i], endAgo[i], timeouts[i] = rq.startAgo.Microseconds(), rq.endAgo.Microseconds(), rq.timeout.Microseconds()
		}
		refs[i], reasons[i], lookups[i] = nonEmpty(t.ExternalRef), nonEmpty(t.Reason), nonEmpty(t.Lookup)
		errs[i] = nonEmpty(truncateError(t.Error))
		if !t.NextAt.IsZero() {
			at := t.NextAt
			nextAts[i] = &at
		}
		if len(t.Detail) > 0 {
			b, err := json.Marshal(t.Detail)
			if err != nil {
				return nil, fmt.Errorf("encoding audit detail of operation %s: %w", t.OperationID, err)
			}
			s := string(b)
			details[i] = &s
		}
	}
	rows, err := tx.Query(ctx, transitionSQL, ids, froms, tos, claims, checks, refs, errs, reasons, lookups, nextAts, actors, details,
		reqs, startAgo, endAgo, timeouts)
	if err != nil {
		return nil, fmt.Errorf("recording %d operation transitions: %w", n, err)
	}
	var out []OperationOutcome
	for rows.Next() {
		var oc Outcome
		var from string
		op, err := ScanOperation(rows, &from, &oc.Actor, &oc.Error, &oc.Reason)
		if err != nil {
			rows.Close()
			return nil, fmt.Errorf("recording %d operation transitions: %w", n, err)
		}
		oc.From, oc.To, oc.ExternalRef = State(from), op.State, op.ExternalRef
		out = append(out, OperationOutcome{Op: op, Outcome: oc})
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("recording %d operation transitions: %w", n, err)
	}
	if err := o.callOutcomes(ctx, tx, out); err != nil {
		return nil, err
	}
	if err := wakeWaitingRuns(ctx, tx, out); err != nil {
		return nil, err
	}
	o.metrics.transitions(out)
	return out, nil
}

// transitionOneTx is transitionTx for one operation. It returns a *StateChangedError
// (errors.Is ErrStateChanged) when the operation is no longer where t.From says, and
// ErrNotFound when there is no such operation.
func (o *Outbox) transitionOneTx(ctx context.Context, tx pgx.Tx, t transition) (*Operation, error) {
	out, err := o.transitionTx(ctx, tx, []transition{t})
	if err != nil {
		return nil, err
	}
	if len(out) == 1 {
		return out[0].Op, nil
	}
	cur, err := Get(ctx, tx, t.OperationID)
	if err != nil {
		return nil, err
	}
	return nil, &StateChangedError{OperationID: t.OperationID, Expected: t.From, Actual: cur.State}
}

// callOutcomes runs the outcome callbacks of each kind, grouped by kind, in tx.
func (o *Outbox) callOutcomes(ctx context.Context, tx pgx.Tx, out []OperationOutcome) error {
	byKind := map[string][]OperationOutcome{}
	var order []string
	for _, oo := range out {
		if _, ok := byKind[oo.Op.Kind]; !ok {
			order = append(order, oo.Op.Kind)
		}
		byKind[oo.Op.Kind] = append(byKind[oo.Op.Kind], oo)
	}
	for _, kind := range order {
		ks, ok := o.kinds[kind]
		if !ok {
			// Moving an operation without its business callback would leave business state
			// behind the ledger for good.
			return fmt.Errorf("%w: operation %s has kind %q, which this Outbox has no KindConfig for; its outcome callback cannot run",
				ErrUnknownKind, byKind[kind][0].Op.ID, kind)
		}
		batch := byKind[kind]
		switch {
		case ks.cfg.OnOutcomeBatch != nil:
			if err := ks.cfg.OnOutcomeBatch(ctx, tx, batch); err != nil {
				return &callbackError{fmt.Errorf("outcome callback of kind %q for %d operations: %w", kind, len(batch), err)}
			}
		case ks.cfg.OnOutcome != nil:
			for _, oo := range batch {
				if err := ks.cfg.OnOutcome(ctx, tx, oo.Op, oo.Outcome); err != nil {
					return &callbackError{fmt.Errorf("outcome callback of kind %q for operation %s (%s to %s): %w",
						kind, oo.Op.ID, oo.Outcome.From, oo.Outcome.To, err)}
				}
			}
		}
	}
	return nil
}

// nonEmpty maps "" to NULL.
func nonEmpty(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// callbackError marks an error returned by a user's outcome callback, as opposed to one of
// the database: the dispatcher isolates the first kind and retries the second.
type callbackError struct{ err error }

func (e *callbackError) Error() string { return e.err.Error() }
func (e *callbackError) Unwrap() error { return e.err }

// wakeWaitingRuns makes due, in tx, the runs waiting for their operations (workflow's
// WaitForOperations) that this batch of moves brought to rest: the satisfier's side of the
// wait protocol (package runwait), after the moves, in their transaction, so a commit that
// settles a run's last operation wakes it, and a crash before the commit loses neither.
// Only moves into a state that may be at rest count (MANUAL too: a wait may count it);
// one round trip for the batch when no run waits.
func wakeWaitingRuns(ctx context.Context, tx pgx.Tx, out []OperationOutcome) error {
	var keys []string
	for _, oo := range out {
		switch oo.Op.State {
		case StateSucceeded, StateFailedPermanent, StateManual:
			if oo.Op.RunKey != "" {
				keys = append(keys, oo.Op.RunKey)
			}
		}
	}
	if _, err := runwait.AfterWrite(ctx, tx, keys, "operations"); err != nil {
		return fmt.Errorf("waking runs that wait for their operations: %w", err)
	}
	return nil
}
