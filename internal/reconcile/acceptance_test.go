package reconcile_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/internal/outbox"
	"github.com/stepwise-go/stepwise/internal/reconcile"
	"github.com/stepwise-go/stepwise/internal/testkit"
	"github.com/stepwise-go/stepwise/workflowtest"
	"github.com/stepwise-go/stepwise/workflowtest/fakebank"
)

// startClient starts a River client running the bundle's outbox and reconciler, stopped at
// cleanup.
func (b *bundle) startClient(t *testing.T) *river.Client[pgx.Tx] {
	t.Helper()
	cfg := &river.Config{
		Logger:            slog.New(slog.DiscardHandler),
		FetchCooldown:     20 * time.Millisecond,
		FetchPollInterval: 100 * time.Millisecond,
		TestOnly:          true,
	}
	require.NoError(t, b.ob.Install(cfg))
	require.NoError(t, b.ob.Register(context.Background()))
	require.NoError(t, b.rec.Install(cfg))
	client, err := river.NewClient(riverpgxv5.New(b.pool), cfg)
	require.NoError(t, err)
	require.NoError(t, client.Start(context.Background()))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, client.Stop(ctx))
	})
	return client
}

// waitQuiet waits until no operation is PENDING, PROCESSING, RETRYABLE or UNKNOWN_EXTERNAL.
func (b *bundle) waitQuiet(t *testing.T, timeout time.Duration) map[outbox.State]int64 {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		c := b.counts(t)
		if c[outbox.StatePending]+c[outbox.StateProcessing]+c[outbox.StateRetryable]+c[outbox.StateUnknownExternal] == 0 {
			return c
		}
		require.True(t, time.Now().Before(deadline), "not quiet after %s: %v", timeout, c)
		time.Sleep(50 * time.Millisecond)
	}
}

