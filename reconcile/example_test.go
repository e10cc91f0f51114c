package reconcile_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stepwise-go/stepwise/outbox"
	"github.com/stepwise-go/stepwise/reconcile"
)

// payment is what a provider's lookup API returns.
type payment struct {
	Ref      string
	Status   string // "paid", "declined", "processing"
	Amount   int64
	Currency string
}

var errNoSuchPayment = errors.New("no such payment")

// A Checker asks the external system about an operation by its id. "Never heard of it" is
// an answer (LookupNotFound: resent under the same id after the grace period); an error is
// not (the operation is checked again later).
func ExampleCheckerFunc() {
	var lookup func(ctx context.Context, idempotencyKey string) (payment, error) // your provider's API
	checker := reconcile.CheckerFunc(func(ctx context.Context, op *outbox.Operation) (reconcile.LookupResult, error) {
		p, err := lookup(ctx, op.IdempotencyKey())
		switch {
		case errors.Is(err, errNoSuchPayment):
			return reconcile.LookupResult{Status: reconcile.LookupNotFound}, nil
		case err != nil:
			return reconcile.LookupResult{}, err
		case p.Status == "paid":
			return reconcile.LookupResult{Status: reconcile.LookupFoundSucceeded, ExternalRef: p.Ref, Amount: p.Amount, Currency: p.Currency}, nil
		case p.Status == "declined":
			return reconcile.LookupResult{Status: reconcile.LookupFoundFailed, ExternalRef: p.Ref}, nil
		default:
			return reconcile.LookupResult{Status: reconcile.LookupPending}, nil
		}
	})
	_ = checker // stepwise.KindConfig{Sender: ..., Checker: checker}
}

// CompareTotals compares a day of the ledger with the provider's statement, effect by effect.
func ExampleCompareTotals() {
	compare := func(ctx context.Context, pool *pgxpool.Pool, statement reconcile.Statement, day time.Time) error {
		totals, err := reconcile.CompareTotals(ctx, pool, statement, &reconcile.TotalsParams{
			Kind: "payout", From: day, To: day.AddDate(0, 0, 1),
		})
		if err != nil {
			return err
		}
		if !totals.Match() {
			fmt.Println(totals) // counts and sums per currency on each side, and every difference
		}
		return nil
	}
	_ = compare
}
