package settlement_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/cmd/sample-settlement/bankfake"
	"github.com/stepwise-go/stepwise/cmd/sample-settlement/settlement"
	"github.com/stepwise-go/stepwise/internal/testkit"
	"github.com/stepwise-go/stepwise/internal/workflow"
	"github.com/stepwise-go/stepwise/outbox"
	"github.com/stepwise-go/stepwise/schedule"
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

// auditor is a client for the checks after a run (the bank's request log, its statement):
// not the service's payment client. Guards against: a check failing for time. The payment
// client's timeout is seconds on purpose (a slow payment is UNKNOWN_EXTERNAL), but reading
// the whole request log of 1,500 payouts at load 50 took longer than that, and the send
// discipline check reported "cannot read the bank's request log" on a correct run.
func auditor(bankURL string) *bankfake.Bank {
	return bankfake.New(fakebank.NewClient(bankURL, &http.Client{Timeout: 2 * time.Minute}))
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

// waitProgress polls cond (the database is the evidence) until it holds, for as long as the
// database shows the service working: steps committed, payouts at rest, events written (every
// payout transition writes one). It fails after testkit.StallTimeoutDefault with nothing
// moving, naming the last state cond saw.
//
// Guards against: a test that fails for time rather than for a bug. A fixed 30 s deadline
// expired at load 30-50 on two cores with half the payouts moved and more moving; only a
// service that stops moving (a lost wake-up, a stuck dispatcher) must fail.
func waitProgress(t *testing.T, pool *pgxpool.Pool, what string, cond func(ctx context.Context) (bool, string, error)) {
	t.Helper()
	waitProgressFor(t, pool, what, 0, cond)
}

// waitProgressFor is waitProgress with a quiet period other than the default (zero is the
// default); a test that shows the wait still catches a stall uses a short one.
func waitProgressFor(t *testing.T, pool *pgxpool.Pool, what string, stall time.Duration, cond func(ctx context.Context) (bool, string, error)) {
	t.Helper()
	var last string
	defer func() {
		if t.Failed() {
			t.Logf("%s: last: %s", what, last)
		}
	}()
	testkit.WaitProgress(t, what, stall, 0, func(ctx context.Context) (bool, int64, error) {
		done, state, err := cond(ctx)
		if err != nil {
			return false, 0, err
		}
		last = state
		if done {
			return true, 0, nil
		}
		var progress int64
		err = pool.QueryRow(ctx, `SELECT
			(SELECT coalesce(sum(steps), 0) FROM stepwise_checkpoint) +
			(SELECT count(*) FROM stepwise_operation WHERE state NOT IN ('PENDING', 'PROCESSING')) +
			(SELECT count(*) FROM stepwise_event)`).Scan(&progress)
		return false, progress, err
	})
}

// waitAtRest waits until date is at rest (every run finished, every payout proven or
// MANUAL), for as long as the service makes progress.
func waitAtRest(t *testing.T, pool *pgxpool.Pool, plan settlement.Plan, what string) *settlement.Progress {
	t.Helper()
	var p *settlement.Progress
	waitProgress(t, pool, what, func(ctx context.Context) (bool, string, error) {
		var err error
		p, err = settlement.ReadProgress(ctx, pool, plan, testDate)
		if err != nil {
			return false, "", err
		}
		return p.AtRest(plan.Shards), fmtProgress(p), nil
	})
	return p
}

func TestServiceSettlesAndPaysADate(t *testing.T) {
	t.Parallel()
	settleAndPayADate(t, false)
}

// A database from before dated ids (payout_scheme at a later date, as ApplySchema records it
// on a database a build from before used) settles an earlier date under the old scheme, and
// the report and the invariants, which read both key shapes, see every payout of it.
func TestServiceSettlesADateOfTheSchemeBefore(t *testing.T) {
	t.Parallel()
	settleAndPayADate(t, true)
}

func settleAndPayADate(t *testing.T, legacy bool) {
	ctx := context.Background()
	pool := seededDB(t)
	if legacy {
		setPayoutScheme(t, pool, testDate.AddDate(0, 0, 1))
	}
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

	waitProgress(t, pool, "every run succeeded and every payout terminal", func(ctx context.Context) (bool, string, error) {
		var pending, open int
		err := pool.QueryRow(ctx, `SELECT
			(SELECT count(*) FROM stepwise_run WHERE status <> 'succeeded'),
			(SELECT count(*) FROM stepwise_operation WHERE state NOT IN ('SUCCEEDED', 'FAILED_PERMANENT'))`).Scan(&pending, &open)
		return err == nil && pending == 0 && open == 0, fmt.Sprintf("%d runs not succeeded, %d payouts not terminal", pending, open), err
	})
	for _, r := range runs {
		run, err := workflow.GetRun(ctx, pool, r.Key)
		require.NoError(t, err)
		require.Equal(t, workflow.RunStatusSucceeded, run.Status)
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

	res, err := settlement.CheckInvariants(ctx, pool, auditor(bank.URL()), svc.Plan, testDate)
	require.NoError(t, err)
	require.NoError(t, res.Err(), "%+v", res.Checks)
	require.Len(t, res.Checks, 10) // invariants 1 (x2), 2, 3 (effects, send discipline), 4 (x2: at rest, a closed date proven), 5, 6 and the whole-database summary

	rep, err := settlement.BuildReport(ctx, pool, auditor(bank.URL()), svc.Plan, testDate)
	require.NoError(t, err)
	require.Equal(t, schedule.BatchCompleted, rep.Batch)
	require.True(t, rep.TotalsMatch(), "%+v", rep)
	require.Zero(t, rep.DuplicatePayouts)
	require.Equal(t, paid, rep.Settlements[settlement.StatusPaid])

	// Every payout of the date under the date's one scheme: date-first keys with dated ids, or
	// the keys and ids of the builds before.
	type payout struct {
		ID  uuid.UUID
		Key string
	}
	rows, err := pool.Query(ctx, `SELECT operation_id, business_key FROM stepwise_operation WHERE kind = $1`, settlement.PayoutKind)
	require.NoError(t, err)
	payouts, err := pgx.CollectRows(rows, pgx.RowToStructByPos[payout]) // released before any assert can fail
	require.NoError(t, err)
	for _, p := range payouts {
		id, key := p.ID, p.Key
		if legacy {
			require.Regexp(t, `^M\d{6}/2026-03-01/`, key)
			require.Equal(t, outbox.OperationID(settlement.PayoutKind, key), id, key)
		} else {
			require.Regexp(t, `^2026-03-01/M\d{6}/`, key)
			require.Equal(t, settlement.PayoutID(testDate, key), id, key)
			require.Equal(t, uuid.Version(8), id.Version(), key)
		}
	}
	require.Len(t, payouts, paid+failed)
}

func fmtMap(m map[string]int) string {
	b, _ := json.Marshal(m)
	return string(b)
}