// TestReconcile10000With20PercentDroppedAnswers: 10,000 payouts, a fifth of whose answers the
// bank drops after applying them, delivered and reconciled by River. When all is quiet: no
// operation is UNKNOWN_EXTERNAL, no payment is applied twice, every outcome callback ran once,
// and the totals match the bank's statement.
func TestReconcile10000With20PercentDroppedAnswers(t *testing.T) {
	if testing.Short() {
		t.Skip("10,000 operations: skipped with -short")
	}
	t.Parallel()
	ctx := context.Background()
	b := setup(t, &fakebank.Config{Seed: 7, Faults: fakebank.Mix{DropAfterApply: 0.2}}, func(ok *outbox.KindConfig, rk *reconcile.KindConfig) {
		ok.BatchSize, ok.Concurrency, ok.Timeout = 200, 32, 3*time.Second
		rk.BatchSize, rk.Concurrency, rk.Grace = 200, 32, 10*time.Second
		rk.CheckBackoff = func(int) time.Duration { return 200 * time.Millisecond }
	})
	rc := b.startClient(t)
	from := time.Now().Add(-time.Minute)

	const total = 10000
	start := time.Now()
	wctx := b.ob.Local().Context(ctx, rc)
	for i := 0; i < total; i += 500 {
		ops := make([]outbox.EnqueueParams, 0, 500)
		for j := i; j < i+500; j++ {
			ops = append(ops, payout(key(j), fmt.Sprintf("acct-%d", j), int64(100+j)))
		}
		require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
			_, err := outbox.Enqueue(wctx, tx, ops...)
			return err
		}))
	}
	counts := b.waitQuiet(t, 4*time.Minute)
	elapsed := time.Since(start)

	stats := b.bank.Stats()
	t.Logf("10,000 payouts quiet after %s; by state: %v; bank: %d requests, %d applied, %d dropped answers",
		elapsed.Round(time.Millisecond), counts, stats.Requests, stats.Applied, stats.Faults[fakebank.DropAfterApply])
	require.Equal(t, map[outbox.State]int64{outbox.StateSucceeded: total}, counts, "zero UNKNOWN_EXTERNAL, nothing lost")
	require.Greater(t, stats.Faults[fakebank.DropAfterApply], total/10, "the fault mix did its job")

	ledger := b.bank.Ledger()
	require.Len(t, ledger.Payments, total)
	require.Empty(t, ledger.DuplicateReferences(), "no payment under two keys")
	for i := range total {
		require.Equal(t, 1, ledger.Effects(outbox.OperationID("payout", key(i)).String()), key(i))
	}
	var doubled int
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FROM (SELECT operation_id FROM outcome_log
		WHERE to_state = 'SUCCEEDED' GROUP BY operation_id HAVING count(*) > 1) d`).Scan(&doubled))
	require.Zero(t, doubled, "no outcome callback ran twice")

	totals, err := reconcile.CompareTotals(ctx, b.pool, bankStatement(b.client),
		&reconcile.TotalsParams{Kind: "payout", From: from, To: time.Now().Add(time.Minute)})
	require.NoError(t, err)
	t.Log("\n" + totals.String())
	require.True(t, totals.Match())
	require.Equal(t, total, totals.Here["EUR"].Count)
}

func init() {
	// A delivery worker for drill 2: a River client running an outbox against BANK_URL.
	workflowtest.RegisterRole("outbox-worker", func(ctx context.Context, env map[string]string) error {
		return testkit.RiverChild(ctx, env, func(pool *pgxpool.Pool, cfg *river.Config) error {
			ob, err := outbox.New(pool, &outbox.Config{ID: "child", Kinds: map[string]*outbox.KindConfig{
				"payout": {Sender: bankSender{Client: fakebank.NewClient(env["BANK_URL"], nil)}, Timeout: time.Second, Lease: 2 * time.Second},
			}})
			if err != nil {
				return err
			}
			if err := ob.Install(cfg); err != nil {
				return err
			}
			return ob.Register(context.Background())
		})
	})
}

// TestDrillKillAfterSendThenReconcile is fault drill 2 end to end: a delivery worker is
// kill -9'ed after the bank applied a payout and before the outcome was recorded. After the
// lease the operation is UNKNOWN_EXTERNAL, the reconciler finds the payment by operation_id
// and settles it SUCCEEDED, and the bank holds one effect: it was never resent.
func TestDrillKillAfterSendThenReconcile(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := testkit.DBURL(t)
	pool, err := pgxpool.New(ctx, dbURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	registerPayout(t, pool)
	_, err = pool.Exec(ctx, `CREATE TABLE outcome_log (operation_id uuid NOT NULL, from_state text NOT NULL, to_state text NOT NULL, actor text NOT NULL)`)
	require.NoError(t, err)
	bank := fakebank.New(nil)
	require.NoError(t, bank.Start())
	t.Cleanup(func() { _ = bank.Close() })
	client := fakebank.NewClient(bank.URL(), &http.Client{Timeout: 5 * time.Second})

	op := payout("settle/drill-2/m-1", "acct-1", 4200)
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

	// The survivors: an outbox and a reconciler in this process, through River.
	b := &bundle{pool: pool, bank: bank, client: client}
	discard := slog.New(slog.DiscardHandler)
	b.ob, err = outbox.New(pool, &outbox.Config{ID: "survivor", Logger: discard, Kinds: map[string]*outbox.KindConfig{"payout": {
		Sender: bankSender{Client: client}, Timeout: time.Second, Lease: 2 * time.Second,
		OnOutcome: func(ctx context.Context, tx pgx.Tx, op *outbox.Operation, oc outbox.Outcome) error {
			_, err := tx.Exec(ctx, `INSERT INTO outcome_log VALUES ($1, $2, $3, $4)`, op.ID, oc.From, oc.To, oc.Actor)
			return err
		},
	}}})
	require.NoError(t, err)
	b.rec, err = reconcile.New(pool, &reconcile.Config{Outbox: b.ob, Logger: discard, Interval: time.Second,
		Kinds: map[string]*reconcile.KindConfig{"payout": {Checker: bankChecker{Client: client}, Grace: 5 * time.Second}}})
	require.NoError(t, err)
	b.startClient(t)
	b.waitQuiet(t, 60*time.Second)

	got := b.get(t, op.BusinessKey)
	require.Equal(t, outbox.StateSucceeded, got.State)
	require.Equal(t, 1, got.Attempts, "never resent")
	require.Equal(t, 1, bank.Stats().Requests)
	require.Equal(t, 1, bank.Effects(id.String()))
	require.Equal(t, []string{"PROCESSING>UNKNOWN_EXTERNAL", "UNKNOWN_EXTERNAL>SUCCEEDED"}, b.callbacks(t, id))
}

// TestRiverResendAfterGraceWakesTheDispatcher: through River, a not-found after the grace
// period goes back to RETRYABLE and the reconciler's transaction wakes the dispatcher (the
// outbox's poll is off here), which resends under the same id.
func TestRiverResendAfterGraceWakesTheDispatcher(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, nil)
	op := payout("settle/m-1", "acct", 300)
	b.unknown(t, op)
	b.sentLongAgo(t, op.BusinessKey)

	quiet := slog.New(slog.DiscardHandler)
	var err error
	b.ob, err = outbox.New(b.pool, &outbox.Config{ID: "river", Logger: quiet, PollInterval: time.Hour,
		Kinds: map[string]*outbox.KindConfig{"payout": {Sender: bankSender{Client: b.client}, Timeout: time.Second}}})
	require.NoError(t, err)
	b.rec, err = reconcile.New(b.pool, &reconcile.Config{Outbox: b.ob, Logger: quiet, Interval: time.Second,
		Kinds: map[string]*reconcile.KindConfig{"payout": {Checker: bankChecker{Client: b.client}, Grace: time.Hour}}})
	require.NoError(t, err)
	b.startClient(t)
	b.waitQuiet(t, 30*time.Second)

	got := b.get(t, op.BusinessKey)
	require.Equal(t, outbox.StateSucceeded, got.State)
	require.Equal(t, 2, got.Attempts)
	require.Equal(t, 1, b.bank.Effects(got.ID.String()))
}
