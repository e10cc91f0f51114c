package workflowtest

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/stepwise-go/stepwise/stepwisetype"
)

// Request is one request an external system received for an operation, as that system's own
// log (or a recording proxy in front of it) saw it. Fill a slice of them from your fake's or
// sandbox's log and pass it as CheckOpts.Requests: CheckInvariants then checks Stepwise's send
// discipline against what actually arrived, which an idempotent external system would hide.
//
// Times are wall-clock times of the machine the log was written on; the checks compare them
// with the database's now() in stepwise_event, so run the fake on a host whose clock agrees with
// the database server's (the same host, in tests).
type Request struct {
	// OperationID is the operation the request was for: the idempotency key it carried
	// (Operation.IdempotencyKey, the operation_id).
	OperationID string
	// Amount is the amount the request asked for, compared with the ledger's for effects.
	Amount int64
	// Arrived is when the request reached the external system. Required.
	Arrived time.Time
	// Decided is when the external system decided the request's effect (applied it, refused
	// it); a slow system decides after its caller hung up. Zero means at Arrived.
	Decided time.Time
	// Ended is when the request ended for the caller: the answer, or the caller hanging up
	// (its timeout). Zero means it never ended (still open when the log was read).
	Ended time.Time
	// Effect says the external system applied the request: money moved, or a decision was
	// recorded under it. A system that does not deduplicate makes every such request an
	// effect of its own.
	Effect bool
}

// busyUntil is the end of the time the request occupied the external system: until it was
// decided and until it ended for its caller, whichever is later. Open-ended requests are busy
// for ever.
func (r *Request) busyUntil() time.Time {
	if r.Ended.IsZero() {
		return time.Time{}
	}
	end := r.Ended
	if r.Decided.After(end) {
		end = r.Decided
	}
	return end
}

func (r *Request) String() string {
	ended := "never ended"
	if !r.Ended.IsZero() {
		ended = "ended " + stamp(r.Ended)
	}
	decided := ""
	if r.Decided.After(r.Arrived) {
		decided = ", decided " + stamp(r.Decided)
	}
	return fmt.Sprintf("request arrived %s%s, %s", stamp(r.Arrived), decided, ended)
}

func stamp(t time.Time) string { return t.UTC().Format("15:04:05.000") }

// opEvent is one op.transition of the ledger, as the request checks need it.
type opEvent struct {
	id, from, to, actor, resolution string
	at                              time.Time
}

// opRow is one operation of the ledger.
type opRow struct {
	amount *int64
	state  string
}

var terminalStates = map[string]bool{"SUCCEEDED": true, "FAILED_PERMANENT": true, "MANUAL": true}

// loadLedger reads the operations and their transitions that the request checks compare with.
// ledgerSQL are loadLedger's reads: the operations, and their transitions.
var ledgerSQL = []string{
	`SELECT operation_id::text, amount, state FROM stepwise_operation WHERE true{{runs:run_key}}`,
	`SELECT substr(subject, 4), coalesce(from_state, ''), coalesce(to_state, ''), coalesce(actor, ''),
	        coalesce(detail->>'resolution', ''), at
	   FROM stepwise_event WHERE kind = 'op.transition' AND subject LIKE 'op:%'{{opsubjects}} ORDER BY id`,
}

func loadLedger(ctx context.Context, q stepwisetype.DBTX, runs []string) (map[string]opRow, []opEvent, error) {
	sql, args := scoped(ledgerSQL[0], runs)
	rows, err := q.Query(ctx, sql, args...)
	if err != nil {
		return nil, nil, fmt.Errorf("reading operations: %w", err)
	}
	ops := map[string]opRow{}
	var id string
	var r opRow
	if _, err := pgx.ForEachRow(rows, []any{&id, &r.amount, &r.state}, func() error {
		ops[id] = r
		return nil
	}); err != nil {
		return nil, nil, fmt.Errorf("reading operations: %w", err)
	}
	// With runs, the events of their operations only: by subject, through its index.
	sql, args = scoped(ledgerSQL[1], runs)
	rows, err = q.Query(ctx, sql, args...)
	if err != nil {
		return nil, nil, fmt.Errorf("reading operation transitions: %w", err)
	}
	var events []opEvent
	var e opEvent
	if _, err := pgx.ForEachRow(rows, []any{&e.id, &e.from, &e.to, &e.actor, &e.resolution, &e.at}, func() error {
		events = append(events, e)
		return nil
	}); err != nil {
		return nil, nil, fmt.Errorf("reading operation transitions: %w", err)
	}
	return ops, events, nil
}

// Request-log invariants. Their numbers follow docs/design.md's invariant 3 (an external effect at
// most once per operation): each is a way to break it that an idempotent fake would absorb.
// The names are exported so a harness can count violations by kind (Violation.Name).
const (
	NameConcurrentRequests = "no two requests for one operation_id in flight at once"
	NameSendAfterTerminal  = "no request after the ledger recorded the operation terminal"
	NameEarlyResend        = "not-found is believed, and resent, only after the previous request ended plus the grace period"
	NameEffectMismatch     = "every effect matches exactly one ledger operation with the same amount"
)

