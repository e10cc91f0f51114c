package main

import (
	"context"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// cachedGatherer gathers the registry in the background, one gather at a time, every
// interval, and answers every scrape from the last result.
//
// Guards against: an anonymous /metrics flood starving the service's pool. The gauges of
// the workflow, outbox and reconcile collectors query the database; gathered per request,
// 500 concurrent scrapes queued hundreds of queries on the pool and the settle steps' lease
// heartbeats waited behind them until the leases lapsed and the runs were taken over. Here
// the number of scrapes does not change the number of queries: at most one gather is in
// flight, whatever the request rate, and no request waits for the database.
type cachedGatherer struct {
	reg      prometheus.Gatherer
	interval time.Duration
	logger   *slog.Logger

	mu    sync.RWMutex
	mfs   []*dto.MetricFamily
	err   error
	ready chan struct{} // closed after the first gather
}

func newCachedGatherer(reg prometheus.Gatherer, interval time.Duration, logger *slog.Logger) *cachedGatherer {
	return &cachedGatherer{reg: reg, interval: interval, logger: logger, ready: make(chan struct{})}
}

// run gathers until ctx is done.
func (g *cachedGatherer) run(ctx context.Context) {
	t := time.NewTicker(g.interval)
	defer t.Stop()
	first := true
	for {
		mfs, err := g.reg.Gather()
		if err != nil {
			// The detail (it may name the database and its user) goes to the log, not to
			// the anonymous caller; promhttp still serves what was gathered.
			g.logger.Warn("gathering metrics", "err", err)
		}
		g.mu.Lock()
		g.mfs, g.err = mfs, err
		g.mu.Unlock()
		if first {
			close(g.ready)
			first = false
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Gather returns the last gathered families. Before the first gather it waits for it (a
// scrape during start-up), at most a few seconds.
func (g *cachedGatherer) Gather() ([]*dto.MetricFamily, error) {
	select {
	case <-g.ready:
	case <-time.After(5 * time.Second):
		return nil, nil
	}
	g.mu.RLock()
	defer g.mu.RUnlock()
	// promhttp only reads the families; sharing them between scrapes is safe. A gather
	// error is logged by run and not repeated to every caller: what was gathered is served.
	return g.mfs, nil
}

// limitInFlight answers 503 at once to requests beyond max in flight, so that a flood of
// an endpoint (River UI reads, which query the database) cannot queue without bound on the
// service's pool or its CPU.
func limitInFlight(max int, next http.Handler) http.Handler {
	sem := make(chan struct{}, max)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case sem <- struct{}{}:
			defer func() { <-sem }()
			next.ServeHTTP(w, r)
		default:
			w.Header().Set("Retry-After", "1")
			http.Error(w, "busy: too many concurrent requests, retry later", http.StatusServiceUnavailable)
		}
	})
}

// readiness tracks whether this process is ready to take work: the schema is known to be
// current, River is started and the database answered the last background ping.
//
// Guards against: /healthz and /readyz querying the database per request (a flood again)
// and telling anonymous callers the database's user, name, host and FATAL text. The ping
// runs in the background on the service's pool; callers get a generic body and the detail
// goes to the log.
type readiness struct {
	started  atomic.Bool
	stopping atomic.Bool
	dbOK     atomic.Bool
}

// watchDB pings the database every interval until ctx is done, logging a failure once per
// change of state.
func (rd *readiness) watchDB(ctx context.Context, pool *pgxpool.Pool, interval time.Duration, logger *slog.Logger) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		pingCtx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := pool.Ping(pingCtx)
		cancel()
		if err != nil && ctx.Err() == nil && rd.dbOK.Load() {
			logger.Warn("readiness: the database does not answer", "err", err)
		}
		rd.dbOK.Store(err == nil)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// ready reports whether the process takes work, and if not a generic reason.
func (rd *readiness) ready() (bool, string) {
	switch {
	case rd.stopping.Load():
		return false, "shutting down"
	case !rd.started.Load():
		return false, "starting"
	case !rd.dbOK.Load():
		return false, "database unavailable"
	}
	return true, "ok"
}
