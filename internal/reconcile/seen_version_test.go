package reconcile_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/internal/outbox"
	"github.com/stepwise-go/stepwise/internal/reconcile"
	"github.com/stepwise-go/stepwise/workflowtest/fakebank"
)

// TestResolveWithExpectedVersionRefusesAnotherEpisode (ABA): a decision carries the version
// the person saw. An operation that left MANUAL (resent by someone else) and came back to
// MANUAL is refused with what it is now, although its state is the one seen; with the
// current version the decision goes through. Without a version only the state is checked.
func TestResolveWithExpectedVersionRefusesAnotherEpisode(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, nil, func(_ *outbox.KindConfig, rk *reconcile.KindConfig) {
		rk.MaxChecks = 1
		rk.CheckBackoff = func(int) time.Duration { return 0 }
	})
	p := payout("settle/aba", "acct-a", 700)
	id := outbox.OperationID("payout", p.BusinessKey)
	b.bank.FailKey(id.String(), fakebank.Error5xxBeforeApply)
	b.enqueue(t, p)
	toManual := func() {
		b.drain(t)
		_, err := b.rec.RunOnce(ctx, &reconcile.RunOpts{Force: true})
		require.NoError(t, err)
		require.Equal(t, outbox.StateManual, b.get(t, p.BusinessKey).State)
	}
	toManual()
	seen := b.get(t, p.BusinessKey)
	require.Equal(t, int64(4), seen.Version, "PENDING 1, PROCESSING 2, UNKNOWN_EXTERNAL 3, MANUAL 4")

	_, err := b.rec.Resolve(ctx, &reconcile.ResolveOpts{OperationID: id, Outcome: outbox.StateRetryable, ExpectedState: outbox.StateManual,
		ExpectedVersion: seen.Version, Actor: "bob", Reason: "INC-5: the bank is back, send again"})
	require.NoError(t, err)
	// Meanwhile the key was paid at the bank with another amount (a bug elsewhere): the
	// resend conflicts, and the lookup finds 999 EUR.
	_, err = b.client.Pay(ctx, id.String(), fakebank.PaymentRequest{Account: "acct-a", Amount: 999, Currency: "EUR", Reference: "elsewhere"})
	require.NoError(t, err)
	toManual()
	require.Contains(t, b.get(t, p.BusinessKey).ManualReason, "999 EUR")

	_, err = b.rec.Resolve(ctx, &reconcile.ResolveOpts{OperationID: id, Outcome: outbox.StateFailedPermanent, ExpectedState: outbox.StateManual,
		ExpectedVersion: seen.Version, Actor: "alice", Reason: "never sent"})
	var changed *outbox.StateChangedError
	require.True(t, errors.As(err, &changed), "%v", err)
	require.ErrorIs(t, err, outbox.ErrStateChanged)
	require.Equal(t, outbox.StateManual, changed.Actual)
	require.Equal(t, seen.Version+4, changed.ActualVersion)
	require.ErrorContains(t, err, "is MANUAL again, but not the MANUAL you saw: it changed state 4 time(s) since")
	now := b.get(t, p.BusinessKey)
	require.Equal(t, outbox.StateManual, now.State)
	require.Equal(t, seen.Version+4, now.Version)

	for _, bad := range []reconcile.ResolveOpts{
		{Actor: "alice\nroot", Reason: "x"}, {Actor: "alice", Reason: "ok \u202etxet"}, {Actor: "alice", Reason: "a\u200bb"},
		{Actor: "alice", Reason: "x", ExpectedVersion: -1},
	} {
		bad.OperationID, bad.Outcome, bad.ExpectedState = id, outbox.StateSucceeded, outbox.StateManual
		_, err := b.rec.Resolve(ctx, &bad)
		require.ErrorIs(t, err, reconcile.ErrInvalidResolution, "%+v", bad)
	}

	got, err := b.rec.Resolve(ctx, &reconcile.ResolveOpts{OperationID: id, Outcome: outbox.StateFailedPermanent, ExpectedState: outbox.StateManual,
		ExpectedVersion: now.Version, Actor: "alice", Reason: "TICKET-8: the bank confirms it never arrived"})
	require.NoError(t, err)
	require.Equal(t, outbox.StateFailedPermanent, got.State)
	require.Equal(t, now.Version+1, got.Version)
}
