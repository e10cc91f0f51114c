package bench

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stepwise-go/stepwise/cmd/sample-settlement/bankfake"
	"github.com/stepwise-go/stepwise/cmd/sample-settlement/settlement"
	"github.com/stepwise-go/stepwise/internal/outbox"
	"github.com/stepwise-go/stepwise/internal/reconcile"
	"github.com/stepwise-go/stepwise/internal/workflow"
	"github.com/stepwise-go/stepwise/workflowtest/fakebank"
)

// startBank starts a zero-latency fake bank on a free loopback port, and a keep-alive client
// for it sized for the outbox's concurrency, as the sample's own bank client is.
func startBank() (*fakebank.Bank, *fakebank.Client, func(), error) {
	bank := fakebank.New(&fakebank.Config{})
	if err := bank.Start(); err != nil {
		return nil, nil, nil, fmt.Errorf("starting the fake bank: %w", err)
	}
	client, closeIdle := bankClient(bank.URL())
	return bank, client, func() { closeIdle(); _ = bank.Close() }, nil
}

func bankClient(url string) (*fakebank.Client, func()) {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 256
	return fakebank.NewClient(url, &http.Client{Timeout: 5 * time.Second, Transport: tr}), tr.CloseIdleConnections
}

// sectionDB clones a database for a section and opens a pool on it.
func (r *runner) sectionDB(ctx context.Context, section string) (*pgxpool.Pool, string, error) {
	dbURL, err := r.clone(ctx, section)
	if err != nil {
		return nil, "", err
	}
	pool, err := newPool(ctx, dbURL, r.opts.poolConns)
	return pool, dbURL, err
}

// pendingPayouts settles n merchants of a fresh date through the floor's loop, leaving n
// PENDING payouts in the operation ledger.
func pendingPayouts(ctx context.Context, pool *pgxpool.Pool, dates *dateSeq, n int) (time.Time, error) {
	date := dates.take()
	if err := seedDate(ctx, pool, date, n); err != nil {
		return date, err
	}
	m, err := floorRun(ctx, pool, date, 1000, n)
	if err != nil {
		return date, err
	}
	if m.items != n {
		return date, fmt.Errorf("settled %d merchants of %s, want %d", m.items, date.Format(time.DateOnly), n)
	}
	return date, nil
}

// sample is the sample's Service on a database, not started, with stand-alone handles on
// the same database and the same payout configuration (the fake bank's Sender and Checker,
// OnPayoutOutcomes, the sample's concurrency and timeouts) for passes driven here on demand:
// Outbox.Drain, Reconciler.RunOnce, Engine.Maintain. They are not the handles the Service's
// client runs.
type sample struct {
	*settlement.Service
	Engine     *workflow.Engine
	Outbox     *outbox.Outbox
	Reconciler *reconcile.Reconciler
}

func sampleService(pool *pgxpool.Pool, bank *fakebank.Client) (*sample, error) {
	cfg := (&settlement.ServiceConfig{Bank: bankfake.New(bank), Logger: quietLogger(), ID: "bench"}).WithDefaults()
	svc, err := settlement.NewService(pool, cfg)
	if err != nil {
		return nil, err
	}
	s := &sample{Service: svc}
	wcfg := workflow.ConfigWithDefaults(cfg.Workflow)
	wcfg.Logger = cfg.Logger
	if s.Engine, err = workflow.New(pool, wcfg); err != nil {
		return nil, err
	}
	if s.Outbox, err = outbox.New(pool, &outbox.Config{ID: cfg.ID, Logger: cfg.Logger, Kinds: map[string]*outbox.KindConfig{settlement.PayoutKind: {
		Sender: cfg.Bank, OnOutcomeBatch: settlement.OnPayoutOutcomes, Concurrency: cfg.PayoutConcurrency,
		Timeout: cfg.PayoutTimeout, Lease: cfg.PayoutLease, RetryBackoff: cfg.PayoutRetryBackoff,
	}}}); err != nil {
		return nil, err
	}
	s.Reconciler, err = reconcile.New(pool, &reconcile.Config{Outbox: s.Outbox, Interval: cfg.ReconcileInterval, Logger: cfg.Logger,
		Kinds: map[string]*reconcile.KindConfig{settlement.PayoutKind: {
			Checker: cfg.Bank, Timeout: cfg.PayoutTimeout, Grace: cfg.ReconcileGrace, CheckBackoff: cfg.ReconcileBackoff,
		}}})
	return s, err
}

// sampleSection is what the delivery and reconcile sections start from: the section's
// database, a zero-latency fake bank and the sample's Service on them, not started. done
// stops the bank and closes the pool.
func (r *runner) sampleSection(ctx context.Context, name string) (pool *pgxpool.Pool, bank *fakebank.Bank, svc *sample, done func(), err error) {
	pool, _, err = r.sectionDB(ctx, name)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	bank, client, stop, err := startBank()
	if err != nil {
		pool.Close()
		return nil, nil, nil, nil, err
	}
	done = func() { stop(); pool.Close() }
	if svc, err = sampleService(pool, client); err != nil {
		done()
		return nil, nil, nil, nil, err
	}
	return pool, bank, svc, done, nil
}

