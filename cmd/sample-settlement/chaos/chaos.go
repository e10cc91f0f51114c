// Package chaos is the fault-injection suite on the sample settlement service (docs/design.md,
// drill 7): several worker processes settle a date of thousands of merchants against a bank
// that misbehaves on one request in ten, while a killer SIGKILLs a random worker every
// 0.5-2 s (and restarts it) and now and then SIGSTOPs one past its lease. After the system
// comes to rest, every invariant of docs/design.md is checked with its evidence: nothing lost,
// nothing done twice, money balances.
//
// The same code runs as a bounded test on every CI run (chaos_test.go) and as a long soak
// from the command line:
//
//	go run ./cmd/sample-settlement chaos --duration 10m
//
// A run is reproducible from its seed (printed first, and with the first violation).
package chaos

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/stepwise-go/stepwise/cmd/sample-settlement/settlement"
	"github.com/stepwise-go/stepwise/internal/testkit/fakebank"
	"github.com/stepwise-go/stepwise/workflow"
	"github.com/stepwise-go/stepwise/workflowtest"
)

// Config configures Run.
type Config struct {
	// DatabaseURL is a database that Prepare has made ready. Required.
	DatabaseURL string

	// StartWorker starts one worker process running WorkerMain with env. Required.
	StartWorker func(env []string) (workflowtest.Worker, error)

	// Merchants and Transactions size the date. Default 20,000 and 60,000.
	Merchants, Transactions int

	// Shards is how many runs settle the date. Defaults to 8.
	Shards int

	// BatchSize is merchants per settle step. Defaults to 2: small steps make long runs
	// (1,250 steps a shard), so kills land mid-run and takeovers are exercised.
	BatchSize int

	// Workers is how many worker processes run at once. Defaults to 4.
	Workers int

	// Duration bounds the killing; then the system runs to rest. Defaults to 45s.
	Duration time.Duration

	// Soak keeps the load up for the whole Duration: whenever a date comes to rest before
	// Duration ends, the next date is seeded and started. Without it one date is settled and
	// the killer stops when it is at rest.
	Soak bool

	// Seed makes the killer and the bank's faults reproducible. Defaults to the clock.
	Seed uint64

	// Lease is the workers' run lease; takeovers take about this long. Defaults to 2s.
	Lease time.Duration

	// Faults is the bank's fault mix. Defaults to 10% in all: 2% each of refuse, 5xx
	// before, 5xx after, drop after and delay after applying.
	Faults *fakebank.Mix

	// Logf receives the killer's actions; Progress a one-line summary every few seconds.
	// Both default to discarding.
	Logf     func(format string, args ...any)
	Progress io.Writer
}

func (c *Config) withDefaults() *Config {
	out := *c
	if out.Merchants == 0 {
		out.Merchants = 20000
	}
	if out.Transactions == 0 {
		out.Transactions = 3 * out.Merchants
	}
	if out.Shards == 0 {
		out.Shards = 8
	}
	if out.BatchSize == 0 {
		out.BatchSize = 2
	}
	if out.Workers == 0 {
		out.Workers = 4
	}
	if out.Duration == 0 {
		out.Duration = 45 * time.Second
	}
	if out.Seed == 0 {
		out.Seed = uint64(time.Now().UnixNano())
	}
	if out.Lease == 0 {
		out.Lease = 2 * time.Second
	}
	if out.Faults == nil {
		out.Faults = &fakebank.Mix{RefuseBeforeApply: 0.02, Error5xxBeforeApply: 0.02, Error5xxAfterApply: 0.02, DropAfterApply: 0.02, DelayAfterApply: 0.02}
	}
	if out.Logf == nil {
		out.Logf = func(string, ...any) {}
	}
	if out.Progress == nil {
		out.Progress = io.Discard
	}
	return &out
}

// Date is the (first) business date a chaos run settles; a soak goes on day by day.
var Date = time.Date(2026, 11, 27, 0, 0, 0, 0, time.UTC)