// checkRequests checks a request log against the ledger's operations and transitions. grace
// is the reconciler's grace period. It is pure so that each check can be shown to fail on a
// hand-made log.
func checkRequests(reqs []Request, ops map[string]opRow, events []opEvent, grace time.Duration) []Violation {
	var out []Violation
	add := func(name, format string, args ...any) {
		out = append(out, Violation{Invariant: 3, Name: name, Evidence: fmt.Sprintf(format, args...)})
	}
	byOp := map[string][]Request{}
	var ids []string
	for _, r := range reqs {
		if _, ok := byOp[r.OperationID]; !ok {
			ids = append(ids, r.OperationID)
		}
		byOp[r.OperationID] = append(byOp[r.OperationID], r)
	}
	evByOp := map[string][]opEvent{}
	for _, e := range events {
		evByOp[e.id] = append(evByOp[e.id], e)
	}

	for _, id := range ids {
		rs := byOp[id]
		slices.SortStableFunc(rs, func(a, b Request) int { return a.Arrived.Compare(b.Arrived) })
		evs := evByOp[id]

		// In flight at once: a request that arrived while an earlier one still occupied the
		// external system. A system that does not deduplicate may apply both.
		for i := 1; i < len(rs); i++ {
			for j := 0; j < i; j++ {
				busy := rs[j].busyUntil()
				if busy.IsZero() || rs[i].Arrived.Before(busy) {
					add(NameConcurrentRequests, "operation %s: request %d (%s) arrived while request %d (%s) was in flight (overlap %s)",
						id, i+1, rs[i].String(), j+1, rs[j].String(), overlap(rs[i].Arrived, busy))
					break
				}
			}
		}

		// After terminal: a request that arrived while the ledger held the operation in a
		// terminal state, and no person had resolved it back (a manual resolution out of it).
		var final *opEvent
		for i := range rs {
			final = nil
			for k := range evs {
				e := &evs[k]
				if !e.at.Before(rs[i].Arrived) {
					break
				}
				switch {
				case terminalStates[e.to]:
					final = e
				case e.resolution != "":
					// A person resolved it back (audited): sending again is theirs to
					// decide. Any other way out of a terminal state does not excuse a send.
					final = nil
				}
			}
			if final != nil {
				add(NameSendAfterTerminal, "operation %s: request %d (%s) arrived %s after the ledger recorded it %s at %s (actor %s)",
					id, i+1, rs[i].String(), rs[i].Arrived.Sub(final.at).Round(time.Millisecond), final.to, stamp(final.at), final.actor)
			}
		}

		// Early resend: a request that follows a not-found decision (the reconciler moving the
		// operation out of UNKNOWN_EXTERNAL to be resent) must rest on a lookup made after the
		// previous request ended plus the grace period: until then the first may still land.
		for i := 1; i < len(rs); i++ {
			prev, cur := rs[i-1], rs[i]
			var notFound *opEvent
			for k := range evs {
				e := &evs[k]
				if e.at.After(prev.Arrived) && e.at.Before(cur.Arrived) && e.from == "UNKNOWN_EXTERNAL" &&
					(e.to == "RETRYABLE" || e.to == "PENDING") && e.resolution == "" {
					notFound = e
				}
			}
			if notFound == nil {
				continue
			}
			if prev.Ended.IsZero() {
				add(NameEarlyResend, "operation %s: resend (request %d, %s) after not-found at %s while request %d never ended (%s)",
					id, i+1, cur.String(), stamp(notFound.at), i, prev.String())
				continue
			}
			// The not-found decision is what is judged (the resend follows it): a lookup
			// believed within the grace may race the request still in flight (the bank
			// deciding it a moment later), and a resend however much later is then a second
			// payment all the same.
			if earliest := prev.Ended.Add(grace); notFound.at.Before(earliest) {
				add(NameEarlyResend, "operation %s: not-found believed at %s (by %s), %s before request %d ended (%s) + grace %s; resent as request %d (%s)",
					id, stamp(notFound.at), notFound.actor, earliest.Sub(notFound.at).Round(time.Millisecond), i, prev.String(), grace, i+1, cur.String())
			}
		}

		// Effects: each effect must be one ledger operation's, with its amount, and an
		// operation may have one effect.
		var effects []int
		for i, r := range rs {
			if r.Effect {
				effects = append(effects, i+1)
			}
		}
		if len(effects) == 0 {
			continue
		}
		op, ok := ops[id]
		switch {
		case !ok:
			add(NameEffectMismatch, "operation %s: %d effect(s) at the external system, no such operation in the ledger", id, len(effects))
		case op.amount == nil || *op.amount != rs[effects[0]-1].Amount:
			want := "no amount"
			if op.amount != nil {
				want = fmt.Sprint(*op.amount)
			}
			add(NameEffectMismatch, "operation %s: effect of request %d for amount %d, the ledger says %s", id, effects[0], rs[effects[0]-1].Amount, want)
		}
		if len(effects) > 1 {
			var list []string
			for _, n := range effects {
				list = append(list, fmt.Sprintf("#%d %s", n, rs[n-1].String()))
			}
			add(NameEffectMismatch, "operation %s (ledger %s): %d effects at the external system: %s; ledger: %s",
				id, op.state, len(effects), strings.Join(list, "; "), history(evs))
		}
	}
	return out
}

// history renders an operation's transitions, the context of a double effect.
func history(evs []opEvent) string {
	if len(evs) == 0 {
		return "no transitions"
	}
	var b strings.Builder
	for i, e := range evs {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s->%s %s by %s", e.from, e.to, stamp(e.at), e.actor)
	}
	return b.String()
}

func overlap(arrived, busy time.Time) string {
	if busy.IsZero() {
		return "open-ended"
	}
	return busy.Sub(arrived).Round(time.Millisecond).String()
}
