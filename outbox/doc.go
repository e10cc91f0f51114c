/*
Package outbox is Stepwise's operation ledger: external side effects (payouts, emails, calls
to other services) written in the same Postgres transaction as the business change that
causes them, delivered through River under a stable operation_id, and recorded with an honest
outcome.

# Enqueue inside the step

A step writes its operations with Enqueue, on the step's own transaction:

	ops := make([]outbox.EnqueueParams, len(batch))
	for i, s := range batch {
		ops[i] = outbox.EnqueueParams{
			Kind:        "payout",
			BusinessKey: fmt.Sprintf("settle/%s/%d", date, s.MerchantID),
			Payload:     mustJSON(PayoutPayload{Account: s.Account}),
			Amount:      s.Amount, // minor units
			Currency:    "EUR",
		}
	}
	if _, err := outbox.Enqueue(ctx, s.Tx, ops...); err != nil {
		return workflow.Next{}, err
	}

Enqueue records the step's run key on each operation (Operation.RunKey), so that a batch is
complete only when its operations are. If the step rolls back, its operations vanish with it:
nothing is sent for a step that did not commit. The operation_id defaults to OperationID(kind, business key), a UUID v5, so a step that
runs twice enqueues the same operations twice, which is a no-op. The same id (or kind and
business key) with a different payload, amount or currency is ErrOperationConflict: two pieces
of code disagree about one external effect, and sending either could pay the wrong amount.
For a ledger that will hold years, set ID to DatedOperationID(date, kind, business key) and
put the date first in the business key: a day's operations then sit together in the ledger's
indexes, and a new day costs what it costs on a new ledger.

# States

	state             meaning                                              next
	----------------  ---------------------------------------------------  ----------------
	PENDING           committed with the business writes, not yet sent     PROCESSING
	PROCESSING        a dispatcher holds its lease and may be calling out  any below
	SUCCEEDED         the external system confirmed it                     terminal
	FAILED_PERMANENT  the external system definitely refused it            terminal
	RETRYABLE         definitely not executed; resent later, same id       PROCESSING
	UNKNOWN_EXTERNAL  it may or may not have happened                      reconciler
	MANUAL            a person must decide                                 OperationResolve

Every change of state names the state it expects (UPDATE … WHERE state = $expected), and the
outcome of a send also names the claim that produced it (claims), so a dispatcher that outlived
its lease cannot overwrite a later decision. Each change writes an audit row to stepwise_event
(subject "op:<operation_id>", kind "op.transition").

# Claims and requests

A claim is not a request. attempts counts requests: Send calls begun, plus claims lost with a
dispatcher that died holding them (a request may have begun). Each one has a row in
stepwise_operation_request (claim number, actor, started_at, ended_at, the outcome it proved;
started_at is NULL for a lost claim), written in the statement that records the outcome, so it
costs no extra round trip. claims counts claims. An operation claimed twice but sent once shows
attempts 1, claims 2.

# Send discipline

No Send starts unless the dispatcher can prove, on its own monotonic clock (read before the
statement that took or last renewed the claim), that its claim lasts at least the send Timeout;
a claim that falls short is renewed once, and dropped unsent if that fails. A dispatcher frozen
(GC, SIGSTOP, a frozen VM) or cut off from the database past its lease therefore sends nothing
that crash recovery, the reconciler or a person has meanwhile moved on, and every request of a
dispatcher that died is over by its lease's expiry. stepwise.KindConfig.Lease must exceed Timeout.

The ledger keeps, per operation, the last moment a request could still be in flight
(in_flight_until: the request's actual start plus Timeout, or the end of its claim, whichever
is later); the reconciler's grace period runs from there.

# Classifying a send

A Sender's result decides the next state (see Classify):

	nil                      SUCCEEDED (the Receipt's external reference is kept)
	Permanent(err)           FAILED_PERMANENT
	NotSent(err)             RETRYABLE, with backoff and jitter, resent under the same id
	anything else            UNKNOWN_EXTERNAL

"Anything else" includes timeouts, connection resets, ambiguous 5xx answers, unclassified
errors and panics in the Sender, and an operation found PROCESSING with an expired lease after
a crash. None of them proves the request had no effect, so none is failed and none is resent
blindly: the reconciler (package reconcile) asks the external system about the operation_id.

A Sender on net/http sends through package outbox/httpsend: net/http by itself resends a
written POST that carries a canonical Idempotency-Key when its kept-alive connection dies, and
reports the resend's error, so "connection refused" can follow a request that took effect.
httpsend stops those resends and returns NotSent only when the wire proves the request never
reached the other side (no connection, or a header block never completely written).

# Delivery

Delivery is not one River job per operation (measured here: that caps delivery near 1,000
operations/s, while a settlement step commits about 14,000 items/s). Each kind has one
dispatcher job, in its own River queue (stepwise_outbox_<kind>), which runs a pipeline: it claims due
operations in batches (FOR UPDATE SKIP LOCKED, a lease per row, PROCESSING, one short
statement), calls Send with at most stepwise.KindConfig.Concurrency calls in flight and at most
RatePerSecond begun per second, each with KindConfig.Timeout and the operation id as
idempotency key, and records outcomes in transactions of up to a batch: the state changes (one
set-based UPDATE), the user's outcome callback, and the audit events, together. A slow send
holds up only its own operation, and a slow kind only its own queue.

A dispatcher runs for at most Config.Slice, then snoozes itself and runs again, so it never
looks stuck to River. While it runs it renews the leases of the operations it holds, and
heartbeats in stepwise_outbox_dispatcher.

# Waking the dispatcher

Enqueue in a job the stepwise.Client works (a step, or a River worker of your own), or through
stepwise.Client.OperationEnqueueTx, notes its transaction's id (returned by its own INSERT, no
extra statement), and the client's waker queues a dispatch job unique per kind within tens of milliseconds after that transaction commits (up to 160 ms while the job
it queued last has not started yet: the waker then looks less often). Nothing the wake touches is
locked on behalf of the step, so concurrent runs enqueueing the same kind do not wait for each
other. When that kind's dispatcher is already running, River swallows the insert; a dispatcher
that found no more work completes its own job and then checks again for due operations, in one
transaction: either that check sees the committed rows, or the wake that follows the commit
finds the job completed and queues a new one. A wake is therefore never lost. (The reconciler's
resends and a person's RETRYABLE resolution still queue the job inside their own transaction.)

For operations enqueued with no client's context (outside its jobs and OperationEnqueueTx),
and for RETRYABLE operations whose backoff has elapsed, the poll wakes every
kind with due work every Config.PollInterval: a River periodic job run by the leader, and the
maintenance loop of every started stepwise.Client (so that a dead leader does not hold it up).

Enqueue refuses, with ErrUnknownKind, a kind that was never registered in the database
(stepwise.Client.Start registers its kinds; RegisterKinds does too): an operation of a
mistyped kind would wait forever.

Enqueue takes no handle: it runs inside the caller's transaction with only ctx and tx in hand.
The two things it keeps between calls belong to the stepwise.Client and reach it through ctx
(the client's River worker middleware puts them in every job's context, and
OperationEnqueueTx in its own): the waker, a goroutine that lives only while it has
transactions to watch, and the kinds found registered in the client's database, a cache that
only grows because a registration is never taken back. Nothing is kept per process: two
clients in one binary share nothing.

# Crash recovery

A dispatcher killed between claiming and recording leaves its operations PROCESSING. When their
lease expires (stepwise.KindConfig.Lease after its last renewal), the poll or any dispatcher of the kind
moves them to UNKNOWN_EXTERNAL. River keeps the killed dispatcher's job "running" until its own
rescuer runs (an hour by default), and that job would swallow every wake of the kind; the poll
notices the heartbeat is older than Config.DispatcherLease and starts a takeover dispatcher
beside it, so delivery resumes about DispatcherLease + PollInterval after a kill -9. Once a
takeover has heartbeated, the dead job is known dead, and later wakes it swallows are passed on
to a new dispatcher at once, for as long as River still calls it running.

# Outcome callbacks

stepwise.KindConfig.OnOutcome (or OnOutcomeBatch) runs in the transaction that records each transition
out of PROCESSING, UNKNOWN_EXTERNAL and MANUAL, so that business state moves with the ledger: a
settlement becomes PAID exactly when its payout becomes SUCCEEDED. If it returns an error the
transition is not recorded; the operation stays PROCESSING until its lease expires and then
goes to the reconciler, which calls it again.

# Wiring

The Outbox that delivers the kinds is run by stepwise.Client, for every kind of
stepwise.Config.Kinds: one KindConfig per kind holds its Sender, its Checker for the
reconciler, its outcome callback and its limits. NewClient installs the dispatchers, the poll
and the queues into the client's River config; Start registers the kinds (so that Enqueue
accepts them) and runs the poll in this process's maintenance loop; Stop drains the sends in
flight. Config (stepwise.Config.Outbox) tunes the dispatchers; the per-kind limits' defaults are
exported constants (LeaseDefault, TimeoutDefault, ...).

A program that enqueues before any client with those kinds has started (a web tier, a
migration) registers them with RegisterKinds.

# Reading the ledger

A service reads the ledger through its stepwise.Client: OperationGet, OperationList and
OperationRequestList (the requests of one operation). stepwise.Client.Metrics includes the
outbox's Prometheus collector: delivery counters and, read at scrape time, the operations in
each active state and the age of the oldest unknown operation per kind.
*/
package outbox