// Result is what a chaos run did and found.
type Result struct {
	Seed      uint64
	Chaos     *workflowtest.ChaosReport
	Takeovers int
	Fenced    int
	Unknown   int // operations that were UNKNOWN_EXTERNAL at some point
	Bank      fakebank.Stats
	// Violations of invariants 1-5 over Stepwise's tables, then the sample's own checks
	// (1-6, money and the bank's ledger) that failed.
	Violations []workflowtest.Violation
	// Invariants are the sample's checks, one result per date settled.
	Invariants []*settlement.Result
}

// OK reports whether the run reached rest with every invariant holding.
func (r *Result) OK() bool {
	if r.Chaos == nil || !r.Chaos.Quiet || len(r.Violations) > 0 || len(r.Invariants) == 0 {
		return false
	}
	for _, inv := range r.Invariants {
		if !inv.OK() {
			return false
		}
	}
	return true
}

// Summary is the run's one-paragraph account, first violation included.
func (r *Result) Summary() string {
	s := fmt.Sprintf("chaos seed=%d: %d date(s) settled; %s; takeovers=%d fenced-commits=%d ops-ever-unknown=%d bank: requests=%d applied=%d faults=%v",
		r.Seed, len(r.Invariants), r.Chaos, r.Takeovers, r.Fenced, r.Unknown, r.Bank.Requests, r.Bank.Applied, r.Bank.Faults)
	if r.OK() {
		return s + "\nall invariants hold"
	}
	if r.Chaos != nil && !r.Chaos.Quiet {
		s += fmt.Sprintf("\nNOT AT REST: %v", r.Chaos.QuietErr)
	}
	if len(r.Violations) > 0 {
		s += fmt.Sprintf("\nFIRST VIOLATION (seed %d): %s (%d in all)", r.Seed, r.Violations[0], len(r.Violations))
	}
	return s
}

// Prepare migrates the database, applies the sample's schema and seeds the date. The data is
// the same for every seed (seeded with 1): the seed varies the faults, not the books.
func Prepare(ctx context.Context, pool *pgxpool.Pool, cfg *Config) error {
	cfg = cfg.withDefaults()
	if err := settlement.Migrate(ctx, pool); err != nil {
		return err
	}
	_, err := settlement.Seed(ctx, pool, &settlement.SeedConfig{
		Date: Date, Merchants: cfg.Merchants, Transactions: cfg.Transactions, Seed: 1,
	})
	return err
}

