package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"riverqueue.com/riverui"

	"github.com/stepwise-go/stepwise/cmd/sample-settlement/cmdline"
	"github.com/stepwise-go/stepwise/cmd/sample-settlement/settlement"
	"github.com/stepwise-go/stepwise/console"
	"github.com/stepwise-go/stepwise/workflow"
)

func init() {
	prog.Register("serve", "run workers, scheduler, reconciler and payout delivery until SIGINT/SIGTERM", runServe)
}

// serveFlags are serve's flags.
type serveFlags struct {
	db   dbFlags
	plan planFlags
	bank bankFlags

	addr              string
	id                string
	schedule          bool
	migrate           bool
	settleWorkers     int
	batchSize         int
	payoutConcurrency int
	payoutTimeout     time.Duration
	lease             time.Duration
	reconcileEvery    time.Duration
	reconcileGrace    time.Duration
	shutdownTimeout   time.Duration
	metricsInterval   time.Duration
	dbMaxConns        int
	publicWithoutAuth bool
	behindTLS         bool
	allowedHosts      hostList
	verbose           bool
}

// hostList is --allowed-host: repeatable, each a comma-separated list.
type hostList []string

func (h *hostList) String() string { return strings.Join(*h, ",") }

func (h *hostList) Set(v string) error {
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			*h = append(*h, s)
		}
	}
	return nil
}

