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

	"github.com/stepwise-go/stepwise/internal/outbox"
	"github.com/stepwise-go/stepwise/internal/reconcile"
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
	b.paidButUnknown(t, n)
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

// Lookups go on while a recording transaction commits: the decisions queue up to a batch behind
// it. Before, the queue held Concurrency decisions, so a recording transaction longer than
// Concurrency / rate stalled every lookup worker until it committed (bench bigday: 0.61-0.71
// of the bank's limit at 256 in flight, the recorder busy 57-62% of the pass). Here the first
// recording blocks in its outcome callback until the lookups go a batch and Concurrency
// further (a batch queued, one held by each blocked worker), or 10 s; with the old queue they
// stopped 2 × Concurrency further.
func TestLookupsGoOnWhileRecording(t *testing.T) {
	ctx := context.Background()
	const conc, batch, n = 4, 40, 120
	var lookups atomic.Int64
	var first sync.Once
	var inFirst, atEnd int64
	b := setup(t, nil, func(okc *outbox.KindConfig, rk *reconcile.KindConfig) {
		rk.BatchSize, rk.Concurrency = batch, conc
		inner := rk.Checker
		rk.Checker = reconcile.CheckerFunc(func(ctx context.Context, op *outbox.Operation) (reconcile.LookupResult, error) {
			defer lookups.Add(1)
			return inner.Lookup(ctx, op)
		})
		one := okc.OnOutcome
		okc.OnOutcome = nil
		okc.OnOutcomeBatch = func(ctx context.Context, tx pgx.Tx, oos []outbox.OperationOutcome) error {
			if oos[0].Outcome.From == outbox.StateUnknownExternal {
				first.Do(func() {
					// Every lookup counted so far is in this transaction or waiting behind it.
					inFirst = int64(len(oos))
					for deadline := time.Now().Add(10 * time.Second); lookups.Load() < inFirst+batch+conc && time.Now().Before(deadline); {
						time.Sleep(5 * time.Millisecond)
					}
					atEnd = lookups.Load()
				})
			}
			for _, oo := range oos {
				if err := one(ctx, tx, oo.Op, oo.Outcome); err != nil {
					return err
				}
			}
			return nil
		}
	})
	b.paidButUnknown(t, n)

	res, err := b.rec.RunOnce(ctx, &reconcile.RunOpts{Force: true})
	require.NoError(t, err)
	require.Equal(t, n, res.Checked)
	require.NotZero(t, inFirst, "no recording transaction ran the callback")
	require.GreaterOrEqual(t, atEnd-inFirst, int64(batch),
		"lookups stopped while the first recording transaction (%d decisions) was open: %d made", inFirst, atEnd)
	require.Equal(t, int64(n), b.counts(t)[outbox.StateSucceeded])
}
