/*
Package reconcile settles the operations the outbox could not: every UNKNOWN_EXTERNAL
operation is looked up at the external system by its operation_id until it is proven
SUCCEEDED or FAILED_PERMANENT, sent again under the same id when the external system provably
never got it, or handed to a person (MANUAL). It never sends a new operation.

# Rules

A pass takes the UNKNOWN_EXTERNAL operations whose next check is due, in batches (FOR UPDATE
SKIP LOCKED), asks the kind's Checker about each (at most Concurrency at once, RatePerSecond
per second, Timeout each), and records what each answer proves, in transactions of whatever
answers arrived meanwhile; the next batch is claimed while the last is still being asked about:

	lookup                                      the operation
	------------------------------------------  ---------------------------------------------
	found, succeeded                            SUCCEEDED (external reference kept)
	found, succeeded, other amount or currency  MANUAL, reason "mismatch: …"
	found, failed                               FAILED_PERMANENT
	pending, or the lookup failed               stays; next check after a backoff with jitter
	not found, within Grace (see below)         stays until the grace ends: the request may
	                                            still be in flight and land later
	not found, after Grace                      RETRYABLE: resent by the outbox under the same
	                                            id, so it cannot be applied twice
	not definitive, past GiveUpAfter, MaxChecks MANUAL, reason "gave up: …"
	or the outbox's MaxAttempts

# Grace

The grace period runs from the last moment a request could still have been in flight, never
from the claim: the later of the last request's actual start plus the outbox's send Timeout,
and the end of the claim it was sent under (the moment the dispatcher recorded its outcome, or
the claim's lease expiry when the dispatcher died holding it). The outbox keeps that moment in
the ledger (in_flight_until, Operation.InFlightUntil); the outbox starts no Send unless its
claim is valid for at least the send Timeout, so a request of a dead dispatcher is over by its
lease expiry. A not-found answer is believed, and the operation resent under the same id, only
Grace after that moment: an operation that waited its turn in the dispatcher and then timed
out is never resent while its first request can still land.

The rules are one pure function, table tested; the SQL only guards it. Each transition goes
through the Outbox, as the dispatcher's do: the kind's outcome callback and an audit event in the
same transaction as the state change.

# Overlapping passes

The pass is a River periodic job run by the leader every Config.Interval, and every
stepwise.Client runs the same pass in its own maintenance loop, so a dead or frozen leader
does not hold reconciliation back until the next election. Passes that overlap
are safe. Claiming a batch counts the check (checks + 1) and pushes next_check_at past the
lookups, in one short statement, so another pass skips those operations, and nothing stays
locked while the external system is asked. A decision is recorded only under the check that
made it (WHERE checks = $claimed): when a forced check overtakes a slow pass, the slower
decision is dropped and no outcome callback runs twice.

# By hand

A person's decision on a MANUAL or UNKNOWN_EXTERNAL operation — SUCCEEDED, FAILED_PERMANENT,
or RETRYABLE to send it again under the same id — is recorded by stepwise.Client's
OperationResolve, with the person's name and reason in the audit trail and the outcome
callback in the same transaction. It is refused with stepwisetype.ErrChanged if the operation
moved since the version the person saw, even back into the same state:

	op, err := client.OperationGet(ctx, id) // what the person looks at
	// ... the person decides ...
	_, err = client.OperationResolve(ctx, id, &stepwise.OperationResolveOpts{
		Outcome:         outbox.StateSucceeded,
		ExpectedVersion: op.Version,
		Actor:           "alice",
		Reason:          "TICKET-42: the bank confirms the payment",
	})

# Totals

CompareTotals compares the ledger's SUCCEEDED operations of a kind over a period with the
external system's Statement, effect by effect: count and sum per currency on each side, and
the differences — only here, only there, amount differs, duplicate (applied twice) — as a value
to print (Totals.String) or assert on. An operation belongs to the period it was sent in: its
last request's start or, when its dispatcher died holding the claim and the reconciler proved
the outcome, that claim's — what a statement dated by the time of applying counts. The period
is one range of an index; its operations are streamed, never held, and at most
TotalsParams.MaxDifferences differences of each kind are listed (all are counted).

# Wiring

The reconciler is run by stepwise.Client, for every kind of stepwise.Config.Kinds with a
Checker: its worker, periodic pass and queue are installed into the client's River config, and
Start runs the pass in this process's maintenance loop too. Config tunes it
(stepwise.Config.Reconcile); the per-kind limits' defaults are exported constants
(GraceDefault, MaxChecksDefault, ...).

# Metrics

stepwise.Client.Metrics includes the reconciler's: lookups by result, counted in the process, and,
read from the ledger at scrape time, the unknown count, the age of the oldest unknown and the
manual count per kind.
*/
package reconcile
