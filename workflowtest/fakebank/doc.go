/*
Package fakebank is a fault-injecting fake payment provider for your own tests of code built on
Stepwise's operation ledger: the external system an outbox sends payouts to and a reconciler
asks about. Stepwise's own tests and the sample settlement service use it too. It exists to
prove invariant 3 of docs/design.md, one external effect per operation id, so it applies each
idempotency key at most once (in Strict mode: never deduplicates, see below), fails on demand
in every way a real provider does, and keeps its own ledger and a log of every request as the
evidence a test checks.

It is a test double, not a bank client to copy: a real provider's answers, headers and error
codes differ, and so must your classification of them. Sender, Checker and Statement connect
it to the ledger and show the shape that classification takes (see "Classifying a failure").

Start a bank on a free loopback port, program a fault, and check what it applied:

	bank := fakebank.New(&fakebank.Config{Seed: 42})
	if err := bank.Start(); err != nil {
		return err
	}
	defer bank.Close()

	bank.FailNext(1, fakebank.DropAfterApply)
	client := fakebank.NewClient(bank.URL(), nil)
	_, err := client.Pay(ctx, "op-1", fakebank.PaymentRequest{
		Account: "merchant-7", Amount: 1250, Currency: "EUR", Reference: "settle-7",
	})
	// err is ambiguous, yet bank.Effects("op-1") == 1: the payment went through.

A process (the sample settlement service's bank subcommand) serves the same API; other processes
reach it with a Client.

# Strict mode, request log, latency

A bank that deduplicates is friendlier than many real ones: a second send of one operation is
absorbed and counted nowhere. Config.Strict makes every request that gets as far as being
applied a payment of its own, so a second send is a second effect (Effects, Applied, the
statement). Whatever the mode, the bank logs every POST /payments (Requests, GET
/admin/requests): operation id, amount, arrival, decision, answer and the caller hanging up,
the evidence workflowtest.CheckInvariants judges the send discipline on. Config.Profile draws a
latency per request: slow requests are decided after it even if the caller gave up (as a real
bank would), stalled ones are applied at once and answered late (ProfileSlow, ProfileStalls).
The chaos suite runs strict; the deduplicating default stays for the tests of replays.

# API

  - POST /payments with an Idempotency-Key header and a JSON PaymentRequest: 201 with the Payment
    the first time, 200 with the same Payment on a replay (strict mode: 201 with a new Payment). A replay with a different body is 409.
    A declined payment (amount <= 0, or an account starting with "closed-") is recorded with
    status "failed" and answered 422, on the first attempt and every replay. A missing key,
    invalid JSON, an empty account or a malformed currency is 400 and records nothing.
  - GET /payments/{key}: 200 with the Payment (declined ones too), or 404 if the key was never
    applied.
  - GET /statement?currency=&from=&to=: the succeeded payments, from inclusive, to exclusive,
    times in RFC 3339; what reconciliation compares its totals with.
  - GET /admin/ledger: every applied payment, the keys each reference was paid under, and Stats.
  - POST /admin/faults with a JSON Mix: replace the random fault mix.

# Faults

Each POST /payments that is well formed meets at most one fault, chosen in this order: one
programmed for its key (Bank.FailKey, used once), one programmed for the next requests
(Bank.FailNext), or a draw from Config.Faults (Bank.SetFaults changes it). Draws come from a
source seeded with Config.Seed, so the same seed and the same request sequence give the same
faults.

  - RefuseBeforeApply answers 429 with "X-Not-Processed: true" and applies nothing.
  - Error5xxBeforeApply answers 500 or 503 and applies nothing.
  - Error5xxAfterApply applies, then answers 500 or 503 with the same body as
    Error5xxBeforeApply, so the status tells the caller nothing.
  - DropAfterApply applies, then closes the connection without an answer.
  - DelayAfterApply applies, then holds the answer for Config.Delay, past the caller's timeout.
  - CrashAfterApply applies, then takes the bank off the network (as SetDown(true)): the port
    closes, then every connection, this one without an answer. Programmed only (FailNext,
    FailKey); the bank stays down until SetDown(false).

Config.Latency delays every payment, lookup and statement request. Bank.SetDown(true) closes the
listening port so that dials are refused, and SetDown(false) reopens the same port.

No fault makes the bank apply a key twice: the "after" faults hide the answer, not the effect,
and a replay under the same key returns the stored payment.

# Classifying a failure

The client reports what the caller can honestly conclude, nothing more:

	what the caller saw                     check             the operation is
	--------------------------------------  ----------------  ------------------------------
	201 or 200                              err == nil        SUCCEEDED
	422 declined                            IsDeclined        FAILED_PERMANENT
	429 with X-Not-Processed                IsNotProcessed    RETRYABLE (same key)
	never reached the bank (the wire says)  IsNotProcessed    RETRYABLE (same key)
	409 key reused for another payment      IsConflict        a caller bug; MANUAL
	500, 503, any other status              none              UNKNOWN_EXTERNAL
	timeout, reset, EOF, unreadable answer  none              UNKNOWN_EXTERNAL

Everything in the last two rows may have been applied. A caller must treat it as unknown and
ask (Client.Lookup), never as failed, and must never resend it under a new key:
Bank.DuplicateReferences catches a caller that does. A 404 from Lookup means "not applied yet",
not "never will be": a request still in flight may land later, hence the reconciler's grace
period.

"Never reached the bank" is what the wire shows, not what the error says: the Client sends
payments through outbox/httpsend, which keeps net/http from resending one by itself and records
whether a connection was obtained and the request written. A bare "connection refused" proves
nothing: when a kept-alive connection dies after the bank applied a payment, net/http resends
a POST carrying a canonical Idempotency-Key on a new connection, and the refused dial of that
resend is the error it returns. A strict bank with DropAfterApply or CrashAfterApply and a
kept-alive client shows it (the test of the Sender does).

# Checking invariants

Bank.Effects(key) is the number of times the bank applied key, counted apart from the stored
payments so that a double apply would show as 2. Bank.Applied lists every applied payment,
Bank.DuplicateReferences the references paid under more than one key, and Bank.Stats the
requests, applies, replays, conflicts and faults by kind. Ledger carries the same over HTTP.
*/
package fakebank