// Run settles Date under chaos and checks every invariant. The database must have been
// prepared (Prepare). It returns an error only when the suite itself could not run.
func Run(ctx context.Context, cfg *Config) (*Result, error) {
	if cfg == nil || cfg.DatabaseURL == "" || cfg.StartWorker == nil {
		return nil, errors.New("chaos.Run: DatabaseURL and StartWorker are required")
	}
	cfg = cfg.withDefaults()
	res := &Result{Seed: cfg.Seed}
	pool, err := pgxpool.New(ctx, cfg.DatabaseURL)
	if err != nil {
		return nil, fmt.Errorf("chaos: connecting: %w", err)
	}
	defer pool.Close()

	bank := fakebank.New(&fakebank.Config{Faults: *cfg.Faults, Seed: cfg.Seed, Delay: 3 * time.Second})
	if err := bank.Start(); err != nil {
		return nil, fmt.Errorf("chaos: starting the bank: %w", err)
	}
	defer bank.Close()
	bankClient := fakebank.NewClient(bank.URL(), nil)

	plan, err := settlement.Plan{Shards: cfg.Shards}.Compile()
	if err != nil {
		return nil, err
	}
	inserter, err := river.NewClient(riverpgxv5.New(pool), &river.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		return nil, err
	}
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, _, err := plan.Start(ctx, inserter, tx, Date)
		return err
	}); err != nil {
		return nil, fmt.Errorf("chaos: starting the date: %w", err)
	}

	env := []string{
		"DATABASE_URL=" + cfg.DatabaseURL,
		"BANK_URL=" + bank.URL(),
		"CHAOS_LEASE=" + cfg.Lease.String(),
		"CHAOS_SHARDS=" + strconv.Itoa(cfg.Shards),
		"CHAOS_BATCH=" + strconv.Itoa(cfg.BatchSize),
	}
	dates := []time.Time{Date}
	deadline := time.Now().Add(cfg.Duration)
	until := func(ctx context.Context) (bool, error) {
		rest, err := atRest(ctx, pool)
		if err != nil || !rest {
			return false, err
		}
		if !cfg.Soak || !time.Now().Before(deadline) {
			return true, nil
		}
		next := dates[len(dates)-1].AddDate(0, 0, 1)
		if _, err := settlement.Seed(ctx, pool, &settlement.SeedConfig{
			Date: next, Merchants: cfg.Merchants, Transactions: cfg.Transactions, Seed: 1,
		}); err != nil {
			return false, fmt.Errorf("chaos: seeding %s: %w", next.Format(time.DateOnly), err)
		}
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, _, err := plan.Start(ctx, inserter, tx, next)
			return err
		}); err != nil {
			return false, fmt.Errorf("chaos: starting %s: %w", next.Format(time.DateOnly), err)
		}
		dates = append(dates, next)
		cfg.Logf("chaos: %s at rest; soaking on with %s", dates[len(dates)-2].Format(time.DateOnly), next.Format(time.DateOnly))
		return false, nil
	}
	stopProgress := progress(ctx, pool, cfg.Progress, time.Now())
	defer stopProgress()
	report, err := workflowtest.RunChaos(ctx, &workflowtest.ChaosConfig{
		Start:        func() (workflowtest.Worker, error) { return cfg.StartWorker(env) },
		Workers:      cfg.Workers,
		Seed:         cfg.Seed,
		KillMin:      500 * time.Millisecond,
		KillMax:      2 * time.Second,
		StopEvery:    6,
		StopFor:      cfg.Lease + 2*time.Second,
		Duration:     cfg.Duration,
		Until:        until,
		QuietTimeout: 3 * time.Minute,
		Logf:         cfg.Logf,
	})
	res.Chaos = report
	if err != nil {
		return res, err
	}
	stopProgress()

	if err := pool.QueryRow(ctx, `SELECT
			(SELECT count(*) FROM stepwise_event WHERE kind = 'run.takeover'),
			(SELECT count(*) FROM stepwise_event WHERE kind = 'lease.fenced'),
			(SELECT count(DISTINCT subject) FROM stepwise_event WHERE kind = 'op.transition' AND to_state = 'UNKNOWN_EXTERNAL')`).
		Scan(&res.Takeovers, &res.Fenced, &res.Unknown); err != nil {
		return res, fmt.Errorf("chaos: counting takeovers: %w", err)
	}
	res.Bank = bank.Stats()
	res.Violations, err = workflowtest.CheckInvariants(ctx, pool, &workflowtest.CheckOpts{Quiet: report.Quiet})
	if err != nil {
		return res, err
	}
	for _, d := range dates {
		inv, err := settlement.CheckInvariants(ctx, pool, bankClient, plan, d)
		if err != nil {
			return res, err
		}
		res.Invariants = append(res.Invariants, inv)
		for _, c := range inv.Checks {
			if !c.OK {
				res.Violations = append(res.Violations, workflowtest.Violation{Invariant: c.Invariant, Name: c.Name,
					Evidence: d.Format(time.DateOnly) + ": " + c.Evidence})
			}
		}
	}
	return res, nil
}

