package reconcile_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/internal/outbox"
	"github.com/stepwise-go/stepwise/internal/reconcile"
	"github.com/stepwise-go/stepwise/workflowtest/fakebank"
)

// unknown makes operations UNKNOWN_EXTERNAL the honest way: their send meets an ambiguous 5xx
// (before apply, so the bank holds nothing).
func (b *bundle) unknown(t testing.TB, ops ...outbox.EnqueueParams) {
	t.Helper()
	for _, op := range ops {
		b.bank.FailKey(outbox.OperationID(op.Kind, op.BusinessKey).String(), fakebank.Error5xxBeforeApply)
	}
	b.enqueue(t, ops...)
	b.drain(t)
	for _, op := range ops {
		require.Equal(t, outbox.StateUnknownExternal, b.get(t, op.BusinessKey).State)
	}
}

// TestEachLookupResult checks the transition each lookup result produces, with the outcome
// callback run once, in the transaction of the transition.
func TestEachLookupResult(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	answers := map[string]func() (reconcile.LookupResult, error){
		"found-succeeded": func() (reconcile.LookupResult, error) {
			return reconcile.LookupResult{Status: reconcile.LookupFoundSucceeded, ExternalRef: "pay-1", Amount: 100, Currency: "EUR"}, nil
		},
		"found-failed": func() (reconcile.LookupResult, error) {
			return reconcile.LookupResult{Status: reconcile.LookupFoundFailed, Reason: "account closed"}, nil
		},
		"pending": func() (reconcile.LookupResult, error) {
			return reconcile.LookupResult{Status: reconcile.LookupPending}, nil
		},
		"lookup-error": func() (reconcile.LookupResult, error) {
			return reconcile.LookupResult{}, errors.New("503 from the lookup API")
		},
		"not-found": func() (reconcile.LookupResult, error) {
			return reconcile.LookupResult{Status: reconcile.LookupNotFound}, nil
		},
		"not-found-after-grace": func() (reconcile.LookupResult, error) {
			return reconcile.LookupResult{Status: reconcile.LookupNotFound}, nil
		},
		"amount-differs": func() (reconcile.LookupResult, error) {
			return reconcile.LookupResult{Status: reconcile.LookupFoundSucceeded, ExternalRef: "pay-2", Amount: 101, Currency: "EUR"}, nil
		},
		"currency-differs": func() (reconcile.LookupResult, error) {
			return reconcile.LookupResult{Status: reconcile.LookupFoundSucceeded, ExternalRef: "pay-3", Amount: 100, Currency: "USD"}, nil
		},
	}
	b := setup(t, nil, func(_ *outbox.KindConfig, rk *reconcile.KindConfig) {
		rk.Checker = reconcile.CheckerFunc(func(ctx context.Context, op *outbox.Operation) (reconcile.LookupResult, error) {
			return answers[op.BusinessKey]()
		})
	})
	var ops []outbox.EnqueueParams
	for k := range answers {
		ops = append(ops, payout(k, "acct", 100))
	}
	b.unknown(t, ops...)
	b.sentLongAgo(t, "not-found-after-grace")

	res, err := b.rec.RunOnce(ctx, nil)
	require.NoError(t, err)
	require.Equal(t, len(answers), res.Checked)
	require.Equal(t, map[string]int{"succeeded": 3, "failed": 1, "pending": 1, "error": 1, "not_found": 2}, res.Lookups)

	cases := []struct {
		key       string
		state     outbox.State
		callbacks []string
		check     func(t *testing.T, op *outbox.Operation)
	}{
		{"found-succeeded", outbox.StateSucceeded, []string{"PROCESSING>UNKNOWN_EXTERNAL", "UNKNOWN_EXTERNAL>SUCCEEDED"}, func(t *testing.T, op *outbox.Operation) {
			require.Equal(t, "pay-1", op.ExternalRef)
		}},
		{"found-failed", outbox.StateFailedPermanent, []string{"PROCESSING>UNKNOWN_EXTERNAL", "UNKNOWN_EXTERNAL>FAILED_PERMANENT"}, func(t *testing.T, op *outbox.Operation) {
			require.Contains(t, op.LastError, "account closed")
		}},
		{"pending", outbox.StateUnknownExternal, []string{"PROCESSING>UNKNOWN_EXTERNAL"}, func(t *testing.T, op *outbox.Operation) {
			require.Equal(t, 1, op.Checks)
			require.WithinDuration(t, time.Now().Add(time.Hour), *op.NextCheckAt, time.Minute, "next check after the backoff")
			require.Contains(t, op.LastLookup, "pending")
		}},
		{"lookup-error", outbox.StateUnknownExternal, []string{"PROCESSING>UNKNOWN_EXTERNAL"}, func(t *testing.T, op *outbox.Operation) {
			require.WithinDuration(t, time.Now().Add(time.Hour), *op.NextCheckAt, time.Minute)
			require.Contains(t, op.LastLookup, "503 from the lookup API")
		}},
		{"not-found", outbox.StateUnknownExternal, []string{"PROCESSING>UNKNOWN_EXTERNAL"}, func(t *testing.T, op *outbox.Operation) {
			require.WithinDuration(t, op.InFlightUntil.Add(time.Hour), *op.NextCheckAt, 2*time.Second, "waits for the end of the grace period")
			require.Contains(t, op.LastLookup, "grace")
		}},
		{"not-found-after-grace", outbox.StateRetryable, []string{"PROCESSING>UNKNOWN_EXTERNAL", "UNKNOWN_EXTERNAL>RETRYABLE"}, nil},
		{"amount-differs", outbox.StateManual, []string{"PROCESSING>UNKNOWN_EXTERNAL", "UNKNOWN_EXTERNAL>MANUAL"}, func(t *testing.T, op *outbox.Operation) {
			require.Contains(t, op.ManualReason, "mismatch")
			require.Contains(t, op.ManualReason, "101 EUR")
		}},
		{"currency-differs", outbox.StateManual, []string{"PROCESSING>UNKNOWN_EXTERNAL", "UNKNOWN_EXTERNAL>MANUAL"}, func(t *testing.T, op *outbox.Operation) {
			require.Contains(t, op.ManualReason, "mismatch")
		}},
	}
	for _, tc := range cases {
		t.Run(tc.key, func(t *testing.T) {
			op := b.get(t, tc.key)
			require.Equal(t, tc.state, op.State)
			require.Equal(t, tc.callbacks, b.callbacks(t, op.ID))
			if tc.check != nil {
				tc.check(t, op)
			}
		})
	}
}