func (r *runner) deliverySection(ctx context.Context) error {
	pool, bank, svc, done, err := r.sampleSection(ctx, "delivery")
	if err != nil {
		return err
	}
	defer done()
	kc := svc.Outbox.KindConfig(settlement.PayoutKind)
	dates := newDateSeq()
	n := r.opts.deliveryOps
	var (
		rates  []float64
		drains []measurement
	)
	for range 2 {
		if _, err := pendingPayouts(ctx, pool, dates, n); err != nil {
			return err
		}
		db := r.dbCPU()
		start := time.Now()
		got, err := svc.Outbox.Drain(ctx, settlement.PayoutKind)
		elapsed := time.Since(start)
		if err != nil {
			return fmt.Errorf("draining payouts: %w", err)
		}
		if got != n {
			return fmt.Errorf("delivered %d payouts, want %d", got, n)
		}
		rates = append(rates, float64(n)/elapsed.Seconds())
		drains = append(drains, measurement{items: n, elapsed: elapsed, db: db.used()})
	}
	var succeeded, paid int
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM stepwise_operation WHERE state = 'SUCCEEDED'),
		(SELECT count(*) FROM settlement WHERE status = 'PAID')`).Scan(&succeeded, &paid); err != nil {
		return fmt.Errorf("counting delivered payouts: %w", err)
	}
	if st := bank.Stats(); succeeded != 2*n || paid != 2*n || st.Applied != 2*n {
		return fmt.Errorf("after delivery: %d payouts SUCCEEDED, %d settlements PAID, %d applied by the bank; want %d each", succeeded, paid, st.Applied, 2*n)
	}
	r.printf("\n== delivery: payouts claimed, sent to the zero-latency fake bank over HTTP and recorded (outcome callback and audit included) ==\n")
	r.check(max(rates[0], rates[1]) >= 5000, "delivery >= 5,000 ops/s: %s", fmtRate(max(rates[0], rates[1])))
	r.printf("%s ops/s (best of 2 drains of %d payouts; %s and %s): batch %d, concurrency %d, fakebank.Sender and OnPayoutOutcomes\n",
		fmtRate(max(rates[0], rates[1])), n, fmtRate(rates[0]), fmtRate(rates[1]), kc.BatchSize, kc.Concurrency)
	if r.serverCPU != nil {
		r.printf("database CPU, median of the 2 drains: %s\n", dbCPULine(drains, "payout"))
	}
	return nil
}

func (r *runner) reconcileSection(ctx context.Context) error {
	pool, bank, svc, done, err := r.sampleSection(ctx, "reconcile")
	if err != nil {
		return err
	}
	defer done()
	n := r.opts.reconcileOps
	if _, err := pendingPayouts(ctx, pool, newDateSeq(), n); err != nil {
		return err
	}
	// Every payment is applied and its answer lost (a 5xx after applying): each payout ends
	// UNKNOWN_EXTERNAL, and the bank holds the effect the reconciler must find.
	if err := bank.SetFaults(fakebank.Mix{Error5xxAfterApply: 1}); err != nil {
		return err
	}
	if _, err := svc.Outbox.Drain(ctx, settlement.PayoutKind); err != nil {
		return fmt.Errorf("sending payouts into the 5xx: %w", err)
	}
	if err := bank.SetFaults(fakebank.Mix{}); err != nil {
		return err
	}
	var unknown int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM stepwise_operation WHERE state = 'UNKNOWN_EXTERNAL'`).Scan(&unknown); err != nil {
		return err
	}
	if unknown != n {
		return fmt.Errorf("%d payouts UNKNOWN_EXTERNAL after the 5xx drain, want %d", unknown, n)
	}
	db := r.dbCPU()
	start := time.Now()
	res, err := svc.Reconciler.RunOnce(ctx, &reconcile.RunOpts{Kind: settlement.PayoutKind, Force: true})
	elapsed := time.Since(start)
	dbUsed := db.used()
	if err != nil {
		return fmt.Errorf("reconciling: %w", err)
	}
	if res.Checked != n || res.Moved[outbox.StateSucceeded] != n {
		return fmt.Errorf("reconcile pass checked %d and moved %d to SUCCEEDED, want %d each (lookups %v)", res.Checked, res.Moved[outbox.StateSucceeded], n, res.Lookups)
	}
	r.printf("\n== reconcile: UNKNOWN_EXTERNAL payouts looked up at the bank by operation id and recorded SUCCEEDED (settlement PAID in the same tx) ==\n")
	r.printf("%s lookups/s (%d payouts in one forced pass, %s), fakebank.Checker and reconcile defaults\n",
		fmtRate(float64(n)/elapsed.Seconds()), n, fmtDur(elapsed))
	if r.serverCPU != nil {
		r.printf("database CPU: %s\n", dbCPULine([]measurement{{items: n, elapsed: elapsed, db: dbUsed}}, "lookup"))
	}
	return nil
}