func runServe(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := prog.NewFlagSet("serve", "serve [--addr 127.0.0.1:8080] [--shards N] [--bank-url URL] ...", stderr)
	var f serveFlags
	f.db.register(fs)
	f.plan.register(fs)
	f.bank.register(fs)
	fs.StringVar(&f.addr, "addr", envOr("SERVE_ADDR", "127.0.0.1:8080"), "HTTP address of /metrics, /healthz and /riverui/; loopback unless you mean it ($SERVE_ADDR)")
	fs.StringVar(&f.id, "id", "", "name of this process in River, leases and audit events (default host/pid)")
	fs.BoolVar(&f.schedule, "scheduler", true, "tick the daily settlement schedule (every process may: the tick is safe to run twice)")
	fs.BoolVar(&f.migrate, "migrate", true, "bring the schema up before serving")
	fs.IntVar(&f.settleWorkers, "settle-workers", 0, "settle runs worked at once by this process (default: --shards)")
	fs.IntVar(&f.batchSize, "batch-size", settlement.BatchSizeDefault, "merchants per settle step")
	fs.IntVar(&f.payoutConcurrency, "payout-concurrency", 32, "payouts sent at once by this process")
	fs.DurationVar(&f.payoutTimeout, "payout-timeout", 5*time.Second, "timeout of one payment call (a timeout is UNKNOWN_EXTERNAL)")
	fs.DurationVar(&f.lease, "lease", 0, "lease of a settle run; a killed process's runs are taken over after about this (default 30s)")
	fs.DurationVar(&f.reconcileEvery, "reconcile-interval", 5*time.Second, "how often unknown payouts are looked up at the bank")
	fs.DurationVar(&f.reconcileGrace, "reconcile-grace", time.Minute, "how long after a send the bank's \"not found\" is believed and the payout resent (must exceed --payout-timeout)")
	fs.DurationVar(&f.shutdownTimeout, "shutdown-timeout", 20*time.Second, "on SIGTERM, how long in-flight steps and sends may finish before they are cancelled; keep it above --payout-timeout and below the orchestrator's kill deadline (e.g. terminationGracePeriodSeconds) by a few seconds")
	fs.DurationVar(&f.metricsInterval, "metrics-interval", 5*time.Second, "how often the metrics (database gauges included) are gathered in the background; a scrape serves the last gather")
	fs.IntVar(&f.dbMaxConns, "db-max-conns", 0, "database connections this process may open (default: 2 × --settle-workers + 32)")
	fs.BoolVar(&f.publicWithoutAuth, "public-without-auth", false, "allow an --addr beyond loopback without RIVERUI_USER/RIVERUI_PASSWORD (only behind a proxy that authenticates)")
	fs.BoolVar(&f.behindTLS, "behind-tls", false, "the operator surface is reached over TLS terminated in front of this process: allows credentials (CONSOLE_USERS, CONSOLE_USER, RIVERUI_USER) with an --addr beyond loopback, which is otherwise refused (they would cross the network in clear text)")
	_ = f.allowedHosts.Set(os.Getenv("SERVE_ALLOWED_HOSTS"))
	fs.Var(&f.allowedHosts, "allowed-host", "a Host name (with or without :port) the console, River UI and /metrics answer to besides localhost, 127.0.0.1 and [::1], e.g. the proxy's name or the address Prometheus scrapes; repeatable, or comma-separated ($SERVE_ALLOWED_HOSTS). Any other Host gets 421 (DNS rebinding)")
	fs.BoolVar(&f.verbose, "v", false, "log River's and Stepwise's info messages")
	if err := cmdline.ParseFlags(fs, args, false); err != nil {
		return err
	}
	if err := f.check(); err != nil {
		return err
	}
	plan, err := f.plan.plan()
	if err != nil {
		return err
	}
	bank, err := f.bank.client(f.payoutTimeout)
	if err != nil {
		return err
	}
	host, _, err := net.SplitHostPort(f.addr)
	if err != nil {
		return cmdline.UsageError("--addr %q: want host:port, e.g. 127.0.0.1:8080", f.addr)
	}
	for _, h := range f.allowedHosts {
		if strings.ContainsAny(h, "/*@ \t") {
			return cmdline.UsageError("--allowed-host %q: want a host name or address as browsers send it in Host, with or without a port (e.g. ops.example.com or ops.example.com:8443)", h)
		}
	}
	logger := newLogger(stderr, f.verbose)
	// Credentials are checked before the database is touched: a half-set pair exits 2 at once.
	auth, err := operatorAuthFromEnv(logger)
	if err != nil {
		return err
	}
	stopTracing, riverMiddleware, err := setupTracing(ctx, stderr)
	if err != nil {
		return err
	}
	defer stopTracing()
	hosts := append([]string(nil), f.allowedHosts...)
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		// Basic-auth credentials over plain HTTP beyond this host can be read by anyone on
		// the path; every browser request repeats them.
		if (auth.Console != nil || auth.RiverUser != "") && !f.behindTLS {
			return cmdline.UsageError("--addr %s is beyond loopback and credentials are configured: they would cross the network in clear text with every request; terminate TLS in front of serve (a proxy) and pass --behind-tls, or bind 127.0.0.1 and reach it through ssh -L", f.addr)
		}
		// The address serve is bound to is a name this surface answers to (an address is
		// never a rebinding page's origin); 0.0.0.0 or :: name no host.
		if host != "" && (ip == nil || !ip.IsUnspecified()) {
			hosts = append(hosts, host)
		}
		// Guards against publishing River UI (payment jobs' arguments and errors) and the
		// metrics to a network by a mistyped --addr: without credentials that takes an
		// explicit flag.
		if auth.RiverUser == "" && !f.publicWithoutAuth {
			return cmdline.UsageError("--addr %s is beyond loopback and RIVERUI_USER/RIVERUI_PASSWORD are not set: River UI and /metrics would be open to the network; set both, bind 127.0.0.1, or pass --public-without-auth if a proxy in front authenticates", f.addr)
		}
		logger.Warn("serving beyond loopback: /metrics, /healthz and /readyz are open to anyone who can reach " + f.addr)
	}

	settleWorkers := f.settleWorkers
	if settleWorkers == 0 {
		settleWorkers = plan.Shards
	}
	maxConns := f.dbMaxConns
	if maxConns == 0 {
		maxConns = poolSizeFor(settleWorkers)
	}
	pool, err := f.db.connectSized(ctx, int32(maxConns))
	if err != nil {
		return err
	}
	defer pool.Close()
	if f.migrate {
		if err := settlement.Migrate(ctx, pool); err != nil {
			return err
		}
	} else {
		// Without --migrate the schema must already be what this binary needs: an older
		// one lacks tables or columns the steps write (a newer one was refused above).
		if err := requireMigrated(ctx, pool); err != nil {
			return fmt.Errorf("%w, or serve with --migrate", err)
		}
	}
	var wcfg *workflow.Config
	if f.lease > 0 {
		wcfg = &workflow.Config{Lease: f.lease, Logger: logger}
	}
	svc, err := settlement.NewService(pool, &settlement.ServiceConfig{
		Bank: bank, Plan: plan, BatchSize: f.batchSize, SettleWorkers: settleWorkers, Schedule: f.schedule,
		PayoutConcurrency: f.payoutConcurrency, PayoutTimeout: f.payoutTimeout, Workflow: wcfg, ID: f.id, Logger: logger, RiverMiddleware: riverMiddleware,
		ReconcileInterval: f.reconcileEvery, ReconcileGrace: f.reconcileGrace, PayoutsAtRestTimeout: settlement.PayoutsAtRestTimeoutDefault,
	})
	if err != nil {
		return err
	}

	// River's work is stopped through Stop below, not by cancelling its start context, so
	// that in-flight steps get their chance to finish.
	runCtx, cancelRun := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelRun()
	rd := &readiness{}
	go rd.watchDB(runCtx, pool, 2*time.Second, logger)
	handler, err := serveHandler(runCtx, svc, rd, serveOps{metricsInterval: f.metricsInterval, auth: auth, hosts: hosts}, logger)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", f.addr)
	if err != nil {
		return fmt.Errorf("listening on --addr %s: %w", f.addr, err)
	}
	srv := console.NewServer(handler)
	httpDone := make(chan error, 1)
	go func() { httpDone <- srv.Serve(ln) }()

	if err := svc.Start(runCtx); err != nil {
		_ = srv.Close()
		return err
	}
	// Start also ran the maintenance loop of this process: takeover, delivery retries,
	// reconciliation and schedule ticks from every process, not only River's leader (when
	// the process that dies is the leader, the leader-run jobs would wait for a new
	// election; measured: ~17s).
	rd.started.Store(true)
	fmt.Fprintf(stdout, "serving: http://%s/metrics /healthz /readyz /riverui/ /console/; %d shards, schedule %q in %s (on: %t), bank %s, %d database connections at most\n",
		ln.Addr(), plan.Shards, plan.Spec, plan.Zone, f.schedule, cmdline.RedactURL(f.bank.url), maxConns)
	consoleFrom := "none (read-only, loopback)"
	if auth.Console != nil {
		consoleFrom = auth.ConsoleFrom
	}
	fmt.Fprintf(stdout, "operators: console %s; River UI %s; hosts answered besides loopback: %s\n",
		consoleFrom, map[bool]string{true: "RIVERUI_USER", false: "none (read-only, loopback)"}[auth.RiverUser != ""], orNone(hosts))

	select {
	case <-ctx.Done():
	case err := <-httpDone:
		_ = svc.Stop(context.Background(), f.shutdownTimeout)
		return fmt.Errorf("HTTP server: %w", err)
	}
	return drain(svc, srv, rd, f.shutdownTimeout, stdout, stderr)
}

