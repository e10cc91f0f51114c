package settlement_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise"
	"github.com/stepwise-go/stepwise/cmd/sample-settlement/bankfake"
	"github.com/stepwise-go/stepwise/cmd/sample-settlement/settlement"
	"github.com/stepwise-go/stepwise/outbox"
	"github.com/stepwise-go/stepwise/stepwisetype"
	"github.com/stepwise-go/stepwise/workflow"
	"github.com/stepwise-go/stepwise/workflowtest/fakebank"
)

func readDay(t *testing.T, pool *pgxpool.Pool) *settlement.Day {
	t.Helper()
	d, err := settlement.ReadDay(context.Background(), pool, testDate)
	require.NoError(t, err)
	return d
}

func fmtDay(d *settlement.Day) string {
	if d == nil {
		return "no settlement_day row"
	}
	return fmt.Sprintf("shards at rest %d/%d, overdue %v, closed %v, reconciled %v (statement %q, differences %d)",
		d.AtRest, d.Shards, d.OverdueAt != nil, d.ClosedAt != nil, d.ReconciledAt != nil, d.StatementID, d.Differences)
}

// A date closes only once every payout is proven, and its reconciliation waits for the
// bank's statement. While the bank is down every payout is UNKNOWN_EXTERNAL: the settle runs
// wait (holding no worker), their waits time out and mark the date overdue, and the date is
// not closed. Once the bank is back, one payout a person must decide (MANUAL) still keeps the
// date open, though its other shard has closed its part. Resolving it closes the date and
// starts the reconciliation run, which takes the statement signal sent long before it existed
// (twice, under one id: one signal), reconciles each currency in a child run, and finds the
// payout resolved SUCCEEDED by hand that the bank never paid, in its currency only.
func TestDateClosesOnlyWhenEveryPayoutIsProven(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := seededDB(t)
	bank := fakebank.New(&fakebank.Config{Seed: 11})
	sw := &outage{bank: bank.Handler()}
	sw.down.Store(true)
	srv := httptest.NewServer(sw)
	t.Cleanup(srv.Close)
	client := bankfake.New(fakebank.NewClient(srv.URL, &http.Client{Timeout: time.Second}))
	cfg := fastReconcile(&settlement.ServiceConfig{Bank: client, Plan: settlement.Plan{Shards: 2}, BatchSize: 200,
		PayoutsAtRestTimeout: 2 * time.Second})
	svc := startService(t, pool, cfg)
	expected, err := settlement.ExpectedSettlements(ctx, pool, testDate)
	require.NoError(t, err)

	// The statement arrives before anything is settled: kept for the reconciliation run
	// that does not exist yet. A retried request (same id) is the same signal.
	for range 2 {
		require.NoError(t, settlement.StatementArrived(ctx, pool, testDate, "stmt-2026-03-01-EUR-0001"))
	}
	_, _, err = svc.StartDate(ctx, testDate)
	require.NoError(t, err)

	// Bank down: both runs settled and wait for their payouts, and a timeout has passed.
	waitProgress(t, pool, "both runs waiting for their UNKNOWN_EXTERNAL payouts, the date overdue", func(ctx context.Context) (bool, string, error) {
		p, err := settlement.ReadProgress(ctx, pool, svc.Plan, testDate)
		if err != nil {
			return false, "", err
		}
		d, err := settlement.ReadDay(ctx, pool, testDate)
		if err != nil {
			return false, "", err
		}
		return p.Waiting == 2 && p.Operations["UNKNOWN_EXTERNAL"] == expected && d != nil && d.OverdueAt != nil,
			fmtProgress(p) + "; " + fmtDay(d), nil
	})
	d := readDay(t, pool)
	require.Nil(t, d.ClosedAt, "a date with UNKNOWN_EXTERNAL payouts is not closed")
	require.Zero(t, d.AtRest)
	for _, key := range mustRunKeys(t, svc.Plan) {
		run, err := svc.Client.RunGet(ctx, key)
		require.NoError(t, err)
		require.NotNil(t, run.Wait, "run %s waits", key)
		require.Equal(t, workflow.WaitOperations, run.Wait.Kind)
	}

	// One payout goes to a person (MANUAL, as the reconciler does when it gives up) before
	// the bank comes back; every other one is proven once it is back.
	var manual uuid.UUID
	var manualRun string
	require.NoError(t, pool.QueryRow(ctx, `UPDATE stepwise_operation SET state = 'MANUAL', manual_reason = 'test: the bank cannot say'
		WHERE operation_id = (SELECT operation_id FROM stepwise_operation WHERE state = 'UNKNOWN_EXTERNAL' ORDER BY business_key LIMIT 1)
		RETURNING operation_id, run_key`).Scan(&manual, &manualRun))
	sw.down.Store(false)
	waitProgress(t, pool, "every payout proven but the MANUAL one, its shard closed", func(ctx context.Context) (bool, string, error) {
		p, err := settlement.ReadProgress(ctx, pool, svc.Plan, testDate)
		if err != nil {
			return false, "", err
		}
		d, err := settlement.ReadDay(ctx, pool, testDate)
		if err != nil {
			return false, "", err
		}
		return p.Operations["MANUAL"] == 1 && p.Operations["SUCCEEDED"]+p.Operations["FAILED_PERMANENT"] == expected-1 &&
			p.Waiting == 1 && d.AtRest == 1 && p.AtRest(2), fmtProgress(p) + "; " + fmtDay(d), nil
	})
	// A timeout of the MANUAL shard's wait passes: it waits on, the date stays open.
	time.Sleep(3 * time.Second)
	d = readDay(t, pool)
	require.Nil(t, d.ClosedAt, "a date with a MANUAL payout is not closed: %s", fmtDay(d))
	run, err := svc.Client.RunGet(ctx, manualRun)
	require.NoError(t, err)
	require.NotNil(t, run.Wait, "the MANUAL payout's run waits")
	require.Contains(t, run.Wait.Missing, "1 MANUAL")
	_, err = svc.Client.RunGet(ctx, settlement.ReconcileRunKey(testDate))
	require.ErrorIs(t, err, stepwisetype.ErrNotFound, "no reconciliation before the date closes")
	res, err := settlement.CheckInvariants(ctx, pool, nil, svc.Plan, testDate)
	require.NoError(t, err)
	require.True(t, checkNamed(t, res, settlement.ClosedDateAtRest).OK)

	// A person decides on what she reads: paid. The wait wakes, the date closes and is reconciled.
	read, err := settlement.Resolvable(ctx, svc.Client, manual, outbox.StateManual)
	require.NoError(t, err)
	_, err = settlement.Resolve(ctx, svc.Client, settlement.Resolution{OperationID: manual, From: outbox.StateManual, SeenVersion: read.Version,
		To: outbox.StateSucceeded, Actor: "alice", Reason: "the bank's portal shows it paid"})
	require.NoError(t, err)
	waitProgress(t, pool, "the date closed and reconciled", func(ctx context.Context) (bool, string, error) {
		d, err := settlement.ReadDay(ctx, pool, testDate)
		if err != nil {
			return false, "", err
		}
		return d.ClosedAt != nil && d.ReconciledAt != nil, fmtDay(d), nil
	})
	d = readDay(t, pool)
	require.Equal(t, 2, d.AtRest)
	require.Equal(t, "stmt-2026-03-01-EUR-0001", d.StatementID)
	// The person was wrong: the payment never reached the bank. Reconciliation says so.
	require.False(t, d.Match)
	require.Equal(t, 1, d.Differences)
	var signals, consumed int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*), count(consumed_at) FROM stepwise_signal WHERE run_key = $1`,
		settlement.ReconcileRunKey(testDate)).Scan(&signals, &consumed))
	require.Equal(t, 1, signals, "a statement sent twice under one id is one signal")
	require.Equal(t, 1, consumed)
	for _, key := range append(mustRunKeys(t, svc.Plan), settlement.ReconcileRunKey(testDate)) {
		run, err := svc.Client.RunGet(ctx, key)
		require.NoError(t, err)
		require.Equal(t, workflow.RunStatusSucceeded, run.Status, key)
	}
	// One reconciliation run per currency, children of the date's (WaitForChildren): the
	// difference is in the MANUAL payout's currency only.
	var children []string
	require.NoError(t, pool.QueryRow(ctx, `SELECT array_agg(key || ' ' || status ORDER BY key) FROM stepwise_run WHERE parent_key = $1`,
		settlement.ReconcileRunKey(testDate)).Scan(&children))
	var curs []string
	require.NoError(t, pool.QueryRow(ctx, `SELECT array_agg(DISTINCT currency ORDER BY currency) FROM settlement WHERE settle_date = $1`, testDate).Scan(&curs))
	require.Len(t, children, len(curs))
	for i, cur := range curs {
		require.Equal(t, settlement.ReconcileRunKey(testDate)+"/"+cur+" succeeded", children[i])
	}
	var manualCur string
	require.NoError(t, pool.QueryRow(ctx, `SELECT currency FROM stepwise_operation WHERE operation_id = $1`, manual).Scan(&manualCur))
	var differing []string
	require.NoError(t, pool.QueryRow(ctx, `SELECT array_agg(currency) FROM settlement_day_currency WHERE settle_date = $1 AND NOT statement_match`,
		testDate).Scan(&differing))
	require.Equal(t, []string{manualCur}, differing)
	res, err = settlement.CheckInvariants(ctx, pool, nil, svc.Plan, testDate)
	require.NoError(t, err)
	c := checkNamed(t, res, settlement.ClosedDateAtRest)
	require.True(t, c.OK, c.Evidence)
	require.Contains(t, c.Evidence, "0 payouts neither")
}

func mustRunKeys(t *testing.T, plan settlement.Plan) []string {
	t.Helper()
	keys, err := plan.RunKeys(testDate)
	require.NoError(t, err)
	return keys
}

func checkNamed(t *testing.T, res *settlement.Result, name string) settlement.Check {
	t.Helper()
	for _, c := range res.Checks {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no check %q in %+v", name, res.Checks)
	return settlement.Check{}
}

// A currency's reconciliation that cannot finish fails the date's, naming it, and resuming
// the date's run resumes its currency runs with it. The bank's statement cannot be read, so
// every currency run retries; an operator cancels them (as River would fail them once their
// attempts ran out, only sooner). The date's run wakes to find them cancelled and fails with
// what to do; once the statement can be read again, one Resume of the date's run resumes the
// currency runs too (they are its children), and the date is reconciled.
func TestFailedCurrencyRunIsResumedWithItsDate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := seededDB(t)
	bank := fakebank.New(&fakebank.Config{Seed: 12})
	var statementDown atomic.Bool
	statementDown.Store(true)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if statementDown.Load() && r.URL.Path == "/statement" {
			http.Error(w, "statement service unavailable", http.StatusServiceUnavailable)
			return
		}
		bank.Handler().ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	client := bankfake.New(fakebank.NewClient(srv.URL, &http.Client{Timeout: time.Second}))
	svc := startService(t, pool, fastReconcile(&settlement.ServiceConfig{Bank: client, Plan: settlement.Plan{Shards: 2}, BatchSize: 200,
		PayoutsAtRestTimeout: settlement.PayoutsAtRestTimeoutDefault}))
	require.NoError(t, settlement.StatementArrived(ctx, pool, testDate, ""))
	_, _, err := svc.StartDate(ctx, testDate)
	require.NoError(t, err)

	parent := settlement.ReconcileRunKey(testDate)
	children := func(ctx context.Context) (map[string]*workflow.Run, error) {
		rows, err := pool.Query(ctx, `SELECT key FROM stepwise_run WHERE parent_key = $1`, parent)
		if err != nil {
			return nil, err
		}
		keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return nil, err
		}
		out := map[string]*workflow.Run{}
		for _, k := range keys {
			if out[k], err = svc.Client.RunGet(ctx, k); err != nil {
				return nil, err
			}
		}
		return out, nil
	}
	waitProgress(t, pool, "the date's run waiting for its currency runs", func(ctx context.Context) (bool, string, error) {
		run, err := svc.Client.RunGet(ctx, parent)
		if errors.Is(err, stepwisetype.ErrNotFound) {
			p, err := settlement.ReadProgress(ctx, pool, svc.Plan, testDate)
			if err != nil {
				return false, "", err
			}
			return false, "no reconciliation run yet: " + fmtProgress(p) + "; " + fmtDay(readDay(t, pool)), nil
		}
		if err != nil {
			return false, "", err
		}
		return run.Wait != nil && run.Wait.Kind == workflow.WaitChildren, fmt.Sprintf("%s, wait %+v", run.Status, run.Wait), nil
	})
	var curs []string
	require.NoError(t, pool.QueryRow(ctx, `SELECT array_agg(DISTINCT currency ORDER BY currency) FROM settlement WHERE settle_date = $1`, testDate).Scan(&curs))
	require.NotEmpty(t, curs)
	waitProgress(t, pool, "every currency run failing to read the statement", func(ctx context.Context) (bool, string, error) {
		cs, err := children(ctx)
		if err != nil {
			return false, "", err
		}
		failing := 0
		for _, r := range cs {
			if r.Failures > 0 {
				failing++
			}
		}
		return len(cs) == len(curs) && failing == len(cs), fmt.Sprintf("%d of %d currency runs, %d failing", len(cs), len(curs), failing), nil
	})
	cs, err := children(ctx)
	require.NoError(t, err)
	for key := range cs {
		_, err := svc.Client.RunCancel(ctx, key, &stepwise.RunCancelOpts{Actor: "alice", Reason: "the bank's statement service is down (INC-7)"})
		require.NoError(t, err)
	}
	waitProgress(t, pool, "the date's reconciliation failed", func(ctx context.Context) (bool, string, error) {
		run, err := svc.Client.RunGet(ctx, parent)
		if err != nil {
			return false, "", err
		}
		return run.Status == workflow.RunStatusFailed, string(run.Status), nil
	})
	run, err := svc.Client.RunGet(ctx, parent)
	require.NoError(t, err)
	t.Logf("the date's run: %s: %s", run.Status, deref(run.LastError))
	require.Contains(t, deref(run.LastError), parent+"/"+curs[0]+" cancelled")
	require.Contains(t, deref(run.LastError), "resume "+parent)
	d := readDay(t, pool)
	require.Nil(t, d.ReconciledAt)

	statementDown.Store(false)
	_, err = svc.Client.RunResume(ctx, parent, &stepwise.RunResumeOpts{Actor: "alice", Reason: "statement service back (INC-7)", ExpectedVersion: run.Version})
	require.NoError(t, err)
	waitProgress(t, pool, "the date reconciled after the resume", func(ctx context.Context) (bool, string, error) {
		d, err := settlement.ReadDay(ctx, pool, testDate)
		if err != nil {
			return false, "", err
		}
		return d.ReconciledAt != nil, fmtDay(d), nil
	})
	cs, err = children(ctx)
	require.NoError(t, err)
	require.Len(t, cs, len(curs))
	for key, r := range cs {
		require.Equal(t, workflow.RunStatusSucceeded, r.Status, key)
	}
	run, err = svc.Client.RunGet(ctx, parent)
	require.NoError(t, err)
	require.Equal(t, workflow.RunStatusSucceeded, run.Status)
	d = readDay(t, pool)
	require.True(t, d.Match, fmtDay(d))
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