// TestNotFoundGraceThenResendUnderTheSameID: a not-found inside the grace period does not
// resend; after it, the operation is sent again under the same id and the bank holds one
// effect.
func TestNotFoundGraceThenResendUnderTheSameID(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, nil, nil)
	op := payout("settle/m-1", "acct-1", 700)
	b.unknown(t, op)
	id := outbox.OperationID("payout", op.BusinessKey)
	require.Equal(t, 0, b.bank.Effects(id.String()))
	requests := b.bank.Stats().Requests

	res, err := b.rec.RunOnce(ctx, &reconcile.RunOpts{Force: true})
	require.NoError(t, err)
	require.Equal(t, 1, res.Lookups["not_found"])
	b.drain(t)
	require.Equal(t, outbox.StateUnknownExternal, b.get(t, op.BusinessKey).State, "inside the grace period: wait, do not resend")
	require.Equal(t, requests, b.bank.Stats().Requests)

	b.sentLongAgo(t, op.BusinessKey)
	res, err = b.rec.RunOnce(ctx, nil)
	require.NoError(t, err)
	require.Equal(t, 1, res.Moved[outbox.StateRetryable])
	b.drain(t)

	got := b.get(t, op.BusinessKey)
	require.Equal(t, outbox.StateSucceeded, got.State)
	require.Equal(t, 2, got.Attempts)
	require.Equal(t, 1, b.bank.Effects(id.String()), "one effect, under the operation's own id")
	require.Len(t, b.bank.Applied(), 1)
	require.Equal(t, id.String(), b.bank.Applied()[0].IdempotencyKey)
	require.Empty(t, b.bank.DuplicateReferences())
}

// TestFoundAfterDroppedAnswer: the bank applied the payment and the answer was lost. The
// reconciler finds it: SUCCEEDED, nothing sent again.
func TestFoundAfterDroppedAnswer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, nil, nil)
	op := payout("settle/m-2", "acct-2", 800)
	id := outbox.OperationID("payout", op.BusinessKey)
	b.bank.FailKey(id.String(), fakebank.DropAfterApply)
	b.enqueue(t, op)
	b.drain(t)
	require.Equal(t, outbox.StateUnknownExternal, b.get(t, op.BusinessKey).State)

	_, err := b.rec.RunOnce(ctx, nil)
	require.NoError(t, err)
	got := b.get(t, op.BusinessKey)
	require.Equal(t, outbox.StateSucceeded, got.State)
	require.Equal(t, b.bank.Applied()[0].ID, got.ExternalRef)
	require.Equal(t, 1, b.bank.Stats().Requests, "found, not resent")
	require.Equal(t, 1, b.bank.Effects(id.String()))
}

