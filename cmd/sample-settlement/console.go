package main

import (
	"fmt"
	"log/slog"
	"net"
	"net/http"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stepwise-go/stepwise/cmd/sample-settlement/settlement"
	"github.com/stepwise-go/stepwise/console"
)

// newConsole is the operator's console of the sample service, mounted at /console/. With
// operators configured (CONSOLE_USERS, or CONSOLE_USER and CONSOLE_PASSWORD; see
// operatorAuthFromEnv), they sign in and may cancel runs and resolve MANUAL payouts, each
// audited under their name; without, the console is read-only and answers loopback only.
// Totals compare payouts with the bank's statement. sec nil: read from the environment,
// with the console's default limits.
func newConsole(pool *pgxpool.Pool, svc *settlement.Service, logger *slog.Logger, sec *consoleSecurity) (http.Handler, error) {
	if sec == nil {
		auth, err := operatorAuthFromEnv(logger)
		if err != nil {
			return nil, err
		}
		sec = &consoleSecurity{auth: auth}
	}
	// The client takes every action (cancel, resume on the version the page showed, resolve
	// with the payout's outcome callback), lists the requests per operation, and gives the
	// payout kind's statement for Totals: no adapter.
	cfg := &console.Config{
		Prefix:       "/console",
		Client:       svc.Client,
		Logger:       logger,
		Authenticate: sec.auth.Console,
		Guard:        sec.auth.Guard,
		Hosts:        sec.hosts,
		MaxInFlight:  sec.maxInFlight,
	}
	return console.New(pool, cfg)
}

// serveDemoConsole serves the console for the demo's lifetime and says where.
func serveDemoConsole(pool *pgxpool.Pool, svc *settlement.Service, logger *slog.Logger, addr string, step func(string, ...any)) (func(), error) {
	h, err := newConsole(pool, svc, logger, nil)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listening on --console-addr %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/console/", h)
	srv := console.NewServer(mux) // the operator surface's timeouts and header limit, as serve's
	go func() { _ = srv.Serve(ln) }()
	step("console: http://%s/console/ (while the demo runs)", ln.Addr())
	return func() { _ = srv.Close() }, nil
}
