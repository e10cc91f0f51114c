// Package chaos is the fault-injection suite on the sample settlement service (docs/design.md,
// drill 7): several worker processes settle a date of thousands of merchants against a bank
// that misbehaves on one request in ten, while a killer SIGKILLs a random worker every
// 0.5-2 s (and restarts it) and now and then SIGSTOPs one past its lease. After the system
// comes to rest, every invariant of docs/design.md is checked with its evidence: nothing lost,
// nothing done twice, money balances.
//
// The bank is strict: it never deduplicates, so a second send is a second payment, and it logs
// every request. Besides docs/design.md's invariants a run is judged on that request log (no two
// requests for one payout in flight, none after the ledger recorded it terminal, not-found
// believed only after the previous request ended plus the grace, one effect per payout) and on
// the takeovers (none of a run whose worker was alive, unpaused and connected; no run failed
// before MaxAttempts crashes), and reports the counts.
//
// Profiles (Profiles, ProfileConfig) aim at one hazard each: classic (the above), long (runs of
// hundreds of 150ms slices), slow-bank (latencies around and above the sender timeout),
// paused-dispatcher (SIGSTOP the process holding claimed payouts, past its claim) and sleepers
// (Sleep(1h) must hold). The bounded ones run in CI (profiles_test.go, one test each); any
// runs from the command line at full size, and mix runs them in turn as a soak:
//
//	go run ./cmd/stepwise-lab chaos --profile long --seed 7
//	go run ./cmd/stepwise-lab chaos --profile mix --duration 10m
//
// A run is reproducible from its seed (printed first, and with the first violation).
package chaos

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/stepwise-go/stepwise/cmd/sample-settlement/bankfake"
	"github.com/stepwise-go/stepwise/cmd/sample-settlement/settlement"
	"github.com/stepwise-go/stepwise/workflow"
	"github.com/stepwise-go/stepwise/workflowtest"
	"github.com/stepwise-go/stepwise/workflowtest/fakebank"
)

// chaosWorkerPoolConns is a chaos worker's pool: NewClient's minimum for its queues (a settle
// worker per shard, 2 each for the outbox's two queues and the reconciler's, 1 default, plus
// 3) and one spare. A change of the queues that needs more is refused by NewClient with the
// number, loudly, in every chaos run.
func chaosWorkerPoolConns(shards int) int32 { return int32(shards) + 1 + 2 + 2 + 2 + 3 + 1 }

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

	// Profile names the profile the config came from (see ProfileConfig), for the report.
	Profile string

	// Workload is "settle" (default: settle a date of payouts against the bank) or "steps"
	// (long runs and sleepers of plain steps; see LongRuns and Sleepers).
	Workload string

	// BankLatency is the strict bank's latency profile. Defaults to none.
	BankLatency fakebank.LatencyProfile

	// PayoutTimeout is the sender's timeout (default 1s), ReconcileGrace the reconciler's
	// grace (default 3s), PayoutConcurrency the sends per process (default 32).
	PayoutTimeout, ReconcileGrace time.Duration
	PayoutConcurrency             int

	// KillMin and KillMax bound the pause between hits (default 0.5s and 2s); every
	// StopEvery-th hit is a SIGSTOP for StopFor (default 6 and Lease + 2s: longer than a held
	// lease, so a worker frozen holding one is taken over; a worker frozen between a fetch and
	// its claim holds none and is taken over only after two Leases, so a freeze that short
	// only delays its run).
	KillMin, KillMax time.Duration
	StopEvery        int
	StopFor          time.Duration

	// PauseDispatcher aims every hit at the worker holding the most claimed (PROCESSING)
	// payouts, so the process that is sending is the one frozen.
	PauseDispatcher bool

	// Steps workload: LongRuns runs of steps of StepTime each with a Slice, living for
	// LongLifetime, and Sleepers runs that Sleep(SleepFor) after one step. With sleepers the
	// chaos lasts the whole Duration.
	Slice, StepTime time.Duration
	LongRuns        int
	LongLifetime    time.Duration
	Sleepers        int
	SleepFor        time.Duration
	SleeperWork     time.Duration // how long a sleeper's first step works before it sleeps

	// Retention, when set, runs retention.Prune with a short age in a loop beside the chaos,
	// and an operator resolving payouts by hand, and adds the retention checks (see
	// Retention).
	Retention *Retention

	// Fault, when set, replaces the killer (workflowtest.ChaosConfig.Fault): no worker is
	// hit, and Fault breaks something else beside them, such as the database server
	// (TestDrillPostgresRestart), returning the spans the workers were cut off.
	Fault func(ctx context.Context) (cutOff []workflowtest.Interval, err error)

	// QuietTimeout bounds the wait for rest after the chaos without progress (no step
	// committed, no run finished, no operation settled); the whole wait is bounded at ten
	// times it. Defaults to 3 minutes.
	QuietTimeout time.Duration
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
	if out.Workload == "" {
		out.Workload = "settle"
	}
	if out.PayoutTimeout == 0 {
		out.PayoutTimeout = time.Second
	}
	if out.ReconcileGrace == 0 {
		out.ReconcileGrace = 3 * time.Second
	}
	if out.PayoutConcurrency == 0 {
		out.PayoutConcurrency = 32
	}
	if out.KillMin == 0 {
		out.KillMin = 500 * time.Millisecond
	}
	if out.KillMax == 0 {
		out.KillMax = 2 * time.Second
	}
	if out.StopEvery == 0 {
		out.StopEvery = 6
	}
	if out.StopFor == 0 {
		out.StopFor = out.Lease + 2*time.Second
	}
	if out.Slice == 0 {
		out.Slice = 150 * time.Millisecond
	}
	if out.StepTime == 0 {
		out.StepTime = 10 * time.Millisecond
	}
	if out.SleepFor == 0 {
		out.SleepFor = time.Hour
	}
	if out.QuietTimeout == 0 {
		out.QuietTimeout = 3 * time.Minute
	}
	return &out
}

