/*
Package settlement is the business domain of the sample settlement service: merchants, card
transactions, daily settlement per (merchant, settle date, type, currency), double-entry
ledger entries, and a payout to the bank per settlement through Stepwise's operation ledger.
It is what the sample-settlement command runs, and what its tests, chaos suite and benchmark
build on.

# Settling a date

A date is settled by N runs, one per shard (Plan). A merchant's shard is
schedule.ShardOf(code, N), computed in SQL by merchant_shard from a stored hash. Each step of a
run is one SettleBatch: one statement settles the next batch of merchants after the cursor —
sums per (merchant, type, currency), a settlement per group (unique business key, ON CONFLICT
DO NOTHING) and its two ledger entries — and one outbox.Enqueue writes the payouts, all in the
step's transaction, committed with the cursor (the last merchant id walked past) or not at all:

	res, err := settlement.SettleBatch(ctx, tx, settlement.Batch{
		Date: date, Shard: 3, Shards: 8, AfterMerchant: cursor, Size: 500, RunKey: runKey,
	})
	// commit; the next batch starts after res.LastMerchant; res.Done ends the shard.

A step replayed after a crash finds its settlements there and creates nothing twice.

# Dates, slots and run keys

The daily schedule settles the previous day at a fixed local time (Plan.Spec, Plan.Zone).
Plan maps a date to that slot and to the run keys "settle/<slot>/<shard>"; a date settled by
hand (Plan.Start, "settle --date") uses the same keys and input, so the schedule and a person
can never start two sets of runs for one date.

# Payouts and their outcomes

The service talks to the bank through the Bank interface and nothing else: Send pays each
payout under its operation id and classifies the bank's answer only as far as it proves
something (declined: FAILED_PERMANENT; refused before processing: RETRYABLE; anything else, a
5xx, a timeout, a dropped connection: UNKNOWN_EXTERNAL), Lookup answers the reconciler from the
bank's lookup by operation id, and Statement gives the report its totals. The sample's bank is
Stepwise's fake one, through its adapter (package bankfake, over workflowtest/fakebank's Sender
and Checker). Read that adapter as the pattern for yours, not as a bank client: against a real
provider you implement Bank around its client, and each branch of the classification must
follow what that provider documents; an answer it does not document as "not processed" is
unknown, never failed. (BankAudit, a test bank's ledger and request log, is what the invariant
check needs beyond Bank; a real provider has none, and the checks that need it say so.) The outcome callback OnPayoutOutcomes moves settlements in the transaction that
moves their payouts:

	payout (ledger)       settlement
	PENDING, RETRYABLE    PENDING
	UNKNOWN_EXTERNAL      PAYOUT_SENT     sent, outcome not proven yet
	SUCCEEDED             PAID
	FAILED_PERMANENT      PAYOUT_FAILED   plus the reversing ledger entries
	MANUAL                NEEDS_REVIEW    a person decides (Resolve)

# Closing a date and reconciling it

With ServiceConfig.PayoutsAtRestTimeout set (the sample's commands set it), each settle run
waits after its last batch for its payouts to be at rest (workflow.WaitForOperations, holding
no worker; a MANUAL payout keeps it waiting for a person), and the last shard at rest closes
the date (settlement_day): every payout proven again, the day's report written, and the
date's reconciliation run started, which waits for the bank's statement
(workflow.WaitForSignal, sent by StatementArrived) and then compares ledger and statement,
one child run per currency (Step.StartChild, workflow.WaitForChildren).
ReadDay reads where a date stands; close.go says why the last shard closes the date rather
than a parent run.

# Evidence

BuildReport shows a date by evidence: batch status derived from runs and their operations,
payouts per state, the oldest unknown, and the totals per currency from transactions through
settlements and paid payouts to the bank's statement, payout by payout. CheckInvariants checks
the invariants 1 to 6 of docs/design.md for a date against the database and the bank, each with its
evidence.

# Wiring

Service is one worker process: a River client with the settle worker, the payout outbox, the
reconciler, Stepwise's maintenance and optionally the daily schedule, wired in the open in
NewService, the way a user adds Stepwise to their own River client.
*/
package settlement
