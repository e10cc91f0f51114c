package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/schollz/progressbar/v3"

	"github.com/stepwise-go/stepwise/cmd/sample-settlement/bankfake"
	"github.com/stepwise-go/stepwise/cmd/sample-settlement/cmdline"
	"github.com/stepwise-go/stepwise/cmd/sample-settlement/settlement"
	"github.com/stepwise-go/stepwise/schedule"
	"github.com/stepwise-go/stepwise/workflow"
	"github.com/stepwise-go/stepwise/workflowtest/fakebank"
	"github.com/stepwise-go/stepwise/workflowtest/pgserver"
)

func init() {
	prog.Register("demo", "zero set-up end-to-end run: Postgres, seed, bank with faults, settle, reconcile, report, invariants", runDemo)
}

// demoMarker is the comment the demo puts on the database it creates. The demo drops a
// database at start only if it carries this mark: it never drops data it did not create.
const demoMarker = "created by sample-settlement demo; dropped and recreated by the next demo"

// demoAppPrefix starts the application_name of the connection with which a demo holds its
// database: a second demo finds the first by it.
const demoAppPrefix = "sample-settlement demo of "

var dbNameRE = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

type demoFlags struct {
	dbURL   string
	dbName  string
	seed    seedFlags
	faults  bankfake.FaultFlags
	plan    planFlags
	workers int

	batchSize         int
	payoutConcurrency int
	bankSeed          uint64
	timeout           time.Duration
	verbose           bool
	consoleAddr       string
}

func runDemo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := prog.NewFlagSet("demo", "demo [--merchants N] [--transactions N] [--workers N] [--shards N] [fault flags]", stderr)
	var f demoFlags
	f.dbURL = os.Getenv("DATABASE_URL")
	fs.Var(secretURL{&f.dbURL}, "database-url", "use this database as is (default $DATABASE_URL; unset: a fresh database on a local or throwaway server)")
	fs.StringVar(&f.dbName, "db-name", "stepwise_demo", "name of the fresh database the demo creates when no URL is given")
	f.seed.register(fs)
	f.faults.Register(fs, true)
	f.plan.register(fs)
	fs.IntVar(&f.workers, "workers", 3, "River clients (workers) in this process, each working settle runs and delivering payouts")
	fs.IntVar(&f.batchSize, "batch-size", settlement.BatchSizeDefault, "merchants per settle step")
	fs.IntVar(&f.payoutConcurrency, "payout-concurrency", 32, "payouts each worker sends at once")
	fs.Uint64Var(&f.bankSeed, "bank-seed", 1, "seed of the bank's fault draws")
	fs.DurationVar(&f.timeout, "timeout", 5*time.Minute, "give up if the date is not at rest after this long")
	fs.BoolVar(&f.verbose, "v", false, "log River's and Stepwise's info messages")
	fs.StringVar(&f.consoleAddr, "console-addr", "127.0.0.1:0", "serve the operator's console here while the demo runs (loopback, read-only unless CONSOLE_USER/CONSOLE_PASSWORD); empty: no console")
	if err := cmdline.ParseFlags(fs, args, false); err != nil {
		return err
	}
	seedCfg, err := f.seed.config()
	if err != nil {
		return err
	}
	mix, err := f.faults.Mix()
	if err != nil {
		return cmdline.UsageError("%v", err)
	}
	plan, err := f.plan.plan()
	if err != nil {
		return err
	}
	if f.workers < 1 || f.workers > 32 {
		return cmdline.UsageError("--workers %d: want 1 to 32", f.workers)
	}
	if err := cmdline.CheckInt("batch-size", f.batchSize, 1, maxBatchSize); err != nil {
		return err
	}
	if err := cmdline.CheckInt("payout-concurrency", f.payoutConcurrency, 1, maxConcurrency); err != nil {
		return err
	}
	if err := cmdline.CheckDuration("timeout", f.timeout, time.Second, 24*time.Hour); err != nil {
		return err
	}
	if !dbNameRE.MatchString(f.dbName) {
		return cmdline.UsageError("--db-name %q: want lower-case letters, digits and '_', such as stepwise_demo", f.dbName)
	}
	return demo(ctx, &f, seedCfg, mix, plan, stdout, stderr)
}

