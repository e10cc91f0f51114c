package outbox_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/internal/outbox"
	"github.com/stepwise-go/stepwise/internal/testkit"
	"github.com/stepwise-go/stepwise/workflowtest/fakebank"
)

// TestDeliver10000WithMixedFaults delivers 10,000 operations through River against the fake
// bank, 10% of them meeting a fault (every fault class, plus declines). No operation may be
// lost, none applied twice, and every one must end in the state the classification table
// predicts for what happened to it.
func TestDeliver10000WithMixedFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("10,000 operations: skipped with -short")
	}
	t.Parallel()
	ctx := context.Background()
	pool := testkit.DB(t)
	bank, client := startBank(t, &fakebank.Config{Delay: 6 * time.Second}, 10*time.Second, false)
	ob, err := outbox.New(pool, &outbox.Config{
		Logger: slog.New(slog.DiscardHandler),
		Kinds: map[string]*outbox.KindConfig{"payout": {
			Sender:       bankSender{Client: client},
			BatchSize:    200,
			Concurrency:  32,
			Timeout:      2 * time.Second, // generous: a loaded CI machine must not turn a normal answer into a timeout
			RetryBackoff: func(int) time.Duration { return 50 * time.Millisecond },
		}},
	})
	require.NoError(t, err)
	rc := startClient(t, pool, ob, river.NewWorkers())

	type fate struct {
		fault    fakebank.Fault
		declined bool
	}
	faults := []fate{
		{fault: fakebank.RefuseBeforeApply}, {fault: fakebank.Error5xxBeforeApply},
		{fault: fakebank.Error5xxAfterApply}, {fault: fakebank.DropAfterApply},
		{fault: fakebank.DelayAfterApply}, {declined: true},
	}
	const total = 10000
	fates := make(map[string]fate, total)
	ops := make([]outbox.EnqueueParams, 0, total)
	for i := range total {
		var f fate
		if i%10 == 0 {
			f = faults[(i/10)%len(faults)]
		}
		account := fmt.Sprintf("acct-%d", i)
		if f.declined {
			account = "closed-" + account
		}
		op := payout(fmt.Sprintf("load/m-%05d", i), account, int64(100+i))
		ops = append(ops, op)
		id := outbox.OperationID(op.Kind, op.BusinessKey).String()
		fates[id] = f
		if f.fault != fakebank.NoFault {
			bank.FailKey(id, f.fault)
		}
	}
	start := time.Now()
	wctx := ob.Local().Context(ctx, rc)
	for b := 0; b < total; b += 500 {
		require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := outbox.Enqueue(wctx, tx, ops[b:b+500]...)
			return err
		}))
	}

	// Wait until nothing is left to send.
	deadline := time.Now().Add(3 * time.Minute)
	for {
		c := stateCounts(t, pool)
		if c[outbox.StatePending]+c[outbox.StateProcessing]+c[outbox.StateRetryable] == 0 {
			break
		}
		require.True(t, time.Now().Before(deadline), "delivery did not finish: %v", c)
		time.Sleep(50 * time.Millisecond)
	}
	elapsed := time.Since(start)

	counts := stateCounts(t, pool)
	t.Logf("10,000 operations delivered in %s; by state: %v", elapsed.Round(time.Millisecond), counts)
	var n int64
	for _, c := range counts {
		n += c
	}
	require.Equal(t, int64(total), n, "no operation lost")

	rows, err := pool.Query(ctx, `SELECT `+outbox.Columns("o")+` FROM stepwise_operation o`)
	require.NoError(t, err)
	all, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (*outbox.Operation, error) { return outbox.ScanOperation(r) })
	require.NoError(t, err)
	require.Len(t, all, total)

	ledger := bank.Ledger()
	for _, op := range all {
		f := fates[op.ID.String()]
		wantState, wantEffects, wantAttempts := outbox.StateSucceeded, 1, 1
		switch {
		case f.declined:
			wantState = outbox.StateFailedPermanent
		case f.fault == fakebank.RefuseBeforeApply:
			wantAttempts = 2 // refused, then resent under the same id
		case f.fault == fakebank.Error5xxBeforeApply:
			wantState, wantEffects = outbox.StateUnknownExternal, 0
		case f.fault != fakebank.NoFault:
			wantState = outbox.StateUnknownExternal
		}
		require.Equal(t, wantState, op.State, "%s (fault %v, declined %v): %s", op.BusinessKey, f.fault, f.declined, op.LastError)
		require.Equal(t, wantEffects, ledger.Effects(op.ID.String()), op.BusinessKey)
		require.Equal(t, wantAttempts, op.Attempts, op.BusinessKey)
	}
	require.Empty(t, ledger.DuplicateReferences(), "no payment applied under two keys")
	notApplied := 0
	for _, f := range fates {
		if f.fault == fakebank.Error5xxBeforeApply {
			notApplied++
		}
	}
	require.Equal(t, total-notApplied, len(ledger.Payments), "every effect but the 5xx-before-apply ones")
}
