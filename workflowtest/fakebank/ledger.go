package fakebank

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/stepwise-go/stepwise/internal/outbox"
	"github.com/stepwise-go/stepwise/internal/reconcile"
)

// This file connects the fake bank to the operation ledger: an outbox sender, a reconcile
// lookup and a statement. Stepwise's tests and the sample settlement service use them, and
// they are the pattern for your own adapter to a real provider. Only the pattern carries
// over: a real provider documents its own answers, and your classification of them must
// follow that documentation, claiming no more than each answer proves.

// Payload is the part of an operation's JSON payload the bank needs beyond amount and
// currency. An operation may carry more fields; Sender reads only these.
type Payload struct {
	// Account is the payee account at the bank.
	Account string `json:"account"`
}

// Sender pays operations at the bank under their operation id as idempotency key
// (Operation.IdempotencyKey) and classifies the answer only as far as it proves something
// (the table in the package doc): declined is permanent (outbox.Permanent); a refusal before
// processing, or a request the wire shows never reached the bank, is not-sent
// (outbox.NotSent); everything else (a 5xx, a timeout, a dropped connection) may have paid
// and is returned as is, so the operation becomes UNKNOWN_EXTERNAL for the reconciler to ask
// about. The Client sends through outbox/httpsend, so net/http never resends a payment by
// itself. The operation's payload is JSON holding a Payload.
type Sender struct {
	Client *Client
}

// Send pays op.
func (s Sender) Send(ctx context.Context, op *outbox.Operation) (outbox.Receipt, error) {
	var p Payload
	if err := json.Unmarshal(op.Payload, &p); err != nil {
		// Sending a payment we cannot read would pay the wrong account or nobody.
		return outbox.Receipt{}, outbox.Permanent(fmt.Errorf("decoding the payload of operation %s: %w", op.ID, err))
	}
	pay, err := s.Client.Pay(ctx, op.IdempotencyKey(), PaymentRequest{
		Account: p.Account, Amount: op.Amount, Currency: op.Currency, Reference: op.BusinessKey,
	})
	switch {
	case err == nil:
		return outbox.Receipt{ExternalRef: pay.ID}, nil
	case IsDeclined(err):
		return outbox.Receipt{}, outbox.Permanent(err)
	case IsNotProcessed(err):
		return outbox.Receipt{}, outbox.NotSent(err)
	default:
		return outbox.Receipt{}, err
	}
}

// Checker answers the reconciler's question about an UNKNOWN_EXTERNAL operation (what did the
// bank do under this operation id?) from the bank's lookup by idempotency key. A failed
// lookup is returned as an error, so the reconciler asks again later; only the bank's
// explicit "no payment under this key" is reconcile.LookupNotFound.
type Checker struct {
	Client *Client
}

// Lookup asks the bank about op.
func (c Checker) Lookup(ctx context.Context, op *outbox.Operation) (reconcile.LookupResult, error) {
	p, err := c.Client.Lookup(ctx, op.IdempotencyKey())
	switch {
	case errors.Is(err, ErrNotFound):
		return reconcile.LookupResult{Status: reconcile.LookupNotFound}, nil
	case err != nil:
		return reconcile.LookupResult{}, err
	case p.Status == StatusSucceeded:
		return reconcile.LookupResult{Status: reconcile.LookupFoundSucceeded, ExternalRef: p.ID, Amount: p.Amount, Currency: p.Currency}, nil
	case p.Status == StatusFailed:
		return reconcile.LookupResult{Status: reconcile.LookupFoundFailed, ExternalRef: p.ID, Reason: p.DeclineReason}, nil
	default:
		return reconcile.LookupResult{Status: reconcile.LookupPending}, nil
	}
}

// Statement reads the bank's statement of succeeded payments, for reconciling totals.
func Statement(c *Client) reconcile.Statement {
	return reconcile.StatementFunc(func(ctx context.Context, from, to time.Time) ([]reconcile.StatementEntry, error) {
		pays, err := c.Statement(ctx, StatementQuery{From: from, To: to})
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
