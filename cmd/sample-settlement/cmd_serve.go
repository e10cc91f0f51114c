package main

import (
	"context"
	"crypto/subtle"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"riverqueue.com/riverui"

	"github.com/stepwise-go/stepwise/cmd/sample-settlement/settlement"
	"github.com/stepwise-go/stepwise/workflow"
)

func init() {
	register("serve", "run workers, scheduler, reconciler and payout delivery until SIGINT/SIGTERM", runServe)
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
	verbose           bool
}

func runServe(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("serve", "serve [--addr 127.0.0.1:8080] [--shards N] [--bank-url URL] ...", stderr)
	var f serveFlags
	f.db.register(fs)
	f.plan.register(fs)
	f.bank.register(fs)
	fs.StringVar(&f.addr, "addr", envOr("SERVE_ADDR", "127.0.0.1:8080"), "HTTP address of /metrics, /healthz and /riverui/; loopback unless you mean it ($SERVE_ADDR)")
	fs.StringVar(&f.id, "id", "", "name of this process in River, leases and audit events (default host/pid)")
	fs.BoolVar(&f.schedule, "scheduler", true, "tick the daily settlement schedule (every process may: the tick is safe to run twice)")
	fs.BoolVar(&f.migrate, "migrate", true, "bring the schema up before serving")
	fs.IntVar(&f.settleWorkers, "settle-workers", 0, "settle runs worked at once by this process (default: --shards)")
	fs.IntVar(&f.batchSize, "batch-size", settlement.DefaultBatchSize, "merchants per settle step")
	fs.IntVar(&f.payoutConcurrency, "payout-concurrency", 32, "payouts sent at once by this process")
	fs.DurationVar(&f.payoutTimeout, "payout-timeout", 5*time.Second, "timeout of one payment call (a timeout is UNKNOWN_EXTERNAL)")
	fs.DurationVar(&f.lease, "lease", 0, "lease of a settle run; a killed process's runs are taken over after about this (default 30s)")
	fs.DurationVar(&f.reconcileEvery, "reconcile-interval", 5*time.Second, "how often unknown payouts are looked up at the bank")
	fs.DurationVar(&f.reconcileGrace, "reconcile-grace", time.Minute, "how long after a send the bank's \"not found\" is believed and the payout resent (must exceed --payout-timeout)")
	fs.DurationVar(&f.shutdownTimeout, "shutdown-timeout", 20*time.Second, "on SIGTERM, how long in-flight steps and sends may finish before they are cancelled")
	fs.BoolVar(&f.verbose, "v", false, "log River's and Stepwise's info messages")
	if err := parseFlags(fs, args, false); err != nil {
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
		return usageError("--addr %q: want host:port, e.g. 127.0.0.1:8080", f.addr)
	}
	logger := newLogger(stderr, f.verbose)
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		logger.Warn("serving beyond loopback: /metrics, /healthz and River UI reads are open to anyone who can reach " + f.addr)
	}

	pool, err := f.db.connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	if f.migrate {
		if err := settlement.Migrate(ctx, pool); err != nil {
			return err
		}
	}
	var wcfg *workflow.Config
	if f.lease > 0 {
		wcfg = &workflow.Config{Lease: f.lease, Logger: logger}
	}
	svc, err := settlement.NewService(pool, &settlement.ServiceConfig{
		Bank: bank, Plan: plan, BatchSize: f.batchSize, SettleWorkers: f.settleWorkers, Schedule: f.schedule,
		PayoutConcurrency: f.payoutConcurrency, PayoutTimeout: f.payoutTimeout, Workflow: wcfg, ID: f.id, Logger: logger,
		ReconcileInterval: f.reconcileEvery, ReconcileGrace: f.reconcileGrace,
	})
	if err != nil {
		return err
	}

	// River's work is stopped through Stop below, not by cancelling its start context, so
	// that in-flight steps get their chance to finish.
	runCtx, cancelRun := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelRun()
	handler, err := serveHandler(runCtx, pool, svc, logger)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", f.addr)
	if err != nil {
		return fmt.Errorf("listening on --addr %s: %w", f.addr, err)
	}
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second}
	httpDone := make(chan error, 1)
	go func() { httpDone <- srv.Serve(ln) }()

	if err := svc.Start(runCtx); err != nil {
		_ = srv.Close()
		return err
	}
	// Takeover from every process, not only River's leader: when the process that dies is
	// the leader, the leader-run job would wait for a new election (measured: ~17s).
	go func() { _ = svc.Engine.RunMaintenance(runCtx, svc.Client) }()
	fmt.Fprintf(stdout, "serving: http://%s/metrics /healthz /riverui/ /console/; %d shards, schedule %q in %s (on: %t), bank %s\n",
		ln.Addr(), plan.Shards, plan.Spec, plan.Zone, f.schedule, f.bank.url)

	select {
	case <-ctx.Done():
	case err := <-httpDone:
		_ = svc.Stop(context.Background(), f.shutdownTimeout)
		return fmt.Errorf("HTTP server: %w", err)
	}
	fmt.Fprintf(stdout, "shutting down: finishing in-flight steps and sends (up to %s)\n", f.shutdownTimeout)
	shutCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(shutCtx)
	if err := svc.Stop(context.Background(), f.shutdownTimeout); err != nil {
		return err
	}
	fmt.Fprintln(stdout, "stopped")
	return nil
}

