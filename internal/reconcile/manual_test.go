package reconcile_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/internal/outbox"
	"github.com/stepwise-go/stepwise/internal/reconcile"
	"github.com/stepwise-go/stepwise/workflowtest/fakebank"
)

// TestMismatchAndGiveUpGoToManualThenResolve: a payment found with another amount and one the
// reconciler gave up on both land in MANUAL with their reasons; a person resolves them, and a
// decision on a state that has changed since is refused.
func TestMismatchAndGiveUpGoToManualThenResolve(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, nil, func(_ *outbox.KindConfig, rk *reconcile.KindConfig) {
		rk.MaxChecks = 2
		rk.CheckBackoff = func(int) time.Duration { return 0 }
	})

	// Mismatch: someone paid our key at the bank with another amount before we sent it (a
	// bug elsewhere). Our send conflicts (409, ambiguous), the lookup finds 990, not 1000.
	mismatch := payout("settle/mismatch", "acct-m", 1000)
	mismatchID := outbox.OperationID("payout", mismatch.BusinessKey)
	_, err := b.client.Pay(ctx, mismatchID.String(), fakebank.PaymentRequest{Account: "acct-m", Amount: 990, Currency: "EUR", Reference: "elsewhere"})
	require.NoError(t, err)
	// Give-up: the bank never applied it, and within the grace period it is never resent.
	giveUp := payout("settle/give-up", "acct-g", 500)
	b.bank.FailKey(outbox.OperationID("payout", giveUp.BusinessKey).String(), fakebank.Error5xxBeforeApply)
	b.enqueue(t, mismatch, giveUp)
	b.drain(t)
	require.Equal(t, int64(2), b.counts(t)[outbox.StateUnknownExternal])

	for range 2 {
		_, err := b.rec.RunOnce(ctx, &reconcile.RunOpts{Force: true})
		require.NoError(t, err)
	}
	m := b.get(t, mismatch.BusinessKey)
	require.Equal(t, outbox.StateManual, m.State)
	require.Contains(t, m.ManualReason, "mismatch: the external system holds 990 EUR")
	require.Contains(t, m.ManualReason, "the ledger 1000 EUR")
	g := b.get(t, giveUp.BusinessKey)
	require.Equal(t, outbox.StateManual, g.State)
	require.Contains(t, g.ManualReason, "gave up: 2 checks (MaxChecks 2)")
	require.Contains(t, g.ManualReason, "not found")

	manual, err := outbox.List(ctx, b.pool, &outbox.ListParams{State: outbox.StateManual})
	require.NoError(t, err)
	require.Len(t, manual, 2)

	// A person accepts the bank's amount for the mismatch ...
	got, err := b.rec.Resolve(ctx, &reconcile.ResolveOpts{
		OperationID: mismatchID, Outcome: outbox.StateSucceeded, ExpectedState: outbox.StateManual,
		Actor: "alice", Reason: "TICKET-42: the bank confirms 990 EUR paid; difference refunded by hand",
		ExternalRef: "pay-found-by-alice",
	})
	require.NoError(t, err)
	require.Equal(t, outbox.StateSucceeded, got.State)
	require.Equal(t, "pay-found-by-alice", got.ExternalRef)
	require.Equal(t, []string{"PROCESSING>UNKNOWN_EXTERNAL", "UNKNOWN_EXTERNAL>MANUAL", "MANUAL>SUCCEEDED"}, b.callbacks(t, mismatchID))
	var actor, reason string
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT actor, detail->>'reason' FROM stepwise_event
		WHERE subject = $1 AND to_state = 'SUCCEEDED'`, "op:"+mismatchID.String()).Scan(&actor, &reason))
	require.Equal(t, "alice", actor)
	require.Contains(t, reason, "TICKET-42")

	// ... and a colleague who looked at the same screen a minute ago is refused.
	_, err = b.rec.Resolve(ctx, &reconcile.ResolveOpts{
		OperationID: mismatchID, Outcome: outbox.StateFailedPermanent, ExpectedState: outbox.StateManual,
		Actor: "bob", Reason: "looked unpaid to me",
	})
	require.ErrorIs(t, err, outbox.ErrStateChanged)
	require.Contains(t, err.Error(), "is SUCCEEDED, not MANUAL")
	require.Equal(t, outbox.StateSucceeded, b.get(t, mismatch.BusinessKey).State)

	// The given-up one is sent again, under the same id, on a person's word.
	_, err = b.rec.Resolve(ctx, &reconcile.ResolveOpts{
		OperationID: g.ID, Outcome: outbox.StateRetryable, ExpectedState: outbox.StateManual,
		Actor: "alice", Reason: "the bank confirms it never arrived",
	})
	require.NoError(t, err)
	b.drain(t)
	require.Equal(t, outbox.StateSucceeded, b.get(t, giveUp.BusinessKey).State)
	require.Equal(t, 1, b.bank.Effects(g.ID.String()))
}

func TestResolveRejectsWhatAPersonMayNotDecide(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, nil, nil)
	op := payout("k", "acct", 1)
	b.unknown(t, op)
	id := outbox.OperationID("payout", "k")
	valid := reconcile.ResolveOpts{OperationID: id, Outcome: outbox.StateSucceeded, ExpectedState: outbox.StateUnknownExternal, Actor: "a", Reason: "r"}
	cases := []struct {
		name string
		mod  func(*reconcile.ResolveOpts)
	}{
		{"outcome PENDING", func(p *reconcile.ResolveOpts) { p.Outcome = outbox.StatePending }},
		{"outcome MANUAL", func(p *reconcile.ResolveOpts) { p.Outcome = outbox.StateManual }},
		{"expected SUCCEEDED", func(p *reconcile.ResolveOpts) { p.ExpectedState = outbox.StateSucceeded }},
		{"no actor", func(p *reconcile.ResolveOpts) { p.Actor = "" }},
		{"no reason", func(p *reconcile.ResolveOpts) { p.Reason = "" }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := valid
			tc.mod(&p)
			_, err := b.rec.Resolve(ctx, &p)
			require.ErrorIs(t, err, reconcile.ErrInvalidResolution)
		})
	}
	// UNKNOWN_EXTERNAL can be resolved by hand too, in the caller's transaction.
	require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		_, err := b.rec.ResolveTx(ctx, tx, &valid)
		return err
	}))
	require.Equal(t, outbox.StateSucceeded, b.get(t, "k").State)
}
