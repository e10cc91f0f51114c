package reconcile_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/internal/outbox"
	"github.com/stepwise-go/stepwise/internal/reconcile"
	"github.com/stepwise-go/stepwise/workflowtest/fakebank"
)

// TestTotalsListEveryDifference: a statement with one payment missing, one extra and one with
// another amount yields exactly those three differences, and the totals per currency.
func TestTotalsListEveryDifference(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, nil, nil)
	from := time.Now().Add(-time.Minute)

	// Five ordinary payouts, on both sides.
	var ops []outbox.EnqueueParams
	for i := range 5 {
		ops = append(ops, payout(key(i), "acct", int64(1000*(i+1))))
	}
	b.enqueue(t, ops...)
	b.drain(t)

	// Missing there: the bank never applied it, but a person marked it paid.
	missing := payout("settle/missing", "acct-x", 300)
	b.unknown(t, missing)
	missingID := outbox.OperationID("payout", missing.BusinessKey)
	_, err := b.rec.Resolve(ctx, &reconcile.ResolveOpts{OperationID: missingID, Outcome: outbox.StateSucceeded,
		ExpectedState: outbox.StateUnknownExternal, Actor: "carol", Reason: "assumed paid"})
	require.NoError(t, err)

	// Extra there: paid at the bank by hand, under a key the ledger never had.
	extraKey := uuid.NewString()
	_, err = b.client.Pay(ctx, extraKey, fakebank.PaymentRequest{Account: "acct-y", Amount: 4200, Currency: "EUR", Reference: "by hand"})
	require.NoError(t, err)

	// Amount differs: the bank holds 990 under our key, the ledger 1000 (accepted by a person).
	differs := payout("settle/differs", "acct-z", 1000)
	differsID := outbox.OperationID("payout", differs.BusinessKey)
	_, err = b.client.Pay(ctx, differsID.String(), fakebank.PaymentRequest{Account: "acct-z", Amount: 990, Currency: "EUR", Reference: "x"})
	require.NoError(t, err)
	b.enqueue(t, differs)
	b.drain(t)
	_, err = b.rec.Resolve(ctx, &reconcile.ResolveOpts{OperationID: differsID, Outcome: outbox.StateSucceeded,
		ExpectedState: outbox.StateUnknownExternal, Actor: "carol", Reason: "paid, amount to be checked"})
	require.NoError(t, err)

	totals, err := reconcile.CompareTotals(ctx, b.pool, bankStatement(b.client),
		&reconcile.TotalsParams{Kind: "payout", From: from, To: time.Now().Add(time.Minute)})
	require.NoError(t, err)
	t.Log("\n" + totals.String())

	require.False(t, totals.Match())
	require.Equal(t, map[string]reconcile.Sum{"EUR": {Count: 7, Amount: 15000 + 300 + 1000}}, totals.Here)
	require.Equal(t, map[string]reconcile.Sum{"EUR": {Count: 7, Amount: 15000 + 4200 + 990}}, totals.There)
	byKind := map[reconcile.DifferenceKind]reconcile.Difference{}
	for _, d := range totals.Differences {
		byKind[d.Kind] = d
	}
	require.Len(t, totals.Differences, 3)
	require.Len(t, byKind, 3)
	require.Equal(t, missingID.String(), byKind[reconcile.DifferenceOnlyHere].Key)
	require.Equal(t, int64(300), byKind[reconcile.DifferenceOnlyHere].OurAmount)
	require.Equal(t, extraKey, byKind[reconcile.DifferenceOnlyThere].Key)
	require.Equal(t, int64(4200), byKind[reconcile.DifferenceOnlyThere].Amount)
	require.Equal(t, outbox.State(""), byKind[reconcile.DifferenceOnlyThere].OurState, "not in the ledger at all")
	require.Equal(t, differsID.String(), byKind[reconcile.DifferenceAmountDiffers].Key)
	require.Equal(t, int64(1000), byKind[reconcile.DifferenceAmountDiffers].OurAmount)
	require.Equal(t, int64(990), byKind[reconcile.DifferenceAmountDiffers].Amount)
	require.Contains(t, totals.String(), "3 differences")
}

func TestTotalsMatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, nil, nil)
	from := time.Now().Add(-time.Minute)
	b.enqueue(t, payout(key(1), "acct", 100), payout(key(2), "acct", 200))
	b.drain(t)
	totals, err := reconcile.CompareTotals(ctx, b.pool, bankStatement(b.client),
		&reconcile.TotalsParams{Kind: "payout", From: from, To: time.Now().Add(time.Minute)})
	require.NoError(t, err)
	require.True(t, totals.Match(), totals.String())
	require.Contains(t, totals.String(), "every effect matches")

	_, err = reconcile.CompareTotals(ctx, b.pool, bankStatement(b.client), &reconcile.TotalsParams{Kind: "payout"})
	require.Error(t, err, "a period is required")
}
