package reconcile_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/internal/outbox"
	"github.com/stepwise-go/stepwise/internal/reconcile"
	"github.com/stepwise-go/stepwise/internal/testkit"
	"github.com/stepwise-go/stepwise/workflowtest"
	"github.com/stepwise-go/stepwise/workflowtest/fakebank"
)

// TestTotalsCountAPayoutWhoseSenderWasKilled: the drill of a real process, SIGKILLed right
// after the bank applied its payout and before it recorded anything, then reconciled by a
// survivor to SUCCEEDED. The day's totals against the bank's statement match: the payout is
// counted on the day its claim was taken, not missing from the ledger's side.
func TestTotalsCountAPayoutWhoseSenderWasKilled(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := testkit.DBURL(t)
	pool, err := pgxpool.New(ctx, dbURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	registerPayout(t, pool)
	bank := fakebank.New(nil)
	require.NoError(t, bank.Start())
	t.Cleanup(func() { _ = bank.Close() })
	client := fakebank.NewClient(bank.URL(), &http.Client{Timeout: 5 * time.Second})
	from := time.Now().Add(-time.Minute)

	op := payout("settle/drill-totals/m-1", "acct-1", 4200)
	id := outbox.OperationID("payout", op.BusinessKey)
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := outbox.Enqueue(ctx, tx, op)
		return err
	}))
	child := workflowtest.Start(t, "outbox-worker", "DATABASE_URL="+dbURL, "BANK_URL="+bank.URL(), "STEPWISE_FAULTS=after-send:kill")
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	_, err = child.WaitForLine(wctx, "stepwise-fault: after-send:kill")
	require.NoError(t, err)
	var exit *exec.ExitError
	require.True(t, errors.As(child.Wait(), &exit))
	require.Equal(t, syscall.SIGKILL, exit.Sys().(syscall.WaitStatus).Signal())
	require.Equal(t, 1, bank.Effects(id.String()), "the bank applied it")

	b := &bundle{pool: pool, bank: bank, client: client}
	discard := slog.New(slog.DiscardHandler)
	b.ob, err = outbox.New(pool, &outbox.Config{ID: "survivor", Logger: discard, Kinds: map[string]*outbox.KindConfig{"payout": {
		Sender: bankSender{Client: client}, Timeout: time.Second, Lease: 2 * time.Second}}})
	require.NoError(t, err)
	b.rec, err = reconcile.New(pool, &reconcile.Config{Outbox: b.ob, Logger: discard, Interval: time.Second,
		Kinds: map[string]*reconcile.KindConfig{"payout": {Checker: bankChecker{Client: client}, Grace: 5 * time.Second}}})
	require.NoError(t, err)
	b.startClient(t)
	b.waitQuiet(t, 60*time.Second)
	got := b.get(t, op.BusinessKey)
	require.Equal(t, outbox.StateSucceeded, got.State, "proven by the reconciler")
	require.Nil(t, got.LastSentAt, "its sender never recorded the send")

	totals, err := reconcile.CompareTotals(ctx, pool, bankStatement(client),
		&reconcile.TotalsParams{Kind: "payout", From: from, To: time.Now().Add(time.Minute)})
	require.NoError(t, err)
	t.Log("\n" + totals.String())
	require.True(t, totals.Match(), totals.String())
	require.Equal(t, map[string]reconcile.Sum{"EUR": {Count: 1, Amount: 4200}}, totals.Here)
}
