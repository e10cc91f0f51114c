package reconcile_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/internal/outbox"
	"github.com/stepwise-go/stepwise/internal/reconcile"
)

// slowBank is a strict fake of a bank that applies every request slowly, after the sender has
// given up on it: a request lands `land` after it was sent, whatever the sender does meanwhile.
// It remembers nothing per key that would make a second request harmless (a real bank's
// refusals and validation errors often are not remembered, and two concurrent requests with
// one key can both pass); instead it counts, as a violation, every request for an id that
// begins while an earlier one for that id is still on the wire.
type slowBank struct {
	land time.Duration

	mu         sync.Mutex
	inFlight   map[uuid.UUID]int
	requests   map[uuid.UUID]int
	applied    map[uuid.UUID]bool
	violations []string
	wg         sync.WaitGroup
}

func newSlowBank(land time.Duration) *slowBank {
	return &slowBank{land: land, inFlight: map[uuid.UUID]int{}, requests: map[uuid.UUID]int{}, applied: map[uuid.UUID]bool{}}
}

func (b *slowBank) Send(ctx context.Context, op *outbox.Operation) (outbox.Receipt, error) {
	b.mu.Lock()
	b.requests[op.ID]++
	if b.inFlight[op.ID] > 0 {
		b.violations = append(b.violations, fmt.Sprintf("%s: request %d began while %d earlier one(s) were still on the wire",
			op.ID, b.requests[op.ID], b.inFlight[op.ID]))
	}
	b.inFlight[op.ID]++
	b.mu.Unlock()
	landed := make(chan struct{})
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		time.Sleep(b.land)
		b.mu.Lock()
		b.inFlight[op.ID]--
		b.applied[op.ID] = true
		b.mu.Unlock()
		close(landed)
	}()
	select {
	case <-landed:
		return outbox.Receipt{ExternalRef: "slow-" + op.ID.String()[:8]}, nil
	case <-ctx.Done():
		return outbox.Receipt{}, ctx.Err() // it may still land: UNKNOWN_EXTERNAL
	}
}

func (b *slowBank) Lookup(_ context.Context, op *outbox.Operation) (reconcile.LookupResult, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.applied[op.ID] {
		return reconcile.LookupResult{Status: reconcile.LookupNotFound}, nil
	}
	return reconcile.LookupResult{Status: reconcile.LookupFoundSucceeded, ExternalRef: "slow-" + op.ID.String()[:8],
		Amount: op.Amount, Currency: op.Currency}, nil
}

// TestSlowBankNoResendWhileTheFirstRequestIsOnTheWire: with one sender, five operations are
// claimed together and sent one after another; each send times out (300ms) and the bank
// applies it 800ms after it was sent. The grace period (1.2s) is longer than the send timeout,
// as validation demands, and the bank lands well inside "send timeout + grace". The reconciler
// checks continuously. It must never resend an operation while its first request can still
// land. On 616d8b1 the grace ran from the claim, so the last operations (sent up to 1.2s after
// their claim) were found "not found after grace" and resent while their first request was on
// the wire.
func TestSlowBankNoResendWhileTheFirstRequestIsOnTheWire(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	bank := newSlowBank(800 * time.Millisecond)
	b := setup(t, nil, func(okc *outbox.KindConfig, rkc *reconcile.KindConfig) {
		okc.Sender, okc.Concurrency, okc.BatchSize, okc.Timeout = bank, 1, 5, 300*time.Millisecond
		rkc.Checker, rkc.Grace = bank, 1200*time.Millisecond
		rkc.CheckBackoff = func(int) time.Duration { return 10 * time.Millisecond }
	})
	keys := []string{"slow/1", "slow/2", "slow/3", "slow/4", "slow/5"}
	var ops []outbox.EnqueueParams
	for _, k := range keys {
		ops = append(ops, payout(k, "acct", 100))
	}
	b.enqueue(t, ops...)

	start := time.Now()
	n, err := b.ob.DeliverBatch(ctx, "payout")
	require.NoError(t, err)
	require.Equal(t, len(keys), n)
	t.Logf("delivered in %s: %v", time.Since(start).Round(time.Millisecond), b.counts(t))

	// The reconciler checks every UNKNOWN_EXTERNAL operation over and over, and the dispatcher
	// resends whatever it sends back, until all are settled.
	deadline := time.Now().Add(20 * time.Second)
	passes := 0
	for time.Now().Before(deadline) {
		_, err := b.rec.RunOnce(ctx, &reconcile.RunOpts{Force: true})
		require.NoError(t, err)
		b.drain(t)
		passes++
		c := b.counts(t)
		if c[outbox.StateSucceeded] == int64(len(keys)) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	bank.wg.Wait()
	bank.mu.Lock()
	defer bank.mu.Unlock()
	t.Logf("%d passes in %s; requests per id %v", passes, time.Since(start).Round(time.Millisecond), bank.requests)
	require.Empty(t, bank.violations, "a resend while the first request could still land")
	require.Equal(t, int64(len(keys)), b.counts(t)[outbox.StateSucceeded])
	for _, k := range keys {
		require.Equal(t, 1, bank.requests[outbox.OperationID("payout", k)], "sent once: %s", k)
	}
}

// TestRunMaintenanceReconcilesWithoutTheLeadersJob: with no periodic pass installed (River's
// leader runs none), RunMaintenance in this process settles an UNKNOWN_EXTERNAL operation the
// bank never got: resent under the same id after the grace, its dispatcher woken by the pass.
func TestRunMaintenanceReconcilesWithoutTheLeadersJob(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, nil, nil)
	op := payout("maint/m-1", "acct", 300)
	b.unknown(t, op)
	b.sentLongAgo(t, op.BusinessKey)

	quiet := slog.New(slog.DiscardHandler)
	var err error
	b.ob, err = outbox.New(b.pool, &outbox.Config{ID: "maint", Logger: quiet, PollInterval: time.Hour,
		Kinds: map[string]*outbox.KindConfig{"payout": {Sender: bankSender{Client: b.client}, Timeout: time.Second}}})
	require.NoError(t, err)
	b.rec, err = reconcile.New(b.pool, &reconcile.Config{Outbox: b.ob, Logger: quiet, Interval: time.Second,
		Kinds: map[string]*reconcile.KindConfig{"payout": {Checker: bankChecker{Client: b.client}, Grace: time.Hour}}})
	require.NoError(t, err)
	cfg := &river.Config{Logger: quiet, FetchCooldown: 20 * time.Millisecond, FetchPollInterval: 100 * time.Millisecond, TestOnly: true}
	require.NoError(t, b.ob.Install(cfg)) // the dispatcher; no reconciler job at all
	require.NoError(t, b.ob.Register(context.Background()))
	client, err := river.NewClient(riverpgxv5.New(b.pool), cfg)
	require.NoError(t, err)
	require.NoError(t, client.Start(ctx))
	mctx, stop := context.WithCancel(ctx)
	t.Cleanup(func() {
		stop()
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, client.Stop(sctx))
	})
	require.Error(t, b.rec.RunMaintenance(mctx, nil), "a nil client is refused")
	go func() { _ = b.rec.RunMaintenance(mctx, client) }()
	b.waitQuiet(t, 30*time.Second)

	got := b.get(t, op.BusinessKey)
	require.Equal(t, outbox.StateSucceeded, got.State)
	require.Equal(t, 2, got.Attempts, "sent twice: the first never reached the bank")
	require.Equal(t, 1, b.bank.Effects(got.ID.String()))
}
