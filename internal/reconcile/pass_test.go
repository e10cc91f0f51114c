package reconcile_test

import (
	"context"
	"runtime"
	"strings"
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
