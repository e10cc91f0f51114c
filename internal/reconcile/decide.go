package reconcile

import (
	"fmt"
	"time"

	"github.com/stepwise-go/stepwise/internal/jitter"
	"github.com/stepwise-go/stepwise/internal/outbox"
)

// decision is what one lookup proves about one operation.
type decision struct {
	stay   bool      // it stays UNKNOWN_EXTERNAL ...
	next   time.Time // ... until its next check
	to     outbox.State
	ref    string // external reference, for SUCCEEDED
	err    string // last_error, for FAILED_PERMANENT
	reason string // manual_reason, for MANUAL
	lookup string // last_lookup: what the lookup said, for people
	result string // metric label: succeeded, failed, pending, not_found, error
}

// decide applies the reconciliation rules to one lookup. It is pure, so the rules are table
// tested; the SQL that applies a decision only guards it.
//
//   - found-succeeded: SUCCEEDED, unless amount or currency differ from the ledger's, then
//     MANUAL "mismatch";
//   - found-failed: FAILED_PERMANENT;
//   - pending, or the lookup failed: stays, next check after a backoff;
//   - not-found within the grace period: stays until the grace ends (an in-flight request may
//     still land); after it: RETRYABLE, resent under the same id. The grace runs from
//     graceFrom, the last moment a request could still have been in flight;
//   - not definitive and past the give-up age, the check limit or the outbox's attempt limit:
//     MANUAL, with the reason. A definitive answer is applied however old the operation.
//
// op.Checks is the number of this check (the claim counted it).
func decide(op *outbox.Operation, res LookupResult, lookupErr error, now time.Time, k *KindConfig, maxAttempts int) decision {
	var d decision
	backoff := func() time.Time { return now.Add(k.CheckBackoff(op.Checks)) }
	switch {
	case lookupErr != nil:
		d = decision{stay: true, next: backoff(), result: "error", lookup: "lookup failed: " + lookupErr.Error()}
	case res.Status == LookupFoundSucceeded:
		d.lookup = fmt.Sprintf("found succeeded: ref %q, %d %s", res.ExternalRef, res.Amount, res.Currency)
		d.result = "succeeded"
		if op.Currency != "" && (res.Amount != op.Amount || res.Currency != op.Currency) {
			d.to = outbox.StateManual
			d.reason = fmt.Sprintf("mismatch: the external system holds %d %s (ref %q), the ledger %d %s",
				res.Amount, res.Currency, res.ExternalRef, op.Amount, op.Currency)
			return d
		}
		d.to, d.ref = outbox.StateSucceeded, res.ExternalRef
		return d
	case res.Status == LookupFoundFailed:
		d = decision{to: outbox.StateFailedPermanent, result: "failed",
			lookup: "found failed: " + res.Reason, err: "failed at the external system: " + res.Reason}
		return d
	case res.Status == LookupPending:
		d = decision{stay: true, next: backoff(), result: "pending", lookup: "pending at the external system"}
	case res.Status == LookupNotFound:
		d = decision{result: "not_found", lookup: "not found"}
		if graceEnd := graceFrom(op).Add(k.Grace); now.Before(graceEnd) {
			// The request may still be in flight: resending now could apply it twice.
			d.stay = true
			d.next = graceEnd.Add(jitter.UpTo(time.Second))
			d.lookup = fmt.Sprintf("not found, within the grace period until %s", graceEnd.UTC().Format(time.RFC3339))
		} else {
			d.to = outbox.StateRetryable // resent under the same id by the dispatcher
		}
	default:
		d = decision{stay: true, next: backoff(), result: "error",
			lookup: fmt.Sprintf("lookup failed: the Checker returned status %q; want found_succeeded, found_failed, pending or not_found", res.Status)}
	}

	// Not definitive: has the operation used up its patience?
	since := op.CreatedAt
	if op.UnknownSince != nil {
		since = *op.UnknownSince
	}
	switch {
	case now.Sub(since) >= k.GiveUpAfter:
		d = decision{to: outbox.StateManual, result: d.result, lookup: d.lookup,
			reason: fmt.Sprintf("gave up: unknown for %s (GiveUpAfter %s); last lookup: %s", now.Sub(since).Round(time.Second), k.GiveUpAfter, d.lookup)}
	case op.Checks >= k.MaxChecks:
		d = decision{to: outbox.StateManual, result: d.result, lookup: d.lookup,
			reason: fmt.Sprintf("gave up: %d checks (MaxChecks %d); last lookup: %s", op.Checks, k.MaxChecks, d.lookup)}
	case d.to == outbox.StateRetryable && maxAttempts > 0 && op.Attempts >= maxAttempts:
		d = decision{to: outbox.StateManual, result: d.result, lookup: d.lookup,
			reason: fmt.Sprintf("gave up: not found after %d attempts (the outbox's MaxAttempts); last lookup: %s", op.Attempts, d.lookup)}
	}
	return d
}

// graceFrom is when the grace period of a not-found answer starts: the last moment a request
// for op could still have been in flight (Operation.InFlightUntil: the last request's actual
// start plus the send timeout, or the end of the claim it was sent under, whichever is later).
// Counting from the claim instead would let an operation that waited its turn in the
// dispatcher, then timed out, be resent while its first request was still on the wire. Rows
// written before InFlightUntil existed fall back to the last send, then to creation.
func graceFrom(op *outbox.Operation) time.Time {
	switch {
	case op.InFlightUntil != nil:
		return *op.InFlightUntil
	case op.LastSentAt != nil:
		return *op.LastSentAt
	default:
		return op.CreatedAt
	}
}