// drain shuts the process down after the first SIGINT/SIGTERM, in this order:
//
//  1. /readyz answers 503, so a load balancer or orchestrator stops routing to us;
//  2. the client's Stop (settlement.Service.Stop) quiesces the workflow engine and the outbox: no new step and no new send begins here
//     (guards against a shutdown that keeps working until it is killed); the step in flight
//     commits and releases its run's lease in the same commit, and the run is handed back to
//     River at once, so another process resumes it now, not after the lease lapses;
//     operations claimed but not sent go back to RETRYABLE as certainly not sent;
//  3. River stops fetching and waits for the jobs in flight, up to shutdownTimeout;
//  4. past shutdownTimeout, what is still in flight is cancelled (River's StopAndCancel):
//     a step rolls back (redone elsewhere from its committed cursor), a send cut off ends
//     UNKNOWN_EXTERNAL for the reconciler. That phase is bounded by the client's
//     StopTimeout (30s) and is normally instant.
//
// A second signal exits at once with status 1, whatever is in flight: leases then lapse
// and sends in flight are settled by the reconciler, as after a crash.
//
// An orchestrator's kill deadline (Kubernetes' terminationGracePeriodSeconds, systemd's
// TimeoutStopSec) must exceed shutdownTimeout + a few seconds (up to 30s more if steps
// ignore their cancelled context), or its
// SIGKILL lands during the drain and turns it into a crash: safe, but every send in flight
// becomes UNKNOWN_EXTERNAL and every held lease is waited out. --shutdown-timeout should in
// turn exceed --payout-timeout, so that a send in flight can finish.
func drain(svc *settlement.Service, srv *http.Server, rd *readiness, shutdownTimeout time.Duration, stdout, stderr io.Writer) error {
	start := time.Now()
	again := make(chan os.Signal, 1)
	signal.Notify(again, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(again)
	go func() {
		if _, ok := <-again; ok {
			fmt.Fprintln(stderr, "sample-settlement serve: second signal: exiting now without draining; leases lapse and sends in flight are left to the reconciler")
			os.Exit(1)
		}
	}()

	rd.stopping.Store(true)
	fmt.Fprintf(stdout, "shutting down: no new steps or sends; finishing those in flight (up to %s; a second signal exits at once)\n", shutdownTimeout)
	err := svc.Stop(context.Background(), shutdownTimeout)
	shutCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(shutCtx)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "stopped after %s\n", time.Since(start).Round(time.Millisecond))
	return nil
}

