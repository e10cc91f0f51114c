// Package bankfake is the sample's adapter to Stepwise's fake bank (workflowtest/fakebank):
// it implements settlement.Bank, and settlement.BankAudit, which only a test bank can. The
// demo, the tests and stepwise-lab choose it; the service itself (package settlement, serve,
// settle...) knows only the settlement.Bank interface. A team copying the sample writes the
// adapter of its own provider beside this one and passes it where this one is passed (the
// sample's main package does so in one place, bank.go).
package bankfake

import (
	"context"
	"net/http"
	"time"

	"github.com/stepwise-go/stepwise/cmd/sample-settlement/settlement"
	"github.com/stepwise-go/stepwise/outbox"
	"github.com/stepwise-go/stepwise/reconcile"
	"github.com/stepwise-go/stepwise/workflowtest"
	"github.com/stepwise-go/stepwise/workflowtest/fakebank"
)

// Bank is settlement.Bank and settlement.BankAudit on a fake bank's client. It is safe for
// concurrent use.
type Bank struct {
	// Client is the fake bank's HTTP client the adapter calls.
	Client *fakebank.Client
}

var (
	_ settlement.Bank      = (*Bank)(nil)
	_ settlement.BankAudit = (*Bank)(nil)
)

// New returns the adapter on client.
func New(client *fakebank.Client) *Bank { return &Bank{Client: client} }

// Dial returns the adapter for the fake bank at bankURL, through the HTTP client a service
// would use: keep-alive on, each call bounded by timeout. The fake bank's client sends through
// outbox/httpsend, which keeps net/http from replaying a POST by itself when a kept-alive
// connection dies after the request was written: a replay is a second request the ledger
// never started, and a bank that does not deduplicate would pay twice.
func Dial(bankURL string, timeout time.Duration) *Bank {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 128
	return New(fakebank.NewClient(bankURL, &http.Client{Timeout: timeout, Transport: tr}))
}

// Send pays op under its operation id and classifies the answer (fakebank.Sender: a decline
// is permanent, a refusal before processing is not-sent, anything else may have paid).
func (b *Bank) Send(ctx context.Context, op *outbox.Operation) (outbox.Receipt, error) {
	return fakebank.Sender{Client: b.Client}.Send(ctx, op)
}

// Lookup asks the bank about op's operation id (fakebank.Checker: only the bank's explicit
// "no payment under this key" is reconcile.LookupNotFound).
func (b *Bank) Lookup(ctx context.Context, op *outbox.Operation) (reconcile.LookupResult, error) {
	return fakebank.Checker{Client: b.Client}.Lookup(ctx, op)
}

// Statement returns the bank's succeeded payments created in [from, to).
func (b *Bank) Statement(ctx context.Context, from, to time.Time) ([]settlement.BankPayment, error) {
	pays, err := b.Client.Statement(ctx, fakebank.StatementQuery{From: from, To: to})
	if err != nil {
		return nil, err
	}
	return payments(pays), nil
}

// Ledger returns every payment the bank applied, duplicates included.
func (b *Bank) Ledger(ctx context.Context) (*settlement.BankLedger, error) {
	l, err := b.Client.Ledger(ctx)
	if err != nil {
		return nil, err
	}
	return &settlement.BankLedger{Payments: payments(l.Payments), DuplicateReferences: l.DuplicateReferences()}, nil
}

// Requests returns the bank's log of payment requests.
func (b *Bank) Requests(ctx context.Context) ([]settlement.BankRequest, error) {
	log, err := b.Client.Requests(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]settlement.BankRequest, len(log))
	for i, r := range log {
		out[i] = settlement.BankRequest{Reference: r.Reference, Request: RequestOf(r)}
	}
	return out, nil
}

// RequestOf is one fake-bank request in the form workflowtest.CheckInvariants checks.
func RequestOf(r fakebank.Request) workflowtest.Request {
	return workflowtest.Request{
		OperationID: r.OperationID, Amount: r.Amount,
		Arrived: r.Arrived, Decided: r.Decided, Ended: r.Ended(), Effect: r.Effect,
	}
}

func payments(pays []fakebank.Payment) []settlement.BankPayment {
	out := make([]settlement.BankPayment, len(pays))
	for i, p := range pays {
		out[i] = settlement.BankPayment{
			OperationID: p.IdempotencyKey, Reference: p.Reference, ExternalRef: p.ID,
			Amount: p.Amount, Currency: p.Currency, At: p.CreatedAt,
		}
	}
	return out
}
