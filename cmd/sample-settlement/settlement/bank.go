package settlement

import (
	"context"
	"errors"
	"time"

	"github.com/stepwise-go/stepwise/outbox"
	"github.com/stepwise-go/stepwise/reconcile"
	"github.com/stepwise-go/stepwise/workflowtest"
)

// Bank is the payees' bank, as much of it as a payout needs: send a payment under the
// payout's operation id, ask what the bank did under that id, and read its statement for the
// report's totals. The service depends on nothing else of a bank. The sample runs against
// Stepwise's fake bank through its adapter (package bankfake); a team copying the sample
// writes the adapter of its own provider to this interface, and keeps the rest.
type Bank interface {
	// Send pays op under op.IdempotencyKey() (its operation id), with op.BusinessKey as the
	// payment's reference and op's amount, currency and payload (PayoutPayload's account). It
	// is the payout kind's outbox.Sender, and classifies the bank's answer only as far as the
	// answer proves something: a decline is outbox.Permanent, a refusal the bank documents as
	// "not processed" (or a request the wire shows never left) is outbox.NotSent, and every
	// other failure (a 5xx, a timeout, a dropped connection) is returned as is, since the
	// payment may have gone through: the payout becomes UNKNOWN_EXTERNAL, for Lookup. Claiming
	// more than the answer proves resends a payment that was made.
	Send(ctx context.Context, op *outbox.Operation) (outbox.Receipt, error)

	// Lookup asks what the bank did under op's operation id: the reconciler's
	// reconcile.Checker for UNKNOWN_EXTERNAL payouts. Only the bank's explicit "no payment
	// under this id" may be reconcile.LookupNotFound (the payout is then resent, same id); a failed
	// lookup is an error, asked again later.
	Lookup(ctx context.Context, op *outbox.Operation) (reconcile.LookupResult, error)

	// Statement returns the succeeded payments created at or after from and before to (a zero
	// bound does not bound), each with the reference it was sent with: the report compares
	// them with the payouts, and the console's totals with the ledger.
	Statement(ctx context.Context, from, to time.Time) ([]BankPayment, error)
}

// BankPayment is one payment a bank reports.
type BankPayment struct {
	// OperationID is the idempotency key the payment was sent under: the payout's operation id.
	OperationID string
	// Reference is the reference it was sent with: the payout's business key.
	Reference string
	// ExternalRef is the bank's own id of the payment.
	ExternalRef string
	// Amount in minor units, and Currency.
	Amount   int64
	Currency string
	// At is when the bank applied it.
	At time.Time
}

// BankAudit is what a test bank can tell beyond what a real one does: every payment it applied
// (so a second payment under one operation id shows) and every request it received (so the
// send discipline can be judged). CheckInvariants and the report use it when the Bank given
// has it; against a bank without it, the checks that need it say they cannot run.
type BankAudit interface {
	// Ledger returns every payment the bank applied, declined ones and duplicates included,
	// and the references it paid under more than one operation id.
	Ledger(ctx context.Context) (*BankLedger, error)
	// Requests returns every payment request that reached the bank, in order of arrival.
	Requests(ctx context.Context) ([]BankRequest, error)
}

// BankLedger is a snapshot of everything a test bank applied.
type BankLedger struct {
	// Payments holds every payment applied, in the order the bank applied them.
	Payments []BankPayment
	// DuplicateReferences maps each reference paid (succeeded) under more than one operation
	// id to those ids: the mark of a caller that resent under a new id.
	DuplicateReferences map[string][]string
}

// BankRequest is one payment request that reached a test bank: its timing and effect, as the
// send-discipline checker reads them, and the reference it carried.
type BankRequest struct {
	workflowtest.Request
	Reference string
}

// errNoBankAudit is what a check that needs BankAudit reports against a bank without it.
var errNoBankAudit = errors.New("this bank keeps no ledger or request log to check against (settlement.BankAudit)")

// audit returns bank's BankAudit, or an error saying why there is none.
func audit(bank Bank) (BankAudit, error) {
	if bank == nil {
		return nil, errors.New("no bank given")
	}
	a, ok := bank.(BankAudit)
	if !ok {
		return nil, errNoBankAudit
	}
	return a, nil
}

// StatementOf is bank's statement as reconcile reads it (reconcile.CompareTotals, the
// console's totals).
func StatementOf(bank Bank) reconcile.Statement {
	return reconcile.StatementFunc(func(ctx context.Context, from, to time.Time) ([]reconcile.StatementEntry, error) {
		pays, err := bank.Statement(ctx, from, to)
		if err != nil {
			return nil, err
		}
		out := make([]reconcile.StatementEntry, len(pays))
		for i, p := range pays {
			out[i] = reconcile.StatementEntry{Key: p.OperationID, ExternalRef: p.ExternalRef, Amount: p.Amount, Currency: p.Currency, At: p.At}
		}
		return out, nil
	})
}
