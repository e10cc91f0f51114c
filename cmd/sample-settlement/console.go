package main

import (
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stepwise-go/stepwise/cmd/sample-settlement/settlement"
	"github.com/stepwise-go/stepwise/console"
	"github.com/stepwise-go/stepwise/internal/testkit/bankops"
	"github.com/stepwise-go/stepwise/reconcile"
)

// newConsole is the operator's console of the sample service, mounted at /console/. With
// CONSOLE_USER and CONSOLE_PASSWORD set, operators sign in with them and may cancel runs and
// resolve MANUAL payouts; without, the console is read-only and answers loopback only.
// Totals compare payouts with the bank's statement.
func newConsole(pool *pgxpool.Pool, svc *settlement.Service, logger *slog.Logger) (http.Handler, error) {
	cfg := &console.Config{
		Prefix:     "/console",
		Reconciler: svc.Reconciler,
		Logger:     logger,
	}
	if svc.Sender != nil && svc.Sender.Bank != nil {
		cfg.Statements = map[string]reconcile.Statement{settlement.PayoutKind: bankops.Statement(svc.Sender.Bank)}
	}
	if user, password := os.Getenv("CONSOLE_USER"), os.Getenv("CONSOLE_PASSWORD"); user != "" && password != "" {
		cfg.Authenticate = console.BasicAuth(user, password)
	}
	// Integrator: wire cfg.Resume to workflow.Resume and cfg.Requests to the outbox's request
	// records once they are on main.
	return console.New(pool, cfg)
}

// serveDemoConsole serves the console for the demo's lifetime and says where.
func serveDemoConsole(pool *pgxpool.Pool, svc *settlement.Service, logger *slog.Logger, addr string, step func(string, ...any)) (func(), error) {
	h, err := newConsole(pool, svc, logger)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listening on --console-addr %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/console/", h)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	step("console: http://%s/console/ (while the demo runs)", ln.Addr())
	return func() { _ = srv.Close() }, nil
}