// check refuses out-of-range flags with the flag, the range and so the fix.
func (f *serveFlags) check() error {
	for _, c := range []error{
		cmdline.CheckInt("settle-workers", f.settleWorkers, 0, maxWorkers),
		cmdline.CheckInt("batch-size", f.batchSize, 1, maxBatchSize),
		cmdline.CheckInt("payout-concurrency", f.payoutConcurrency, 1, maxConcurrency),
		cmdline.CheckInt("db-max-conns", f.dbMaxConns, 0, 10_000),
		cmdline.CheckDuration("payout-timeout", f.payoutTimeout, 10*time.Millisecond, 10*time.Minute),
		cmdline.CheckDuration("reconcile-interval", f.reconcileEvery, 10*time.Millisecond, 24*time.Hour),
		cmdline.CheckDuration("reconcile-grace", f.reconcileGrace, 10*time.Millisecond, 7*24*time.Hour),
		cmdline.CheckDuration("shutdown-timeout", f.shutdownTimeout, 0, time.Hour),
		cmdline.CheckDuration("metrics-interval", f.metricsInterval, 100*time.Millisecond, time.Hour),
	} {
		if c != nil {
			return c
		}
	}
	// 0 means workflow's default (30s); anything else must leave room for heartbeats.
	if f.lease != 0 {
		if err := cmdline.CheckDuration("lease", f.lease, 300*time.Millisecond, 24*time.Hour); err != nil {
			return fmt.Errorf("%w, or 0 for the default (30s)", err)
		}
	}
	if f.reconcileGrace <= f.payoutTimeout {
		return cmdline.UsageError("--reconcile-grace %s must exceed --payout-timeout %s: a payout still in flight could land after a not-found lookup and its resend", f.reconcileGrace, f.payoutTimeout)
	}
	return nil
}

// poolSizeFor is the connection cap of a serve process working settleWorkers runs at once.
//
// Guards against: pgx's default (4 connections on a small machine) starving the lease
// heartbeats. Each settle run holds a connection for its step's transaction and needs a
// second for the heartbeat that renews its lease meanwhile; River's default queue (4
// workers: maintenance, ticks), its producers, notifier and leader election, payout delivery
// (claim and record, on connections of their own), the reconciler and the background metrics
// gather and readiness ping need the rest. pgxpool opens connections only when needed, so
// the cap costs nothing when idle.
func poolSizeFor(settleWorkers int) int {
	return int(settlement.PoolConnsFor(settleWorkers))
}