// takeoverWindow is how long before a takeover a kill or pause of the holder still explains
// it: two leases (a lease may have been renewed just before the hit) plus maintenance's
// interval, and slack for a loaded machine.
func (c *Config) takeoverWindow() time.Duration { return 2*c.Lease + 3*time.Second }

// Date is the (first) business date a chaos run settles; a soak goes on day by day.
var Date = time.Date(2026, 11, 27, 0, 0, 0, 0, time.UTC)

// Result is what a chaos run did and found.
type Result struct {
	Profile   string
	Seed      uint64
	Chaos     *workflowtest.ChaosReport
	Takeovers int
	// Needless counts the takeovers of runs whose worker was alive, running and connected.
	Needless workflowtest.TakeoverCount
	Fenced   int
	Unknown  int // operations that were UNKNOWN_EXTERNAL at some point
	Bank     fakebank.Stats
	// Requests is how many payment requests reached the (strict) bank; the next counts are
	// violations of the request-log checks by kind.
	Requests, Concurrent, AfterTerminal, EarlyResends, EffectMismatches int
	// FailedEarly counts runs failed with fewer crashes and errors than MaxAttempts.
	FailedEarly int
	// EarlyWakes counts sleepers that woke before their Sleep ended.
	EarlyWakes int
	// Open names a few runs and operations not at rest, when the run did not come to rest.
	Open []string
	// Violations of invariants 1-5 over Stepwise's tables, then the sample's own checks
	// (1-6, money and the bank's ledger) that failed.
	Violations []workflowtest.Violation
	// Invariants are the sample's checks, one result per date settled.
	Invariants []*settlement.Result
	// Retention counts what a retention soak pruned and decided (nil without Config.Retention).
	Retention *RetentionReport
}

// oracleChecks are the checks of the strict oracle (the bank's request log, takeovers, the
// steps workload), as opposed to docs/design.md's invariants 1-6 that the chaos suite checked before.
var oracleChecks = map[string]bool{
	workflowtest.NameConcurrentRequests: true, workflowtest.NameSendAfterTerminal: true,
	workflowtest.NameEarlyResend: true, workflowtest.NameEffectMismatch: true,
	workflowtest.NameNeedlessTakeover: true, workflowtest.NameFailedEarly: true,
	nameLongFinishes: true, nameNoEarlyWake: true, settlement.SendDiscipline: true,
}