func demo(ctx context.Context, f *demoFlags, seedCfg *settlement.SeedConfig, mix fakebank.Mix, plan settlement.Plan, stdout, stderr io.Writer) (err error) {
	start := time.Now()
	step := func(format string, args ...any) {
		fmt.Fprintf(stdout, "[%5.1fs] %s\n", time.Since(start).Seconds(), fmt.Sprintf(format, args...))
	}
	fmt.Fprintln(stdout, "Stepwise sample settlement: demo")

	// 1. A database: the one the user named, or a fresh one of our own.
	dbURL, cleanup, err := demoDatabase(ctx, f, step)
	if err != nil {
		return err
	}
	defer cleanup()
	pool, err := openPool(ctx, dbURL, 10)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := settlement.Migrate(ctx, pool); err != nil {
		return err
	}
	step("migrated: River, Stepwise and the settlement tables")

	// 2. A realistic data set, the same every time.
	res, err := settlement.Seed(ctx, pool, seedCfg)
	switch {
	case errors.Is(err, settlement.ErrAlreadySeeded):
		step("%s was seeded before in this database; settling the data that is there", f.seed.date)
	case err != nil:
		return err
	default:
		step("seeded %s: %s merchants, %s card transactions (%s)", f.seed.date, thousands(seedCfg.Merchants), thousands(res.Transactions), fmtTotals(res.Totals))
	}

	// 3. The bank, in this process, misbehaving mildly.
	bank := fakebank.New(&fakebank.Config{Seed: f.bankSeed, Faults: mix})
	if err := bank.Start(); err != nil {
		return err
	}
	defer bank.Close()
	step("bank: %s with faults refuse %.1f%%, 5xx after paying %.1f%%, connection dropped after paying %.1f%%",
		bank.URL(), 100*mix.RefuseBeforeApply, 100*mix.Error5xxAfterApply, 100*mix.DropAfterApply)

	// 4. Several workers: River clients of their own, each with its own pool, as separate
	// processes would have.
	logger := newLogger(stderr, f.verbose)
	stopTracing, riverMiddleware, err := setupTracing(ctx, stderr)
	if err != nil {
		return err
	}
	defer stopTracing()
	var services []*settlement.Service
	runCtx, cancelRun := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelRun()
	defer func() {
		for _, svc := range services {
			if stopErr := svc.Stop(context.Background(), 20*time.Second); stopErr != nil && err == nil {
				err = stopErr
			}
			svc.Pool.Close()
		}
	}()
	for i := range f.workers {
		wpool, err := openPool(ctx, dbURL, settlement.PoolConnsFor(plan.Shards))
		if err != nil {
			return err
		}
		svc, err := settlement.NewService(wpool, &settlement.ServiceConfig{
			Bank: bankfake.Dial(bank.URL(), 5*time.Second), Plan: plan, BatchSize: f.batchSize,
			PayoutConcurrency: f.payoutConcurrency, ID: fmt.Sprintf("demo-worker-%d", i+1), Logger: logger, RiverMiddleware: riverMiddleware,
			FetchPollInterval: 200 * time.Millisecond, PayoutsAtRestTimeout: settlement.PayoutsAtRestTimeoutDefault,
		})
		if err != nil {
			wpool.Close()
			return err
		}
		if err := svc.Start(runCtx); err != nil {
			wpool.Close()
			return err
		}
		services = append(services, svc)
	}
	step("workers: %d River clients, each working up to %d settle runs and sending %d payouts at once",
		f.workers, plan.Shards, f.payoutConcurrency)
	if f.consoleAddr != "" {
		stopConsole, err := serveDemoConsole(pool, services[0], logger, f.consoleAddr, step)
		if err != nil {
			return err
		}
		defer stopConsole()
	}

	// 5. Settle the date: one run per shard, keyed like the daily schedule's.
	date, _ := settlement.ParseDate(f.seed.date)
	expected, err := settlement.ExpectedSettlements(ctx, pool, date)
	if err != nil {
		return err
	}
	runs, _, err := services[0].StartDate(ctx, date)
	if err != nil {
		return err
	}
	step("settling %s: %d runs (%s ... %s), %s settlements to make", f.seed.date, len(runs), runs[0].Key, runs[len(runs)-1].Key, thousands(expected))

	bar := newBar(stderr, expected)
	var settledAt time.Duration
	var waitedFor int
	waitCtx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	p, waitErr := settlement.WaitAtRest(waitCtx, pool, plan, date, 200*time.Millisecond, func(p *settlement.Progress) {
		// A run that settled its last batch waits for its payouts (WaitForOperations).
		if settledAt == 0 && p.Runs[string(workflow.RunStatusSucceeded)]+p.Runs[string(workflow.RunStatusFailed)]+p.Waiting == plan.Shards {
			settledAt = time.Since(start)
			waitedFor = p.Settlements - p.Operations["SUCCEEDED"] - p.Operations["FAILED_PERMANENT"]
		}
		bar.update(p)
	})
	bar.finish()
	if waitErr != nil && ctx.Err() != nil {
		return fmt.Errorf("interrupted while settling %s (runs %s, payouts %s); stopping the workers", f.seed.date, counts(p.Runs), counts(p.Operations))
	}
	if waitErr != nil {
		return fmt.Errorf("%s did not come to rest within --timeout %s (runs %s, payouts %s): %w", f.seed.date, f.timeout, counts(p.Runs), counts(p.Operations), waitErr)
	}
	step("runs settled the date at %.1fs: %s settlements, each with 2 ledger entries and a payout; then the date waited for %s payouts to be at rest, holding no worker",
		settledAt.Seconds(), thousands(p.Settlements), thousands(max(waitedFor, 0)))
	step("payouts at rest: %s", counts(p.Operations))
	day, err := settlement.ReadDay(ctx, pool, date)
	if err != nil {
		return err
	}
	if day == nil || day.ClosedAt == nil {
		return fmt.Errorf("%s is at rest but not closed (%s): a payout waits for a person (MANUAL)", f.seed.date, dayLine(day))
	}
	step("runs finished at %.1fs: %s; %s closed: every payout proven, the day's report written, its reconciliation run started",
		time.Since(start).Seconds(), counts(p.Runs), f.seed.date)

	// The bank's statement arrives (statement-arrived, or serve's POST /ops/statement): the
	// reconciliation run waiting for it wakes and compares the ledger with the statement.
	if err := settlement.StatementArrived(ctx, pool, date, ""); err != nil {
		return err
	}
	step("statement signal sent to %s: it wakes and reconciles each currency in a run of its own", settlement.ReconcileRunKey(date))
	for day.ReconciledAt == nil {
		select {
		case <-waitCtx.Done():
			return fmt.Errorf("%s was not reconciled within --timeout %s: %s", f.seed.date, f.timeout, dayLine(day))
		case <-time.After(100 * time.Millisecond):
		}
		if day, err = settlement.ReadDay(ctx, pool, date); err != nil {
			return err
		}
	}
	verdict := "match"
	if !day.Match {
		verdict = fmt.Sprintf("%d differences", day.Differences)
	}
	var currencyRuns int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM stepwise_run WHERE parent_key = $1`, settlement.ReconcileRunKey(date)).Scan(&currencyRuns); err != nil {
		return err
	}
	step("reconciled at %.1fs with statement %q: %s (one child run per currency, %d, waited for with WaitForChildren)",
		time.Since(start).Seconds(), day.StatementID, verdict, currencyRuns)

	// 6. What the reconciler did, from the audit trail.
	if err := printReconciled(ctx, pool, stdout); err != nil {
		return err
	}

	// 7. Report and invariants.
	client := bankfake.Dial(bank.URL(), 10*time.Second)
	rep, err := settlement.BuildReport(ctx, pool, client, plan, date)
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout)
	printReport(stdout, rep)
	inv, err := settlement.CheckInvariants(ctx, pool, client, plan, date)
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout)
	printInvariants(stdout, inv)
	fmt.Fprintln(stdout)

	var problems []string
	if err := inv.Err(); err != nil {
		problems = append(problems, err.Error())
	}
	if !rep.TotalsMatch() {
		problems = append(problems, "totals do not match the bank's statement")
	}
	if rep.DuplicatePayouts != 0 {
		problems = append(problems, fmt.Sprintf("%d duplicate payouts", rep.DuplicatePayouts))
	}
	if day.ReconciledAt == nil || !day.Match {
		problems = append(problems, "the reconciliation run found differences with the statement")
	}
	if rep.Batch != schedule.BatchCompleted {
		problems = append(problems, fmt.Sprintf("batch is %s, not COMPLETED", rep.Batch))
	}
	if len(problems) > 0 {
		return fmt.Errorf("demo failed after %.1fs: %s", time.Since(start).Seconds(), strings.Join(problems, "; "))
	}
	fmt.Fprintf(stdout, "demo finished in %.1fs: batch COMPLETED and closed, totals match the bank's statement, 0 duplicate payouts, all invariants hold\n",
		time.Since(start).Seconds())
	return nil
}

// demoDatabase returns the URL of the database the demo works in and what to do at exit.
// A URL from DATABASE_URL or --database-url is used as is: the user chose it, and the demo
// drops nothing there. Otherwise the demo finds a server (pgserver: local, else a throwaway
// cluster it removes at exit) and creates a fresh database of its own, dropping the previous
// demo's, recognized by its comment, and nothing else.
func demoDatabase(ctx context.Context, f *demoFlags, step func(string, ...any)) (string, func(), error) {
	if f.dbURL != "" {
		if _, err := pgxpool.ParseConfig(f.dbURL); err != nil {
			return "", nil, cmdline.UsageError("--database-url / DATABASE_URL is not a PostgreSQL URL such as postgres://user@host:5432/db")
		}
		step("database: the one DATABASE_URL names (used as is; the demo drops nothing)")
		return f.dbURL, func() {}, nil
	}
	srv, err := pgserver.Find(ctx, &pgserver.Opts{EnvVars: []string{}})
	if err != nil {
		return "", nil, err
	}
	cleanup := func() {
		if err := srv.Close(); err != nil {
			fmt.Fprintf(os.Stderr, "removing the throwaway PostgreSQL cluster: %v\n", err)
		}
	}
	adminCfg, err := pgx.ParseConfig(srv.URL)
	if err != nil {
		cleanup()
		return "", nil, fmt.Errorf("the PostgreSQL server's URL (%s): %w", srv.Source, err)
	}
	host, _ := os.Hostname()
	// The name another demo's refusal quotes (at most 63 bytes are kept by the server).
	adminCfg.RuntimeParams["application_name"] = fmt.Sprintf("%s%s pid %d on %s", demoAppPrefix, f.dbName, os.Getpid(), host)
	admin, err := pgx.ConnectConfig(ctx, adminCfg)
	if err != nil {
		cleanup()
		return "", nil, fmt.Errorf("connecting to the PostgreSQL server (%s): %w", srv.Source, err)
	}
	keep := false
	defer func() {
		if !keep {
			admin.Close(context.WithoutCancel(ctx))
		}
	}()
	// The demo's database is dropped and made again by the next demo. Guards against: a
	// second demo on the same server dropping the first one's database under it (the first
	// then fails mid-settle with "database does not exist"). This connection holds a
	// session advisory lock on the database's name until the demo ends, or until the
	// process dies and the server ends the session; a second demo that cannot take it
	// refuses and names the first.
	var locked bool
	if err := admin.QueryRow(ctx, `SELECT pg_try_advisory_lock(hashtext('sample-settlement demo'), hashtext($1))`, f.dbName).Scan(&locked); err != nil {
		cleanup()
		return "", nil, fmt.Errorf("taking the demo's lock on %s: %w", f.dbName, err)
	}
	if !locked {
		var other string
		if err := admin.QueryRow(ctx, `SELECT coalesce(min(application_name || ', started ' || to_char(backend_start, 'HH24:MI:SS TZ')), 'another process')
			FROM pg_stat_activity WHERE application_name LIKE $1 AND pid <> pg_backend_pid()`, demoAppPrefix+f.dbName+" %").Scan(&other); err != nil {
			other = "another process"
		}
		cleanup()
		return "", nil, fmt.Errorf("another demo is running on this server with database %s (%s): wait for it to finish, or run this one with --db-name %s_2",
			f.dbName, other, f.dbName)
	}
	name := pgx.Identifier{f.dbName}.Sanitize()
	var comment *string
	var exists bool
	err = admin.QueryRow(ctx, `SELECT true, shobj_description(oid, 'pg_database') FROM pg_database WHERE datname = $1`, f.dbName).Scan(&exists, &comment)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		cleanup()
		return "", nil, fmt.Errorf("looking for database %s: %w", f.dbName, err)
	}
	if exists {
		if comment == nil || *comment != demoMarker {
			cleanup()
			return "", nil, fmt.Errorf("database %s exists and was not created by the demo; the demo will not drop it: pass --db-name another_name, or set DATABASE_URL to use it as is", f.dbName)
		}
		if _, err := admin.Exec(ctx, "DROP DATABASE "+name+" WITH (FORCE)"); err != nil {
			cleanup()
			return "", nil, fmt.Errorf("dropping the previous demo's database %s: %w", f.dbName, err)
		}
	}
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		cleanup()
		return "", nil, fmt.Errorf("creating database %s: %w", f.dbName, err)
	}
	if _, err := admin.Exec(ctx, "COMMENT ON DATABASE "+name+" IS '"+demoMarker+"'"); err != nil {
		cleanup()
		return "", nil, fmt.Errorf("marking database %s as the demo's: %w", f.dbName, err)
	}
	dbURL, err := withDatabase(srv.URL, f.dbName)
	if err != nil {
		cleanup()
		return "", nil, err
	}
	keep = true
	serverCleanup := cleanup
	cleanup = func() {
		admin.Close(context.Background()) // releases the lock
		serverCleanup()
	}
	if strings.HasPrefix(srv.Source, "throwaway:") {
		step("database: fresh %s on a throwaway PostgreSQL cluster (removed when the demo exits)", f.dbName)
	} else {
		step("database: fresh %s on %s (kept after the demo; the next demo replaces it)", f.dbName, strings.TrimPrefix(srv.Source, "local:"))
	}
	return dbURL, cleanup, nil
}

// thousands renders n with thousands separators.
func thousands(n int) string {
	s := fmt.Sprint(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

func withDatabase(serverURL, name string) (string, error) {
	u, err := url.Parse(serverURL)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return "", fmt.Errorf("the server's URL is not a postgres:// URL; set DATABASE_URL to the database to use")
	}
	u.Path = "/" + name
	u.RawPath = ""
	return u.String(), nil
}

// printReconciled tells, from the audit trail, what happened to payouts whose outcome was
// unknown, and shows the trail of one of them.
func printReconciled(ctx context.Context, pool *pgxpool.Pool, w io.Writer) error {
	rows, err := pool.Query(ctx, `SELECT from_state, to_state, count(*)::int FROM stepwise_event
		WHERE kind = 'op.transition' AND from_state IN ('UNKNOWN_EXTERNAL', 'PROCESSING') AND to_state IN ('UNKNOWN_EXTERNAL', 'RETRYABLE', 'SUCCEEDED', 'FAILED_PERMANENT', 'MANUAL')
		GROUP BY from_state, to_state ORDER BY from_state DESC, to_state`)
	if err != nil {
		return fmt.Errorf("reading the audit trail: %w", err)
	}
	moves := map[string]int{}
	var from, to string
	var n int
	if _, err := pgx.ForEachRow(rows, []any{&from, &to, &n}, func() error { moves[from+" → "+to] = n; return nil }); err != nil {
		return fmt.Errorf("reading the audit trail: %w", err)
	}
	fmt.Fprintf(w, "         sends: %d succeeded, %d declined, %d refused before processing (resent), %d unknown (5xx or dropped after the bank paid)\n",
		moves["PROCESSING → SUCCEEDED"], moves["PROCESSING → FAILED_PERMANENT"], moves["PROCESSING → RETRYABLE"], moves["PROCESSING → UNKNOWN_EXTERNAL"])
	fmt.Fprintf(w, "         reconciler: %d unknown payouts found paid at the bank → SUCCEEDED, %d found declined, %d not found → resent under the same id, %d → MANUAL\n",
		moves["UNKNOWN_EXTERNAL → SUCCEEDED"], moves["UNKNOWN_EXTERNAL → FAILED_PERMANENT"], moves["UNKNOWN_EXTERNAL → RETRYABLE"], moves["UNKNOWN_EXTERNAL → MANUAL"])

	// The life of one payout that went through UNKNOWN_EXTERNAL, for the walkthrough.
	var subject string
	err = pool.QueryRow(ctx, `SELECT subject FROM stepwise_event WHERE kind = 'op.transition' AND from_state = 'UNKNOWN_EXTERNAL'
		AND to_state = 'SUCCEEDED' ORDER BY id LIMIT 1`).Scan(&subject)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading the audit trail: %w", err)
	}
	var key string
	if err := pool.QueryRow(ctx, `SELECT business_key FROM stepwise_operation WHERE 'op:' || operation_id = $1`, subject).Scan(&key); err != nil {
		return fmt.Errorf("reading the audit trail: %w", err)
	}
	fmt.Fprintf(w, "         one of them, payout %s (%s), from the audit trail:\n", strings.TrimPrefix(subject, "op:"), key)
	rows, err = pool.Query(ctx, `SELECT at, coalesce(from_state, ''), coalesce(to_state, ''), coalesce(actor, ''), coalesce(detail::text, '')
		FROM stepwise_event WHERE subject = $1 ORDER BY id`, subject)
	if err != nil {
		return fmt.Errorf("reading the audit trail: %w", err)
	}
	var at time.Time
	var actor, detail string
	var first time.Time
	_, err = pgx.ForEachRow(rows, []any{&at, &from, &to, &actor, &detail}, func() error {
		if first.IsZero() {
			first = at
		}
		if len(detail) > 110 {
			detail = detail[:110] + "…"
		}
		fmt.Fprintf(w, "           +%6.3fs  %-16s → %-16s by %-28s %s\n", at.Sub(first).Seconds(), from, to, actor, detail)
		return nil
	})
	if err != nil {
		return fmt.Errorf("reading the audit trail: %w", err)
	}
	return nil
}

// progressBar shows the payouts coming to rest: a bar on a terminal, a line every few
// seconds otherwise (CI logs), never on stdout, which carries the report.
type progressBar struct {
	bar      *progressbar.ProgressBar
	w        io.Writer
	total    int
	lastLine time.Time
}

func newBar(w io.Writer, total int) *progressBar {
	pb := &progressBar{w: w, total: total}
	if f, ok := w.(*os.File); ok {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			pb.bar = progressbar.NewOptions(total, progressbar.OptionSetWriter(w), progressbar.OptionSetWidth(30),
				progressbar.OptionShowCount(), progressbar.OptionSetDescription("payouts at rest"),
				progressbar.OptionThrottle(100*time.Millisecond), progressbar.OptionClearOnFinish())
		}
	}
	return pb
}

func (pb *progressBar) update(p *settlement.Progress) {
	desc := fmt.Sprintf("settled %d/%d · paid %d · unknown %d · retrying %d", p.Settlements, pb.total,
		p.Operations["SUCCEEDED"], p.Operations["UNKNOWN_EXTERNAL"], p.Operations["RETRYABLE"])
	if pb.bar != nil {
		pb.bar.Describe(desc)
		_ = pb.bar.Set(p.Settled())
		return
	}
	if time.Since(pb.lastLine) >= 2*time.Second {
		pb.lastLine = time.Now()
		fmt.Fprintf(pb.w, "  %s · at rest %d\n", desc, p.Settled())
	}
}

func (pb *progressBar) finish() {
	if pb.bar != nil {
		_ = pb.bar.Finish()
	}
}
