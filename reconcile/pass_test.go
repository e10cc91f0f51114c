package reconcile_test

import (
	"context"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/outbox"
	"github.com/stepwise-go/stepwise/reconcile"
	"github.com/stepwise-go/stepwise/workflowtest/fakebank"
)

// passGoroutines counts the goroutines a pass started (its claimer, its lookup workers, the
// closer of its results) that are still alive.
func passGoroutines() int {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "reconcile.(*Reconciler).pass.func") {
			n++
		}
	}
	return n
}

// An outcome callback that panics (River's executor recovers a job's panic) ends the pass with
// that panic, leaves nothing recorded of the panicking transaction, and leaves none of the
// pass's goroutines behind. Before, the claimer and the lookup workers stayed blocked on queues
// nobody read any more, with their claimed operations, one set per periodic pass.
func TestPanickingCallbackLeavesNoPassGoroutines(t *testing.T) {
	ctx := context.Background()
	const n = 30
	var panicNow atomic.Bool
	b := setup(t, nil, func(okc *outbox.KindConfig, rk *reconcile.KindConfig) {
		rk.BatchSize, rk.Concurrency = 2, 2
		inner := okc.OnOutcome
		okc.OnOutcome = func(ctx context.Context, tx pgx.Tx, op *outbox.Operation, oc outbox.Outcome) error {
			if panicNow.Load() {
				panic("a bug in the outcome callback")
			}
			return inner(ctx, tx, op, oc)
		}
	})
	var ops []outbox.EnqueueParams
	for i := range n {
		ops = append(ops, payout(key(i), "acct", int64(100+i)))
		b.bank.FailKey(outbox.OperationID("payout", key(i)).String(), fakebank.Error5xxAfterApply)
	}
	b.enqueue(t, ops...)
	b.drain(t)
	require.Equal(t, int64(n), b.counts(t)[outbox.StateUnknownExternal])
	panicNow.Store(true)

	var recovered any
	func() {
		defer func() { recovered = recover() }()
		_, _ = b.rec.RunOnce(ctx, nil)
	}()
	require.Equal(t, "a bug in the outcome callback", recovered)
	require.Eventually(t, func() bool { return passGoroutines() == 0 }, 10*time.Second, 20*time.Millisecond,
		"the pass's goroutines are still alive after RunOnce panicked")
	require.Equal(t, int64(n), b.counts(t)[outbox.StateUnknownExternal], "the panicking transaction recorded something")
}

// A claim holds its operations (next_check_at pushed forward) until their answers are
// recorded, also when they wait behind slow recording transactions: an overlapping pass (another
// process's maintenance) claims none of them. With a hold that budgeted one recording (30 s),
// three recordings of 11 s each let the hold of the fourth operation lapse while its answer
// waited: the second pass claimed it again, asked the bank again, spent a check, and the first
// answer was dropped by the checks guard. Slow: about 35 s.
func TestClaimHoldCoversSlowRecordings(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const n = 5
	var slow atomic.Int32
	var mu sync.Mutex
	lookups := map[string]int{}
	b := setup(t, nil, func(okc *outbox.KindConfig, rk *reconcile.KindConfig) {
		rk.BatchSize, rk.Concurrency, rk.Timeout = 1, 1, 10*time.Millisecond
		inner := okc.OnOutcome
		okc.OnOutcome = func(ctx context.Context, tx pgx.Tx, op *outbox.Operation, oc outbox.Outcome) error {
			if oc.Actor == "reconcile" && slow.Add(1) <= 3 {
				time.Sleep(11 * time.Second) // a slow recording, well inside its 30 s
			}
			return inner(ctx, tx, op, oc)
		}
		rk.Checker = reconcile.CheckerFunc(func(_ context.Context, op *outbox.Operation) (reconcile.LookupResult, error) {
			mu.Lock()
			lookups[op.BusinessKey]++
			mu.Unlock()
			return reconcile.LookupResult{Status: reconcile.LookupFoundSucceeded, ExternalRef: "ref-" + op.BusinessKey,
				Amount: op.Amount, Currency: op.Currency}, nil
		})
	})
	var ops []outbox.EnqueueParams
	for i := range n {
		ops = append(ops, payout(key(i), "acct", int64(100+i)))
		b.bank.FailKey(outbox.OperationID("payout", key(i)).String(), fakebank.Error5xxAfterApply)
	}
	b.enqueue(t, ops...)
	b.drain(t)
	require.Equal(t, int64(n), b.counts(t)[outbox.StateUnknownExternal])

	first := make(chan *reconcile.PassResult, 1)
	go func() {
		res, err := b.rec.RunOnce(ctx, nil)
		if err != nil {
			t.Errorf("first pass: %v", err)
		}
		first <- res
	}()
	// The first pass records for at least 33 s; 31 s in, its claims are older than one
	// recording's budget.
	time.Sleep(31 * time.Second)
	second, err := b.rec.RunOnce(ctx, nil)
	require.NoError(t, err)
	res := <-first
	require.Zero(t, second.Checked, "an overlapping pass claimed operations whose answers the first pass still held")
	require.Equal(t, n, res.Checked)
	require.Equal(t, n, res.Moved[outbox.StateSucceeded])
	mu.Lock()
	defer mu.Unlock()
	for i := range n {
		require.Equal(t, 1, lookups[key(i)], "lookups of %s", key(i))
	}
}