// LegacyViolations are the violations of the checks the suite had before the strict oracle:
// docs/design.md's invariants 1-6 over the tables and the bank's ledger (now strict).
func (r *Result) LegacyViolations() []workflowtest.Violation {
	var out []workflowtest.Violation
	for _, v := range r.Violations {
		if !oracleChecks[v.Name] {
			out = append(out, v)
		}
	}
	return out
}

// OK reports whether the run reached rest with every invariant holding.
func (r *Result) OK() bool {
	if r.Chaos == nil || !r.Chaos.Quiet || len(r.Violations) > 0 || (len(r.Invariants) == 0 && r.Profile == "") {
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
	profile := r.Profile
	if profile == "" {
		profile = "classic"
	}
	s := fmt.Sprintf("chaos profile=%s seed=%d: %d date(s) settled; %s; takeovers=%d needless-takeovers=%d failed-early=%d early-wakes=%d fenced-commits=%d ops-ever-unknown=%d\n"+
		"bank: requests=%d applied=%d concurrent-duplicate-requests=%d sends-after-terminal=%d early-resends=%d effect-mismatches=%d faults=%v",
		profile, r.Seed, len(r.Invariants), r.Chaos, r.Takeovers, r.Needless.Needless, r.FailedEarly, r.EarlyWakes, r.Fenced, r.Unknown,
		r.Requests, r.Bank.Applied, r.Concurrent, r.AfterTerminal, r.EarlyResends, r.EffectMismatches, r.Bank.Faults)
	if r.Retention != nil {
		s += "\n" + r.Retention.String()
	}
	if r.OK() {
		return s + "\nall invariants hold"
	}
	if r.Chaos != nil && !r.Chaos.Quiet {
		s += fmt.Sprintf("\nNOT AT REST: %v", r.Chaos.QuietErr)
		for _, o := range r.Open {
			s += "\n  " + o
		}
	}
	if len(r.Violations) > 0 {
		s += fmt.Sprintf("\nFIRST VIOLATION (seed %d): %s (%d in all)", r.Seed, r.Violations[0], len(r.Violations))
		byName := map[string]int{}
		first := map[string]string{}
		var names []string
		for _, v := range r.Violations {
			if byName[v.Name] == 0 {
				names = append(names, v.Name)
				first[v.Name] = v.Evidence
			}
			byName[v.Name]++
		}
		for _, n := range names {
			s += fmt.Sprintf("\n  %4d x %s; e.g. %s", byName[n], n, first[n])
		}
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
	if cfg.Workload == "steps" {
		return nil // no payouts: the schema is all the steps workload needs
	}
	_, err := settlement.Seed(ctx, pool, &settlement.SeedConfig{
		Date: Date, Merchants: cfg.Merchants, Transactions: cfg.Transactions, Seed: 1,
	})
	return err
}

// Run settles Date under chaos (or, with Workload "steps", works the long and sleeper runs)
// and checks every invariant, the strict bank's request log and the takeovers included. The
// database must have been prepared (Prepare). It returns an error only when the suite itself
// could not run.
func Run(ctx context.Context, cfg *Config) (*Result, error) {
	if cfg == nil || cfg.DatabaseURL == "" || cfg.StartWorker == nil {
		return nil, errors.New("chaos.Run: DatabaseURL and StartWorker are required")
	}
	cfg = cfg.withDefaults()
	if cfg.Workload != "settle" && cfg.Workload != "steps" {
		return nil, fmt.Errorf("chaos.Run: Workload %q is neither \"settle\" nor \"steps\"", cfg.Workload)
	}
	res := &Result{Seed: cfg.Seed, Profile: cfg.Profile}
	// The harness's own pool: its checks, and the retention soak's settle service, whose
	// client refuses a pool smaller than its workers need (pgx's default is 4).
	hcfg, err := pgxpool.ParseConfig(cfg.DatabaseURL)
	if err != nil {
		return nil, err
	}
	hcfg.MaxConns = settlement.PoolConnsFor(0)
	pool, err := pgxpool.NewWithConfig(ctx, hcfg)
	if err != nil {
		return nil, fmt.Errorf("chaos: connecting: %w", err)
	}
	defer pool.Close()

	// The bank is strict: it never deduplicates, so a second send is a second payment, and
	// its request log is the evidence of the send discipline.
	bank := fakebank.New(&fakebank.Config{Faults: *cfg.Faults, Seed: cfg.Seed, Delay: 3 * time.Second, Strict: true, Profile: cfg.BankLatency})
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
	var soak *retentionSoak
	if cfg.Retention != nil {
		// Before any work starts, so that every event Prune deletes is archived.
		if soak, err = newRetentionSoak(ctx, pool, cfg, bankClient, plan); err != nil {
			return nil, err
		}
	}
	if cfg.Workload == "steps" {
		err = startSteps(ctx, pool, cfg)
	} else {
		err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, _, err := plan.Start(ctx, inserter, tx, Date, "chaos")
			return err
		})
	}
	if err != nil {
		return nil, fmt.Errorf("chaos: starting the work: %w", err)
	}

	env := []string{
		"DATABASE_URL=" + cfg.DatabaseURL,
		"BANK_URL=" + bank.URL(),
		"CHAOS_WORKLOAD=" + cfg.Workload,
		"CHAOS_LEASE=" + cfg.Lease.String(),
		"CHAOS_SHARDS=" + strconv.Itoa(cfg.Shards),
		"CHAOS_BATCH=" + strconv.Itoa(cfg.BatchSize),
		"CHAOS_SLICE=" + cfg.Slice.String(),
		"CHAOS_PAYOUT_TIMEOUT=" + cfg.PayoutTimeout.String(),
		"CHAOS_RECONCILE_GRACE=" + cfg.ReconcileGrace.String(),
		"CHAOS_PAYOUT_CONCURRENCY=" + strconv.Itoa(cfg.PayoutConcurrency),
	}
	dates := []time.Time{Date}
	began := time.Now()
	deadline := began.Add(cfg.Duration)
	until := func(ctx context.Context) (bool, error) {
		if cfg.Workload == "steps" {
			rest, err := stepsAtRest(ctx, pool)
			// Sleepers never finish: the chaos lasts the whole Duration, so that an early
			// wake has the time to show.
			return rest && (cfg.Sleepers == 0 || !time.Now().Before(deadline)), err
		}
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
			_, _, err := plan.Start(ctx, inserter, tx, next, "chaos")
			return err
		}); err != nil {
			return false, fmt.Errorf("chaos: starting %s: %w", next.Format(time.DateOnly), err)
		}
		dates = append(dates, next)
		cfg.Logf("chaos: %s at rest; soaking on with %s", dates[len(dates)-2].Format(time.DateOnly), next.Format(time.DateOnly))
		return false, nil
	}
	var target func(ctx context.Context, ids []string) int
	if cfg.PauseDispatcher {
		target = func(ctx context.Context, ids []string) int { return sendingWorker(ctx, pool, ids, cfg.Logf) }
	}
	stopProgress := progress(ctx, pool, cfg.Progress, began)
	defer stopProgress()
	if soak != nil {
		soak.start(ctx)
	}
	var started sync.Map // pid -> Worker, for the stalls they report
	report, err := workflowtest.RunChaos(ctx, &workflowtest.ChaosConfig{
		Start: func() (workflowtest.Worker, error) {
			w, err := cfg.StartWorker(env)
			if err == nil {
				started.Store(w.Pid(), w)
			}
			return w, err
		},
		Workers:      cfg.Workers,
		Seed:         cfg.Seed,
		KillMin:      cfg.KillMin,
		KillMax:      cfg.KillMax,
		StopEvery:    cfg.StopEvery,
		StopFor:      cfg.StopFor,
		Duration:     cfg.Duration,
		Until:        until,
		QuietTimeout: cfg.QuietTimeout,
		Progress:     func(ctx context.Context) (int64, error) { return workDone(ctx, pool) },
		Logf:         cfg.Logf,
		WorkerID:     func(w workflowtest.Worker) string { return workerID(w.Pid()) },
		Target:       target,
		Fault:        cfg.Fault,
	})
	res.Chaos = report
	if err != nil {
		return res, err
	}
	stopProgress()
	var retentionViolations []workflowtest.Violation
	if soak != nil {
		// The retention checks judge what Prune kept; they put the pruned events back
		// for the checks below, which judge what the system did from its whole trail.
		vs, err := soak.finish(ctx, inserter, plan, dates)
		res.Retention = soak.Report()
		if err != nil {
			return res, err
		}
		retentionViolations = vs
	}

	checksBegan := time.Now()
	defer func() { cfg.Logf("chaos: checking took %s", time.Since(checksBegan).Round(time.Millisecond)) }()
	if err := pool.QueryRow(ctx, `SELECT
			(SELECT count(*) FROM stepwise_event WHERE kind = 'run.takeover'),
			(SELECT count(*) FROM stepwise_event WHERE kind = 'lease.fenced'),
			(SELECT count(DISTINCT subject) FROM stepwise_event WHERE kind = 'op.transition' AND to_state = 'UNKNOWN_EXTERNAL')`).
		Scan(&res.Takeovers, &res.Fenced, &res.Unknown); err != nil {
		return res, fmt.Errorf("chaos: counting takeovers: %w", err)
	}
	if !report.Quiet {
		// Not at rest: name a few runs and operations that are not, as the evidence.
		rows, err := pool.Query(ctx, `
			(SELECT format('run %s %s (attempts %s, job %s %s, last error %s, cursor %s)', r.key, r.status, r.attempts,
			               r.river_job_id, coalesce(j.state::text, 'gone'), coalesce(r.last_error, '-'), left(c.cursor::text, 120))
			   FROM stepwise_run r JOIN stepwise_checkpoint c USING (key) LEFT JOIN river_job j ON j.id = r.river_job_id
			  WHERE r.status IN ('pending', 'running') AND (r.workflow <> 'chaos_sleeper' OR c.cursor->>'slept_at' IS NULL)
			  ORDER BY r.key LIMIT 5)
			UNION ALL
			(SELECT format('operation %s %s (attempts %s, last error %s)', operation_id, state, attempts, coalesce(last_error, '-'))
			   FROM stepwise_operation WHERE state NOT IN ('SUCCEEDED', 'FAILED_PERMANENT', 'MANUAL') ORDER BY operation_id LIMIT 5)`)
		if err == nil {
			res.Open, _ = pgx.CollectRows(rows, pgx.RowTo[string])
		}
	}
	res.Bank = bank.Stats()
	log := bank.Requests()
	res.Requests = len(log)
	// A worker that measured itself not scheduled long enough to lose its leases (a loaded
	// machine) was as good as paused: its takeovers are not needless.
	addStalls(report, &started, cfg.Lease-cfg.Lease/3)
	live := report.Liveness(cfg.takeoverWindow(), 0)
	// A run nobody held (fetched and not claimed; released and not recorded) is taken over
	// after two Leases: a stall that explains it lost at least one whole Lease in one piece.
	live.UnleasedPause = cfg.Lease
	if res.Needless, _, err = workflowtest.CountTakeovers(ctx, pool, live); err != nil {
		return res, err
	}
	res.Violations, err = workflowtest.CheckInvariants(ctx, pool, &workflowtest.CheckOpts{
		// Sleepers are unfinished by design: only the always-true invariants then.
		Quiet:    report.Quiet && cfg.Sleepers == 0,
		Requests: RequestLog(log),
		Grace:    cfg.ReconcileGrace,
		Liveness: live,
	})
	if err != nil {
		return res, err
	}
	res.Violations = append(res.Violations, retentionViolations...)
	for _, v := range res.Violations {
		switch v.Name {
		case workflowtest.NameConcurrentRequests:
			res.Concurrent++
		case workflowtest.NameSendAfterTerminal:
			res.AfterTerminal++
		case workflowtest.NameEarlyResend:
			res.EarlyResends++
		case workflowtest.NameEffectMismatch:
			res.EffectMismatches++
		case workflowtest.NameFailedEarly:
			res.FailedEarly++
		}
	}
	if cfg.Workload == "steps" {
		vs, err := stepsChecks(ctx, pool)
		if err != nil {
			return res, err
		}
		for _, v := range vs {
			if v.Name == nameNoEarlyWake {
				res.EarlyWakes++
			}
		}
		res.Violations = append(res.Violations, vs...)
		return res, nil
	}
	for _, d := range dates {
		inv, err := settlement.CheckInvariantsOpts(ctx, pool, bankfake.New(bankClient), plan, d, &settlement.InvariantOpts{Grace: cfg.ReconcileGrace})
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

// RequestLog turns the fake bank's request log into the form workflowtest.CheckInvariants
// checks.
func RequestLog(log []fakebank.Request) []workflowtest.Request {
	out := make([]workflowtest.Request, 0, len(log))
	for _, r := range log {
		out = append(out, workflowtest.Request{
			OperationID: r.OperationID, Amount: r.Amount,
			Arrived: r.Arrived, Decided: r.Decided, Ended: r.Ended(), Effect: r.Effect,
		})
	}
	return out
}

// sendingWorker returns the slot of the worker holding the most claimed payouts, or -1 (let
// the seeded source pick) when no worker holds any: the paused-dispatcher profile freezes the
// process that is sending, past its claim.
func sendingWorker(ctx context.Context, pool *pgxpool.Pool, ids []string, logf func(string, ...any)) int {
	rows, err := pool.Query(ctx, `SELECT leased_by, count(*) FROM stepwise_operation
		WHERE state = 'PROCESSING' AND leased_by IS NOT NULL GROUP BY leased_by ORDER BY count(*) DESC`)
	if err != nil {
		return -1
	}
	var by string
	var n int
	best, bestN := -1, 0
	_, _ = pgx.ForEachRow(rows, []any{&by, &n}, func() error {
		// The outbox leases as "outbox/<ID>#<random>", ID being the process's River ID.
		id, _, _ := strings.Cut(strings.TrimPrefix(by, "outbox/"), "#")
		for i, w := range ids {
			if w != "" && w == id && n > bestN {
				best, bestN = i, n
			}
		}
		return nil
	})
	if best >= 0 {
		logf("chaos: worker %d (%s) holds %d claimed payouts: freezing it", best, ids[best], bestN)
	}
	return best
}

// atRest is true when every run has finished and every operation is proven or MANUAL.
func atRest(ctx context.Context, pool *pgxpool.Pool) (bool, error) {
	var open int
	err := pool.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM stepwise_run WHERE status IN ('pending', 'running')) +
		(SELECT count(*) FROM stepwise_operation WHERE state NOT IN ('SUCCEEDED', 'FAILED_PERMANENT', 'MANUAL'))`).Scan(&open)
	return err == nil && open == 0, err
}

// workDone counts what the system has done, growing while it drains: steps committed, runs
// finished and operations settled. The wait for rest gives up only when it stands still.
func workDone(ctx context.Context, pool *pgxpool.Pool) (int64, error) {
	var n int64
	err := pool.QueryRow(ctx, `SELECT
		(SELECT coalesce(sum(steps), 0) FROM stepwise_checkpoint) +
		(SELECT count(*) FROM stepwise_run WHERE status NOT IN ('pending', 'running')) +
		(SELECT count(*) FROM stepwise_operation WHERE state IN ('SUCCEEDED', 'FAILED_PERMANENT', 'MANUAL'))`).Scan(&n)
	return n, err
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
// payout delivery, reconciliation, maintenance), or with CHAOS_WORKLOAD=steps the long and
// sleeper runs, until ctx ends. env carries DATABASE_URL, BANK_URL, CHAOS_WORKLOAD,
// CHAOS_LEASE, CHAOS_SHARDS, CHAOS_BATCH, CHAOS_SLICE, CHAOS_PAYOUT_TIMEOUT,
// CHAOS_RECONCILE_GRACE and CHAOS_PAYOUT_CONCURRENCY. Its River client ID is derived from its
// pid, so the harness knows which process held a run.
func WorkerMain(ctx context.Context, env map[string]string) error {
	lease, err := time.ParseDuration(env["CHAOS_LEASE"])
	if err != nil {
		return fmt.Errorf("CHAOS_LEASE: %w", err)
	}
	if env["CHAOS_WORKLOAD"] == "steps" {
		return stepsWorkerMain(ctx, env, lease)
	}
	// The send settings default to the classic suite's, so drivers that predate them (the
	// drills) start workers as before.
	or := func(name, def string) string {
		if v := env[name]; v != "" {
			return v
		}
		return def
	}
	timeout, err := time.ParseDuration(or("CHAOS_PAYOUT_TIMEOUT", "1s"))
	if err != nil {
		return fmt.Errorf("CHAOS_PAYOUT_TIMEOUT: %w", err)
	}
	grace, err := time.ParseDuration(or("CHAOS_RECONCILE_GRACE", "3s"))
	if err != nil {
		return fmt.Errorf("CHAOS_RECONCILE_GRACE: %w", err)
	}
	concurrency, err := strconv.Atoi(or("CHAOS_PAYOUT_CONCURRENCY", "32"))
	if err != nil {
		return fmt.Errorf("CHAOS_PAYOUT_CONCURRENCY: %w", err)
	}
	shards, err := strconv.Atoi(env["CHAOS_SHARDS"])
	if err != nil {
		return fmt.Errorf("CHAOS_SHARDS: %w", err)
	}
	batch, err := strconv.Atoi(env["CHAOS_BATCH"])
	if err != nil {
		return fmt.Errorf("CHAOS_BATCH: %w", err)
	}
	// The pool is kept tight on purpose: a busy pool must not make a live worker look dead,
	// and this is where the needless-takeover check would catch it (lease renewals once
	// queued behind the steps on this pool). It was pgx's default (4 connections on a small
	// machine); the client refuses fewer than its River workers + 3, so it is the client's
	// minimum plus one. serve sizes its pool for
	// throughput instead.
	pcfg, err := pgxpool.ParseConfig(env["DATABASE_URL"])
	if err != nil {
		return err
	}
	pcfg.MaxConns = chaosWorkerPoolConns(shards)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	svc, err := settlement.NewService(pool, &settlement.ServiceConfig{
		Bank:              bankfake.New(fakebank.NewClient(env["BANK_URL"], nil)),
		Plan:              settlement.Plan{Shards: shards},
		BatchSize:         batch,
		ID:                workerID(os.Getpid()),
		PayoutTimeout:     timeout,
		PayoutConcurrency: concurrency,
		PayoutLease:       2 * lease,
		// Short reconciliation so the suite comes to rest in seconds, not in the
		// production back-off's minutes; the grace still exceeds the payout timeout.
		ReconcileInterval: time.Second,
		ReconcileGrace:    grace,
		ReconcileBackoff:  func(int) time.Duration { return time.Second },
		// Likewise resends after a refusal (429, 503 before processing): the production
		// back-off doubles to 10 minutes, and a payout refused 8 times (SIGSTOPs count as lost
		// claims) sat RETRYABLE past the 3-minute wait for rest in a soak (seed 5153).
		PayoutRetryBackoff: func(attempt int) time.Duration { return min(time.Duration(attempt)*time.Second, 5*time.Second) },
		Workflow:           &workflow.Config{Lease: lease, Logger: logger},
		Logger:             logger,
	})
	if err != nil {
		return err
	}
	if err := svc.Start(ctx); err != nil {
		return err
	}
	// The killer hits River's leader too; takeover, delivery and reconciliation do not wait
	// for a new election: Start ran the maintenance loop of this process.
	go watchStalls(ctx, os.Stdout)
	fmt.Println("ready")
	<-ctx.Done()
	return svc.Stop(context.WithoutCancel(ctx), 5*time.Second)
}
