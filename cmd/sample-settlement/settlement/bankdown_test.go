package settlement_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/cmd/sample-settlement/bankfake"
	"github.com/stepwise-go/stepwise/cmd/sample-settlement/settlement"
	"github.com/stepwise-go/stepwise/outbox"
	"github.com/stepwise-go/stepwise/schedule"
	"github.com/stepwise-go/stepwise/workflow"
	"github.com/stepwise-go/stepwise/workflowtest/fakebank"
)

// outage puts the bank behind a switch: while down, every request — payments and lookups —
// gets a 503 from "the load balancer", which tells the caller nothing about whether a payment
// went through.
type outage struct {
	down atomic.Bool
	bank http.Handler
}

func (o *outage) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if o.down.Load() {
		http.Error(w, "upstream unavailable", http.StatusServiceUnavailable)
		return
	}
	o.bank.ServeHTTP(w, r)
}

// fastReconcile makes the reconciler look often and believe "not found" soon, so a test
// of an outage takes seconds, not the production minutes.
func fastReconcile(cfg *settlement.ServiceConfig) *settlement.ServiceConfig {
	cfg.PayoutTimeout = time.Second
	cfg.ReconcileInterval = time.Second
	cfg.ReconcileGrace = 2 * time.Second
	cfg.ReconcileBackoff = func(int) time.Duration { return 500 * time.Millisecond }
	return cfg
}

// Bad input: a bank that is down for the whole run. Every payout ends UNKNOWN_EXTERNAL (a 503
// is ambiguous), its settlement PAYOUT_SENT; nothing is lost and nothing is paid twice. Once
// the bank is back, the reconciler's lookups find nothing under the ids, wait out the grace
// period, send again under the same ids, and every payout settles.
func TestBankDownForTheWholeRun(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := seededDB(t)
	bank := fakebank.New(&fakebank.Config{Seed: 9})
	sw := &outage{bank: bank.Handler()}
	sw.down.Store(true)
	srv := httptest.NewServer(sw)
	t.Cleanup(srv.Close)
	client := bankfake.New(fakebank.NewClient(srv.URL, &http.Client{Timeout: time.Second}))
	svc := startService(t, pool, fastReconcile(&settlement.ServiceConfig{Bank: client, Plan: settlement.Plan{Shards: 2}, BatchSize: 200}))

	expected, err := settlement.ExpectedSettlements(ctx, pool, testDate)
	require.NoError(t, err)
	_, _, err = svc.StartDate(ctx, testDate)
	require.NoError(t, err)

	waitProgress(t, pool, "every payout UNKNOWN_EXTERNAL while the bank is down", func(ctx context.Context) (bool, string, error) {
		p, err := settlement.ReadProgress(ctx, pool, svc.Plan, testDate)
		if err != nil {
			return false, "", err
		}
		return p.Runs[string(workflow.RunStatusSucceeded)] == 2 && p.Operations["UNKNOWN_EXTERNAL"] == expected, fmtProgress(p), nil
	})
	var sent, other int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE status = 'PAYOUT_SENT'), count(*) FILTER (WHERE status <> 'PAYOUT_SENT')
		FROM settlement WHERE settle_date = $1`, testDate).Scan(&sent, &other))
	require.Equal(t, expected, sent, "every settlement is there, its payout sent and not proven")
	require.Zero(t, other)
	require.Empty(t, bank.Applied())
	rep, err := settlement.BuildReport(ctx, pool, nil, svc.Plan, testDate)
	require.NoError(t, err)
	require.Equal(t, schedule.BatchReconciling, rep.Batch, "a batch with unproven payouts is not complete")
	require.Positive(t, rep.OldestUnknown)

	sw.down.Store(false)
	p := waitAtRest(t, pool, svc.Plan, "every payout settled once the bank is back")
	require.Zero(t, p.Operations[string(outbox.StateManual)])
	require.Equal(t, expected, p.Operations["SUCCEEDED"]+p.Operations["FAILED_PERMANENT"])
	res, err := settlement.CheckInvariants(ctx, pool, auditor(srv.URL), svc.Plan, testDate)
	require.NoError(t, err)
	require.NoError(t, res.Err(), "%+v", res.Checks)
	require.Len(t, bank.Applied(), expected)
	require.Empty(t, bank.DuplicateReferences())
}

// A bank whose port is closed for the whole run: the dial is refused, which proves the
// payment never left, so payouts go RETRYABLE (not UNKNOWN_EXTERNAL) and are resent under
// the same ids with backoff; once the bank listens again they settle.
func TestBankRefusesConnections(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := seededDB(t)
	bank, client := startBank(t, &fakebank.Config{Seed: 10})
	require.NoError(t, bank.SetDown(true))
	svc := startService(t, pool, fastReconcile(&settlement.ServiceConfig{Bank: client, Plan: settlement.Plan{Shards: 2}, BatchSize: 200}))
	expected, err := settlement.ExpectedSettlements(ctx, pool, testDate)
	require.NoError(t, err)
	_, _, err = svc.StartDate(ctx, testDate)
	require.NoError(t, err)

	waitProgress(t, pool, "payouts refused and waiting to be resent", func(ctx context.Context) (bool, string, error) {
		p, err := settlement.ReadProgress(ctx, pool, svc.Plan, testDate)
		if err != nil {
			return false, "", err
		}
		return p.Runs[string(workflow.RunStatusSucceeded)] == 2 && p.Operations["RETRYABLE"] == expected, fmtProgress(p), nil
	})
	var unknown int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM stepwise_event WHERE kind = 'op.transition' AND to_state = 'UNKNOWN_EXTERNAL'`).Scan(&unknown))
	require.Zero(t, unknown, "a refused dial proves the payment never left")

	require.NoError(t, bank.SetDown(false))
	waitAtRest(t, pool, svc.Plan, "every payout settled once the bank listens again")
	res, err := settlement.CheckInvariants(ctx, pool, auditor(bank.URL()), svc.Plan, testDate)
	require.NoError(t, err)
	require.NoError(t, res.Err(), "%+v", res.Checks)
	require.Len(t, bank.Applied(), expected)
}

func fmtProgress(p *settlement.Progress) string {
	if p == nil {
		return "no progress read"
	}
	return "runs " + fmtMap(p.Runs) + ", payouts " + fmtMap(p.Operations)
}