// serveHandler is the operator's HTTP surface: Prometheus metrics, liveness (/healthz),
// readiness (/readyz), River's web UI and the console. Reads are open (bind to loopback, the
// default, to keep them private); anything else — River UI's cancel, retry, delete — needs the
// basic-auth credentials in RIVERUI_USER and RIVERUI_PASSWORD, and is refused outright when
// they are not set. Only loopback Host names and o.hosts are answered (DNS rebinding; health
// probes excepted), no page may be framed, and failed sign-ins on River UI and the console
// share one console.Guard. See docs/console.md, "Threat model".
//
// Nothing here queries the database per request except River UI (capped): metrics come from
// a background gather and readiness from a background ping, so no request rate can take
// connections from the steps. See cachedGatherer.
func serveHandler(ctx context.Context, svc *settlement.Service, rd *readiness, o serveOps, logger *slog.Logger) (http.Handler, error) {
	o = o.withDefaults()
	if o.auth == nil {
		auth, err := operatorAuthFromEnv(logger)
		if err != nil {
			return nil, err
		}
		o.auth = auth
	}
	if o.auth.Guard == nil {
		// One guard for every surface: an attacker gets one budget of failures, not one each.
		o.auth.Guard = console.NewGuard(logger)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	for _, c := range svc.Collectors() {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("registering metrics: %w", err)
		}
	}
	gatherer := newCachedGatherer(reg, o.metricsInterval, logger)
	go gatherer.run(ctx)
	ui, err := riverui.NewHandler(&riverui.HandlerOpts{
		Endpoints: riverui.NewEndpoints(svc.Client.River(), nil),
		Logger:    console.RiverUILogger(logger),
		Prefix:    "/riverui",
	})
	if err != nil {
		return nil, fmt.Errorf("creating the River UI: %w", err)
	}
	if err := ui.Start(ctx); err != nil {
		return nil, fmt.Errorf("starting the River UI: %w", err)
	}
	mux := http.NewServeMux()
	// The anonymous endpoints are capped: requests beyond the cap get 503 at once instead
	// of queueing. Serving the pre-encoded metrics costs a copy, but a flood must not take
	// the CPU the steps need either. Health has a cap of its own, so that a metrics flood
	// never fails an orchestrator's probe (a failed liveness probe restarts the process).
	mux.Handle("/metrics", newLimiter(o.maxScrapes).wrap(gatherer))
	health := newLimiter(o.maxProbes)
	mux.Handle("/healthz", health.wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Liveness: the process answers. It never touches the database, so a database
		// outage does not make an orchestrator restart every process at once.
		fmt.Fprintln(w, "ok")
	})))
	mux.Handle("/readyz", health.wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Readiness: schema checked, River started, the database answered the background
		// ping. The body is generic; the detail is in the log.
		if ok, why := rd.ready(); !ok {
			http.Error(w, "not ready: "+why, http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	})))
	// Credentials first, then a slot, then the body (writes only, within a deadline):
	// console.Protect's order (TestServeSlowBodiesLockNoOperatorOut).
	mux.Handle("/riverui/", console.Protect(ui, "River UI", o.auth, o.maxUIRequests, logger))
	// The operator's console checks host, credentials, its own slots, origin and CSRF itself,
	// in that order (package console), with the same failure guard as River UI.
	cons, err := newConsole(svc.Pool, svc, logger, &consoleSecurity{auth: o.auth, hosts: o.hosts, maxInFlight: o.maxUIRequests})
	if err != nil {
		return nil, err
	}
	mux.Handle("/console/", cons)
	// The bank statement's arrival (statement-arrived over HTTP): a write, so it needs the
	// operators' credentials (RIVERUI_USER), and is capped like River UI.
	var statement = console.Protect(statementHandler(svc.Pool, logger), "statement", o.auth, o.maxUIRequests, logger)
	if o.auth.RiverUser == "" || o.auth.RiverPassword == "" {
		statement = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			console.CloseUnreadBody(w, r)
			http.Error(w, "refused: set RIVERUI_USER and RIVERUI_PASSWORD on serve to accept statements over HTTP (or use the statement-arrived command)", http.StatusForbidden)
		})
	}
	mux.Handle("/ops/statement", statement)
	return console.Harden(readOnlyUnlessAuthorized(mux), o.hosts, logger), nil
}

func orNone(list []string) string {
	if len(list) == 0 {
		return "none"
	}
	return strings.Join(list, ", ")
}

// serveOps are the limits of the operator's HTTP surface.
type serveOps struct {
	metricsInterval time.Duration
	maxScrapes      int // /metrics requests in flight
	maxProbes       int // /healthz and /readyz requests in flight
	maxUIRequests   int // River UI and console requests in flight, each
	// auth is who may sign in; nil: read from the environment (operatorAuthFromEnv).
	auth *operatorAuth
	// hosts are the Host names answered besides loopback (--allowed-host, the bound address).
	hosts []string
}

// withDefaults fills the zero limits with serve's defaults.
func (o serveOps) withDefaults() serveOps {
	if o.metricsInterval <= 0 {
		o.metricsInterval = 5 * time.Second
	}
	if o.maxScrapes <= 0 {
		o.maxScrapes = 4
	}
	if o.maxProbes <= 0 {
		o.maxProbes = 16
	}
	if o.maxUIRequests <= 0 {
		o.maxUIRequests = 4
	}
	return o
}

// readOnlyUnlessAuthorized refuses every method but GET and HEAD outside /riverui/,
// /console/ and /ops/statement (which check credentials themselves): metrics and health are
// read-only.
func readOnlyUnlessAuthorized(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead && !isUnder(r.URL.Path, "/riverui/") && !isUnder(r.URL.Path, "/console/") &&
			r.URL.Path != "/ops/statement" {
			console.CloseUnreadBody(w, r)
			http.Error(w, "read-only endpoint", http.StatusMethodNotAllowed)
			return
		}
		next.ServeHTTP(w, r)
	})
}

func isUnder(path, prefix string) bool {
	return len(path) >= len(prefix) && path[:len(prefix)] == prefix
}
