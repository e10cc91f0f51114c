package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stepwise-go/stepwise/cmd/sample-settlement/settlement"
	"github.com/stepwise-go/stepwise/console"
	"github.com/stepwise-go/stepwise/outbox"
	"github.com/stepwise-go/stepwise/reconcile"
	"github.com/stepwise-go/stepwise/workflow"
)

// newConsole is the operator's console of the sample service, mounted at /console/. With
// operators configured (CONSOLE_USERS, or CONSOLE_USER and CONSOLE_PASSWORD; see
// operatorAuthFromEnv), they sign in and may cancel runs and resolve MANUAL payouts, each
// audited under their name; without, the console is read-only and answers loopback only.
// Totals compare payouts with the bank's statement. sec nil: read from the environment,
// with the console's default limits.
func newConsole(pool *pgxpool.Pool, svc *settlement.Service, logger *slog.Logger, sec *consoleSecurity) (http.Handler, error) {
	if sec == nil {
		auth, err := operatorAuthFromEnv()
		if err != nil {
			return nil, err
		}
		sec = &consoleSecurity{auth: auth}
	}
	cfg := &console.Config{
		Prefix:       "/console",
		Reconciler:   svc.Reconciler,
		Logger:       logger,
		Authenticate: sec.auth.Console,
		Guard:        sec.auth.Guard,
		Hosts:        sec.hosts,
		MaxInFlight:  sec.maxInFlight,
	}
	if svc.Bank != nil {
		cfg.Statements = map[string]reconcile.Statement{settlement.PayoutKind: settlement.StatementOf(svc.Bank)}
	}
	// Resume continues a failed or cancelled run from its last committed cursor, audited
	// with the signed-in operator as actor, and only if the run is still the one the
	// operator's page showed (a run resumed, run and failed again since is refused).
	cfg.Resume = func(ctx context.Context, key string, seenVersion int64, actor, reason string) error {
		return workflow.ResumeIfUnchanged(ctx, svc.Client, key, seenVersion, actor, reason)
	}
	// Requests shows the requests actually started per operation, so an operator can tell a
	// payout sent twice from one merely claimed twice.
	cfg.Requests = func(ctx context.Context, id uuid.UUID) ([]console.Request, error) {
		rs, err := outbox.Requests(ctx, pool, id)
		if err != nil {
			return nil, err
		}
		out := make([]console.Request, 0, len(rs))
		for _, r := range rs {
			cr := console.Request{Attempt: r.Claim, EndedAt: r.EndedAt, Outcome: string(r.Outcome), Detail: r.Error}
			if r.StartedAt != nil {
				cr.StartedAt = *r.StartedAt
			} else {
				cr.Detail = "claimed by " + r.Actor + "; its dispatcher died holding the claim: the request may or may not have begun"
			}
			out = append(out, cr)
		}
		return out, nil
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
	srv := newHTTPServer(mux) // the operator surface's timeouts and header limit, as serve's
	go func() { _ = srv.Serve(ln) }()
	step("console: http://%s/console/ (while the demo runs)", ln.Addr())
	return func() { _ = srv.Close() }, nil
}