// atRest is true when every run has finished and every operation is proven or MANUAL.
func atRest(ctx context.Context, pool *pgxpool.Pool) (bool, error) {
	var open int
	err := pool.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM stepwise_run WHERE status IN ('pending', 'running')) +
		(SELECT count(*) FROM stepwise_operation WHERE state NOT IN ('SUCCEEDED', 'FAILED_PERMANENT', 'MANUAL'))`).Scan(&open)
	return err == nil && open == 0, err
}

// progress prints a one-line summary every 2 seconds until stopped.
func progress(ctx context.Context, pool *pgxpool.Pool, w io.Writer, began time.Time) (stop func()) {
	if w == io.Discard {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(2 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			var runsDone, runs, ok, unknown, open, takeovers int
			err := pool.QueryRow(ctx, `SELECT
				(SELECT count(*) FILTER (WHERE status NOT IN ('pending', 'running')) FROM stepwise_run),
				(SELECT count(*) FROM stepwise_run),
				(SELECT count(*) FILTER (WHERE state = 'SUCCEEDED') FROM stepwise_operation),
				(SELECT count(*) FILTER (WHERE state = 'UNKNOWN_EXTERNAL') FROM stepwise_operation),
				(SELECT count(*) FILTER (WHERE state NOT IN ('SUCCEEDED', 'FAILED_PERMANENT', 'MANUAL')) FROM stepwise_operation),
				(SELECT count(*) FROM stepwise_event WHERE kind = 'run.takeover')`).
				Scan(&runsDone, &runs, &ok, &unknown, &open, &takeovers)
			if err != nil {
				continue
			}
			fmt.Fprintf(w, "%6s  runs %d/%d  payouts ok %d, open %d (unknown %d)  takeovers %d\n",
				time.Since(began).Round(time.Second), runsDone, runs, ok, open, unknown, takeovers)
		}
	}()
	return func() { cancel(); <-done }
}

// WorkerMain is one worker process of the suite: the settlement service (settle steps,
// payout delivery, reconciliation, maintenance) until ctx ends. env carries DATABASE_URL,
// BANK_URL, CHAOS_LEASE, CHAOS_SHARDS and CHAOS_BATCH.
func WorkerMain(ctx context.Context, env map[string]string) error {
	lease, err := time.ParseDuration(env["CHAOS_LEASE"])
	if err != nil {
		return fmt.Errorf("CHAOS_LEASE: %w", err)
	}
	shards, err := strconv.Atoi(env["CHAOS_SHARDS"])
	if err != nil {
		return fmt.Errorf("CHAOS_SHARDS: %w", err)
	}
	batch, err := strconv.Atoi(env["CHAOS_BATCH"])
	if err != nil {
		return fmt.Errorf("CHAOS_BATCH: %w", err)
	}
	pool, err := pgxpool.New(ctx, env["DATABASE_URL"])
	if err != nil {
		return err
	}
	defer pool.Close()
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	svc, err := settlement.NewService(pool, &settlement.ServiceConfig{
		Bank:          fakebank.NewClient(env["BANK_URL"], nil),
		Plan:          settlement.Plan{Shards: shards},
		BatchSize:     batch,
		PayoutTimeout: time.Second,
		PayoutLease:   2 * lease,
		// Short reconciliation so the suite comes to rest in seconds, not in the
		// production back-off's minutes; the grace still exceeds the payout timeout.
		ReconcileInterval: time.Second,
		ReconcileGrace:    3 * time.Second,
		ReconcileBackoff:  func(int) time.Duration { return time.Second },
		Workflow:          &workflow.Config{Lease: lease, Logger: logger},
		Logger:            logger,
	})
	if err != nil {
		return err
	}
	if err := svc.Start(ctx); err != nil {
		return err
	}
	// The killer hits River's leader too; takeover, delivery and reconciliation must not
	// wait for a new election.
	go func() { _ = svc.Engine.RunMaintenance(ctx, svc.Client) }()
	go func() { _ = svc.Outbox.RunMaintenance(ctx, svc.Client) }()
	go func() { _ = svc.Reconciler.RunMaintenance(ctx, svc.Client) }()
	fmt.Println("ready")
	<-ctx.Done()
	return svc.Stop(context.WithoutCancel(ctx), 5*time.Second)
}