// serveHandler is the operator's HTTP surface: Prometheus metrics, a health check and River's
// web UI. Reads are open (bind to loopback, the default, to keep them private); anything
// else — River UI's cancel, retry, delete — needs the basic-auth credentials in
// RIVERUI_USER and RIVERUI_PASSWORD, and is refused outright when they are not set.
func serveHandler(ctx context.Context, pool *pgxpool.Pool, svc *settlement.Service, logger *slog.Logger) (http.Handler, error) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	for _, c := range svc.Collectors() {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("registering metrics: %w", err)
		}
	}
	ui, err := riverui.NewHandler(&riverui.HandlerOpts{
		Endpoints: riverui.NewEndpoints(svc.Client, nil),
		Logger:    logger,
		Prefix:    "/riverui",
	})
	if err != nil {
		return nil, fmt.Errorf("creating the River UI: %w", err)
	}
	if err := ui.Start(ctx); err != nil {
		return nil, fmt.Errorf("starting the River UI: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		pingCtx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		if err := pool.Ping(pingCtx); err != nil {
			http.Error(w, "database: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.Handle("/riverui/", requireAuthForWrites(ui, os.Getenv("RIVERUI_USER"), os.Getenv("RIVERUI_PASSWORD")))
	// The operator's console checks credentials, origin and CSRF itself (package console).
	cons, err := newConsole(pool, svc, logger)
	if err != nil {
		return nil, err
	}
	mux.Handle("/console/", cons)
	return readOnlyUnlessAuthorized(mux), nil
}

// readOnlyUnlessAuthorized refuses every method but GET and HEAD outside /riverui/ (which
// checks credentials itself): metrics and health are read-only.
func readOnlyUnlessAuthorized(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead && !isUnder(r.URL.Path, "/riverui/") && !isUnder(r.URL.Path, "/console/") {
			http.Error(w, "read-only endpoint", http.StatusMethodNotAllowed)
			return
		}
		next.ServeHTTP(w, r)
	})
}

func isUnder(path, prefix string) bool {
	return len(path) >= len(prefix) && path[:len(prefix)] == prefix
}

// requireAuthForWrites lets reads through and asks for basic-auth credentials for anything
// else; with no credentials configured, writes are refused with the fix.
func requireAuthForWrites(next http.Handler, user, password string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.Method {
		case http.MethodGet, http.MethodHead, http.MethodOptions:
			next.ServeHTTP(w, r)
			return
		}
		if user == "" || password == "" {
			http.Error(w, "River UI is read-only here: set RIVERUI_USER and RIVERUI_PASSWORD on the serve process to allow changes", http.StatusForbidden)
			return
		}
		u, p, ok := r.BasicAuth()
		if !ok || subtle.ConstantTimeCompare([]byte(u), []byte(user)) != 1 || subtle.ConstantTimeCompare([]byte(p), []byte(password)) != 1 {
			w.Header().Set("WWW-Authenticate", `Basic realm="stepwise river ui", charset="UTF-8"`)
			http.Error(w, "credentials required for changes", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}
