// Package bankops connects the fake bank to the operation ledger for Stepwise's own tests: a
// payout Sender that classifies the bank's answers only as far as they prove something, a
// reconcile Checker and a Statement. The sample service has its own (settlement.BankSender),
// written out as user code is; the SDK's test packages share this one.
package bankops

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/stepwise-go/stepwise/internal/testkit/fakebank"
	"github.com/stepwise-go/stepwise/outbox"
	"github.com/stepwise-go/stepwise/reconcile"
)

// Payload is a test payout's payload: what the bank needs beyond amount and currency.
type Payload struct {
	Account string `json:"account"`
}

// Sender pays operations at the fake bank under their operation id. Declined is permanent, a
// refusal before processing is not-sent; everything else (5xx, timeout, dropped connection)
// may have paid and is returned as is, so the operation becomes UNKNOWN_EXTERNAL.
type Sender struct{ Client *fakebank.Client }

// Send pays op.
func (s Sender) Send(ctx context.Context, op *outbox.Operation) (outbox.Receipt, error) {
	var p Payload
	if err := json.Unmarshal(op.Payload, &p); err != nil {
		return outbox.Receipt{}, outbox.Permanent(fmt.Errorf("decoding payload: %w", err))
	}
	pay, err := s.Client.Pay(ctx, op.IdempotencyKey(), fakebank.PaymentRequest{
		Account: p.Account, Amount: op.Amount, Currency: op.Currency, Reference: op.BusinessKey,
	})
	switch {
	case err == nil:
		return outbox.Receipt{ExternalRef: pay.ID}, nil
	case fakebank.IsDeclined(err):
		return outbox.Receipt{}, outbox.Permanent(err)
	case fakebank.IsNotProcessed(err):
		return outbox.Receipt{}, outbox.NotSent(err)
	default:
		return outbox.Receipt{}, err
	}
}

// Checker looks payments up at the fake bank by operation id.
type Checker struct{ Client *fakebank.Client }

// Lookup asks the bank about op.
func (q Checker) Lookup(ctx context.Context, op *outbox.Operation) (reconcile.LookupResult, error) {
	p, err := q.Client.Lookup(ctx, op.IdempotencyKey())
	switch {
	case errors.Is(err, fakebank.ErrNotFound):
		return reconcile.LookupResult{Status: reconcile.NotFound}, nil
	case err != nil:
		return reconcile.LookupResult{}, err
	case p.Status == fakebank.StatusFailed:
		return reconcile.LookupResult{Status: reconcile.FoundFailed, ExternalRef: p.ID, Reason: p.DeclineReason}, nil
	default:
		return reconcile.LookupResult{Status: reconcile.FoundSucceeded, ExternalRef: p.ID, Amount: p.Amount, Currency: p.Currency}, nil
	}
}

// Statement reads the fake bank's statement.
func Statement(c *fakebank.Client) reconcile.Statement {
	return reconcile.StatementFunc(func(ctx context.Context, from, to time.Time) ([]reconcile.StatementEntry, error) {
		pays, err := c.Statement(ctx, fakebank.StatementQuery{From: from, To: to})
		if err != nil {
			return nil, err
		}
		out := make([]reconcile.StatementEntry, len(pays))
		for i, p := range pays {
			out[i] = reconcile.StatementEntry{Key: p.IdempotencyKey, ExternalRef: p.ID, Amount: p.Amount, Currency: p.Currency, At: p.CreatedAt}
		}
		return out, nil
	})
}