// TestOverlappingPassesProcessEachOperationOnce runs two passes at once. Each operation is
// looked up once and its outcome callback runs once.
func TestOverlappingPassesProcessEachOperationOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var (
		mu       sync.Mutex
		lookups  = map[string]int{}
		entered  = make(chan struct{}, 1000)
		release  = make(chan struct{})
		releaseO sync.Once
	)
	b := setup(t, nil, func(_ *outbox.KindConfig, rk *reconcile.KindConfig) {
		rk.BatchSize, rk.Concurrency = 10, 10
		inner := rk.Checker
		rk.Checker = reconcile.CheckerFunc(func(ctx context.Context, op *outbox.Operation) (reconcile.LookupResult, error) {
			mu.Lock()
			lookups[op.BusinessKey]++
			mu.Unlock()
			entered <- struct{}{}
			<-release
			return inner.Lookup(ctx, op)
		})
	})
	b.paidButUnknown(t, 40)

	var wg sync.WaitGroup
	var results [2]*reconcile.PassResult
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := b.rec.RunOnce(ctx, nil)
			require.NoError(t, err)
			results[i] = res
		}()
	}
	// Both passes are inside a batch at the same time before any lookup is answered.
	for range 20 {
		select {
		case <-entered:
		case <-time.After(30 * time.Second):
			t.Fatal("the two passes did not both start a batch")
		}
	}
	releaseO.Do(func() { close(release) })
	wg.Wait()

	require.Equal(t, 40, results[0].Checked+results[1].Checked)
	require.NotZero(t, results[0].Checked)
	require.NotZero(t, results[1].Checked)
	for i := range 40 {
		require.Equal(t, 1, lookups[key(i)], key(i))
		op := b.get(t, key(i))
		require.Equal(t, outbox.StateSucceeded, op.State)
		require.Equal(t, []string{"PROCESSING>UNKNOWN_EXTERNAL", "UNKNOWN_EXTERNAL>SUCCEEDED"}, b.callbacks(t, op.ID))
	}
}

// TestForcedCheckDuringAPassFencesTheSlowerDecision: a person forces a check of an operation
// while a pass is still asking about it. Both look it up; only the later claim's decision is
// recorded, and the callback runs once.
func TestForcedCheckDuringAPassFencesTheSlowerDecision(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var calls atomic.Int64
	slowEntered, slowRelease := make(chan struct{}), make(chan struct{})
	b := setup(t, nil, func(_ *outbox.KindConfig, rk *reconcile.KindConfig) {
		inner := rk.Checker
		rk.Checker = reconcile.CheckerFunc(func(ctx context.Context, op *outbox.Operation) (reconcile.LookupResult, error) {
			if calls.Add(1) == 1 {
				close(slowEntered)
				<-slowRelease
			}
			return inner.Lookup(ctx, op)
		})
	})
	op := payout("settle/m-9", "acct", 900)
	b.bank.FailKey(outbox.OperationID("payout", op.BusinessKey).String(), fakebank.Error5xxAfterApply)
	b.enqueue(t, op)
	b.drain(t)

	slowDone := make(chan *reconcile.PassResult)
	go func() {
		res, err := b.rec.RunOnce(ctx, nil)
		require.NoError(t, err)
		slowDone <- res
	}()
	<-slowEntered
	id := outbox.OperationID("payout", op.BusinessKey)
	res, err := b.rec.RunOnce(ctx, &reconcile.RunOpts{OperationID: id})
	require.NoError(t, err)
	require.Equal(t, 1, res.Moved[outbox.StateSucceeded])
	close(slowRelease)
	slow := <-slowDone
	require.Equal(t, 1, slow.Checked)
	require.Empty(t, slow.Moved, "the slower decision was made under an older check and is not recorded")

	require.Equal(t, []string{"PROCESSING>UNKNOWN_EXTERNAL", "UNKNOWN_EXTERNAL>SUCCEEDED"}, b.callbacks(t, id))
	require.Equal(t, 2, b.get(t, op.BusinessKey).Checks)
}

// A pass keeps Concurrency lookups in flight across its batches: it claims the next batch
// while the last is still being looked up. When a pass looked up and recorded one batch before
// claiming the next, a batch of 5 held it to 5 lookups at once whatever Concurrency said (and
// every batch waited for its slowest lookup).
func TestPassKeepsConcurrencyLookupsInFlightAcrossBatches(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const concurrency, batch, n = 20, 5, 40
	var (
		mu       sync.Mutex
		inFlight int
		peak     int
		release  = make(chan struct{})
	)
	b := setup(t, nil, func(_ *outbox.KindConfig, rk *reconcile.KindConfig) {
		rk.BatchSize, rk.Concurrency = batch, concurrency
		inner := rk.Checker
		rk.Checker = reconcile.CheckerFunc(func(ctx context.Context, op *outbox.Operation) (reconcile.LookupResult, error) {
			mu.Lock()
			inFlight++
			if inFlight > peak {
				peak = inFlight
				if peak == concurrency {
					close(release)
				}
			}
			mu.Unlock()
			select { // held until Concurrency lookups are in flight at once, or a second
			case <-release:
			case <-time.After(time.Second):
			}
			mu.Lock()
			inFlight--
			mu.Unlock()
			return inner.Lookup(ctx, op)
		})
	})
	b.paidButUnknown(t, n)

	res, err := b.rec.RunOnce(ctx, nil)
	require.NoError(t, err)
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, concurrency, peak, "lookups in flight at once with batches of %d and Concurrency %d", batch, concurrency)
	require.Equal(t, n, res.Checked)
	require.Equal(t, n, res.Moved[outbox.StateSucceeded], "lookups %v", res.Lookups)
	require.Equal(t, int64(n), b.counts(t)[outbox.StateSucceeded])
}
