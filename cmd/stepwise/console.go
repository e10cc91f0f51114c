package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"riverqueue.com/riverui"

	sw "github.com/stepwise-go/stepwise"
	"github.com/stepwise-go/stepwise/console"
)

// consoleMaxInFlight caps the console's and River UI's requests in flight, each: they query
// the service's database, and an operator surface must not take its connections.
const consoleMaxInFlight = 4

func runConsole(ctx context.Context, c *cli, args []string) error {
	f := c.newFlags("[--addr 127.0.0.1:8080] [--allowed-host NAME ...] [--behind-tls] [--no-callback-kind KIND ...]", true, false)
	addr := f.String("addr", "127.0.0.1:8080", "HTTP address; loopback unless credentials are set and TLS is terminated in front (--behind-tls)")
	var hosts, noCallback stringList
	f.Var(&hosts, "allowed-host", "a Host name (with or without :port) answered besides localhost, 127.0.0.1 and [::1], e.g. the proxy's name (repeatable); any other Host gets 421 (DNS rebinding)")
	behindTLS := f.Bool("behind-tls", false, "TLS is terminated in front of this process: allows credentials with an --addr beyond loopback (otherwise they would cross the network in clear text)")
	f.Var(&noCallback, "no-callback-kind", "an operation kind your service registers no outcome callback for: the console may resolve MANUAL operations of it (repeatable). Without it the console does not resolve: resolve through your service's own console, which runs the callback")
	verbose := f.Bool("v", false, "log the console's and River UI's info messages")
	if _, err := f.parse(args, 0, 0, ""); err != nil {
		return err
	}
	host, _, err := net.SplitHostPort(*addr)
	if err != nil {
		return usageError("%s: --addr %q: want host:port, e.g. 127.0.0.1:8080", c.path, *addr)
	}
	for _, h := range hosts {
		if strings.ContainsAny(h, "/*@ \t") {
			return usageError("%s: --allowed-host %q: want a host name or address as browsers send it in Host, e.g. ops.example.com or ops.example.com:8443", c.path, h)
		}
	}
	level := slog.LevelWarn
	if *verbose {
		level = slog.LevelInfo
	}
	logger := slog.New(slog.NewTextHandler(c.stderr, &slog.HandlerOptions{Level: level}))
	// Credentials are checked before the database is touched: a half-set pair exits 2. One
	// guard for every surface: an attacker gets one budget of failed sign-ins, not one each.
	auth, err := console.LoadAuth(logger)
	if err != nil {
		return usageError("%s: %v", c.path, err)
	}
	allowed := append([]string(nil), hosts...)
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		switch {
		case auth.Console == nil || auth.RiverUser == "":
			// Guards against publishing the console and River UI (payment jobs' arguments,
			// operations' errors) to a network by a mistyped --addr.
			return usageError("%s: --addr %s is beyond loopback: set the console's operators (CONSOLE_USERS, or CONSOLE_USER and CONSOLE_PASSWORD, or CONSOLE_PROXY_USER_HEADER) and RIVERUI_USER/RIVERUI_PASSWORD, or bind 127.0.0.1 and reach it through ssh -L", c.path, *addr)
		case !*behindTLS:
			return usageError("%s: --addr %s is beyond loopback and credentials are configured: they would cross the network in clear text with every request; terminate TLS in front (a proxy) and pass --behind-tls, or bind 127.0.0.1 and reach it through ssh -L", c.path, *addr)
		}
		if host != "" && (ip == nil || !ip.IsUnspecified()) {
			allowed = append(allowed, host)
		}
	}
	pool, _, err := f.open(ctx, false)
	if err != nil {
		return err
	}
	defer pool.Close()
	// Insert-only: resuming a run inserts its job, the service's workers run it; River UI
	// reads and, with credentials, retries or cancels jobs.
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{})
	if err != nil {
		return err
	}
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	// The operator's client: resumes runs through the insert-only River client, lists each
	// operation's requests, and resolves the operations of the kinds the operator said have
	// no outcome callback (the console offers Resolve on those only).
	opClient, err := sw.NewOperatorClient(pool, noCallback...)
	if err != nil {
		return usageError("%s: --no-callback-kind: %v", c.path, err)
	}
	cfg := &console.Config{
		Prefix: "/console", Logger: logger, Authenticate: auth.Console, Guard: auth.Guard, Hosts: allowed, MaxInFlight: consoleMaxInFlight,
		Client: opClient,
	}
	cons, err := console.New(pool, cfg)
	if err != nil {
		return err
	}
	ui, err := riverui.NewHandler(&riverui.HandlerOpts{
		Endpoints: riverui.NewEndpoints(client, nil),
		Logger:    console.RiverUILogger(logger),
		Prefix:    "/riverui",
	})
	if err != nil {
		return fmt.Errorf("creating the River UI: %w", err)
	}
	if err := ui.Start(runCtx); err != nil {
		return fmt.Errorf("starting the River UI: %w", err)
	}
	mux := http.NewServeMux()
	// The console checks host, credentials, its own slots, origin and CSRF itself.
	mux.Handle("/console/", cons)
	// River UI: credentials first, then a slot, then the body (writes only).
	mux.Handle("/riverui/", console.Protect(ui, "River UI", auth, consoleMaxInFlight, logger))
	mux.Handle("/{$}", http.RedirectHandler("/console/", http.StatusFound))
	handler := console.Harden(mux, allowed, logger)

	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return fmt.Errorf("listening on --addr %s: %w (another process there? pick another port)", *addr, err)
	}
	srv := console.NewServer(handler)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	consoleFrom, riverFrom := "none: read-only, loopback only", "none: read-only, loopback only"
	if auth.Console != nil {
		consoleFrom = auth.ConsoleFrom
	}
	if auth.RiverUser != "" {
		riverFrom = "RIVERUI_USER"
	}
	resolves := "no (resolve through your service's console, or pass --no-callback-kind for kinds without an outcome callback)"
	if len(noCallback) > 0 {
		resolves = "MANUAL operations of " + strings.Join(noCallback, ", ")
	}
	fmt.Fprintf(c.stdout, "console: http://%s/console/  River UI: http://%s/riverui/  (database %s)\n", ln.Addr(), ln.Addr(), where(pool))
	fmt.Fprintf(c.stdout, "operators: console %s; River UI %s; resolves: %s; hosts answered besides loopback: %s\n",
		consoleFrom, riverFrom, resolves, orNone(allowed))
	fmt.Fprintln(c.stdout, "Ctrl-C stops it.")
	select {
	case <-ctx.Done():
	case err := <-done:
		return fmt.Errorf("HTTP server: %w", err)
	}
	shutCtx, stop := context.WithTimeout(context.Background(), 5*time.Second)
	defer stop()
	if err := srv.Shutdown(shutCtx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		_ = srv.Close()
	}
	fmt.Fprintln(c.stdout, "console stopped")
	return nil
}

func orNone(list []string) string {
	if len(list) == 0 {
		return "none"
	}
	return strings.Join(list, ", ")
}
