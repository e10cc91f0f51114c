package settlement_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/cmd/sample-settlement/bankfake"
	"github.com/stepwise-go/stepwise/cmd/sample-settlement/settlement"
	"github.com/stepwise-go/stepwise/schedule"
	"github.com/stepwise-go/stepwise/workflow"
	"github.com/stepwise-go/stepwise/workflowtest/fakebank"
)

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// startBank starts an in-process fake bank and the sample's adapter to it, without keep-alive. (A
// dropped answer is seen as one either way: the fake bank's client sends through
// outbox/httpsend, so net/http never resends a payment on a reused connection that died.)
func startBank(t *testing.T, cfg *fakebank.Config) (*fakebank.Bank, *bankfake.Bank) {
	t.Helper()
	bank := fakebank.New(cfg)
	require.NoError(t, bank.Start())
	t.Cleanup(func() { _ = bank.Close() })
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.DisableKeepAlives = true
	t.Cleanup(tr.CloseIdleConnections)
	return bank, bankfake.New(fakebank.NewClient(bank.URL(), &http.Client{Timeout: 2 * time.Second, Transport: tr}))
}

func startService(t *testing.T, pool *pgxpool.Pool, cfg *settlement.ServiceConfig) *settlement.Service {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = quietLogger()
	}
	if cfg.FetchPollInterval == 0 {
		cfg.FetchPollInterval = 100 * time.Millisecond
	}
	svc, err := settlement.NewService(pool, cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	require.NoError(t, svc.Start(ctx))
	t.Cleanup(func() {
		stopCtx, stop := context.WithTimeout(context.Background(), 10*time.Second)
		defer stop()
		require.NoError(t, svc.Stop(stopCtx, 5*time.Second))
		cancel()
	})
	return svc
}

// waitFor polls cond (the database is the evidence) until it holds or timeout passes.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, state := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after %s; last: %s", what, timeout, state)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestServiceSettlesAndPaysADate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := seededDB(t)
	bank, client := startBank(t, &fakebank.Config{Seed: 3})
	svc := startService(t, pool, &settlement.ServiceConfig{Bank: client, Plan: settlement.Plan{Shards: 3}, BatchSize: 100})

	runs, created, err := svc.StartDate(ctx, testDate)
	require.NoError(t, err)
	require.True(t, created)
	require.Len(t, runs, 3)
	require.Equal(t, "settle/2026-03-02T01:00:00Z/0", runs[0].Key)

	// Starting the date again is a no-op: same runs.
	again, created, err := svc.StartDate(ctx, testDate)
	require.NoError(t, err)
	require.False(t, created)
	require.Equal(t, runs[2].Key, again[2].Key)

	waitFor(t, 30*time.Second, "every run succeeded and every payout terminal", func() (bool, string) {
		var pending, open int
		require.NoError(t, pool.QueryRow(ctx, `SELECT
			(SELECT count(*) FROM stepwise_run WHERE status <> 'succeeded'),
			(SELECT count(*) FROM stepwise_operation WHERE state NOT IN ('SUCCEEDED', 'FAILED_PERMANENT'))`).Scan(&pending, &open))
		return pending == 0 && open == 0, ""
	})
	for _, r := range runs {
		run, err := workflow.GetRun(ctx, pool, r.Key)
		require.NoError(t, err)
		require.Equal(t, workflow.StatusSucceeded, run.Status)
	}
	var paid, failed, other int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE status = 'PAID'),
		count(*) FILTER (WHERE status = 'PAYOUT_FAILED'), count(*) FILTER (WHERE status NOT IN ('PAID', 'PAYOUT_FAILED'))
		FROM settlement`).Scan(&paid, &failed, &other))
	require.Zero(t, other)
	require.Positive(t, failed, "the seed closes 1%% of accounts; their payouts are declined")
	require.Len(t, bank.Applied(), paid+failed)
	require.Empty(t, bank.DuplicateReferences())
	var ledgerSum int64
	var reversals int
	require.NoError(t, pool.QueryRow(ctx, `SELECT coalesce(sum(amount), 0), count(*) FILTER (WHERE entry = 'reverse') FROM ledger_entry`).Scan(&ledgerSum, &reversals))
	require.Zero(t, ledgerSum)
	require.Equal(t, 2*failed, reversals)

	res, err := settlement.CheckInvariants(ctx, pool, client, svc.Plan, testDate)
	require.NoError(t, err)
	require.NoError(t, res.Err(), "%+v", res.Checks)
	require.Len(t, res.Checks, 9) // invariants 1 (x2), 2, 3 (effects, send discipline), 4, 5, 6 and the whole-database summary

	rep, err := settlement.BuildReport(ctx, pool, client, svc.Plan, testDate)
	require.NoError(t, err)
	require.Equal(t, schedule.BatchCompleted, rep.Batch)
	require.True(t, rep.TotalsMatch(), "%+v", rep)
	require.Zero(t, rep.DuplicatePayouts)
	require.Equal(t, paid, rep.Settlements[settlement.StatusPaid])
}

func fmtMap(m map[string]int) string {
	b, _ := json.Marshal(m)
	return string(b)
}
