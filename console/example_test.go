package console_test

import (
	"log/slog"
	"net/http"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stepwise-go/stepwise"
	"github.com/stepwise-go/stepwise/console"
)

// Serving the console, River UI and an endpoint of the service's own on one operator
// surface, as docs/console.md shows it: credentials from the environment with one failure
// guard, each handler that writes behind Protect, the whole behind Harden, every timeout set.
func Example_operatorSurface() {
	var (
		pool    *pgxpool.Pool    // the service's pool
		client  *stepwise.Client // the service's client
		riverUI http.Handler     // riverui.NewHandler(…), logging to console.RiverUILogger(logger)
		mine    http.Handler     // an endpoint of the service's own that writes
		hosts   []string         // the names the surface answers besides loopback
		logger  = slog.Default()
	)
	auth, err := console.LoadAuth(logger) // CONSOLE_USERS, RIVERUI_USER, CONSOLE_TRUSTED_PROXIES, …
	if err != nil {
		logger.Error("operators' credentials", "error", err)
		return
	}
	h, err := console.New(pool, &console.Config{
		Prefix:       "/console",
		Client:       client,
		Authenticate: auth.Console,
		Guard:        auth.Guard,
		Hosts:        hosts,
	})
	if err != nil {
		logger.Error("console", "error", err)
		return
	}
	mux := http.NewServeMux()
	mux.Handle("/console/", h)
	mux.Handle("/riverui/", console.Protect(riverUI, "River UI", auth, 4, logger))
	mux.Handle("/ops/mine", console.Protect(mine, "mine", auth, 4, logger))
	srv := console.NewServer(console.Harden(mux, hosts, logger))
	srv.Addr = "127.0.0.1:8080"
	_ = srv // srv.ListenAndServe() in the service
}
