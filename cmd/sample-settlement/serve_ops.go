package main

import (
	"bytes"
	"compress/gzip"
	"context"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
)

// cachedGatherer gathers the registry in the background, one gather at a time, every
// interval, encodes the result once (plain and gzipped), and answers every scrape with those
// bytes.
//
// Guards against: an anonymous /metrics flood starving the service. The gauges of the
// workflow, outbox and reconcile collectors query the database; gathered per request, 500
// concurrent scrapes queued hundreds of queries on the pool and the settle steps' lease
// heartbeats waited behind them until the leases lapsed and the runs were taken over. Here
// the number of scrapes does not change the number of queries: at most one gather is in
// flight, whatever the request rate, and no request waits for the database. And a scrape
// costs no CPU beyond copying bytes: encoding and gzipping the families per request (what
// promhttp does) under 500 scrapes a second took the 2 cores' time from the steps (measured:
// the slowest step 90ms without the flood, 350-400ms with it).
type cachedGatherer struct {
	reg      prometheus.Gatherer
	interval time.Duration
	logger   *slog.Logger

	body  atomic.Pointer[encodedMetrics]
	ready chan struct{} // closed after the first gather
}

// encodedMetrics is one gather, encoded in Prometheus' text format.
type encodedMetrics struct {
	plain, gzipped []byte
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
		g.gatherOnce()
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

// gatherOnce gathers, encodes and publishes the families. A gather error is logged here, with
// its detail (it may name the database and its user), and not repeated to anonymous callers:
// what was gathered is served.
func (g *cachedGatherer) gatherOnce() {
	mfs, err := g.reg.Gather()
	if err != nil {
		g.logger.Warn("gathering metrics", "err", err)
	}
	var plain bytes.Buffer
	enc := expfmt.NewEncoder(&plain, metricsFormat)
	for _, mf := range mfs {
		if err := enc.Encode(mf); err != nil {
			g.logger.Warn("encoding metrics", "family", mf.GetName(), "err", err)
		}
	}
	var gz bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&gz, gzip.BestSpeed)
	_, _ = zw.Write(plain.Bytes())
	_ = zw.Close()
	g.body.Store(&encodedMetrics{plain: plain.Bytes(), gzipped: gz.Bytes()})
}

// metricsFormat is the exposition format of /metrics: Prometheus' text format, which every
// scraper accepts.
var metricsFormat = expfmt.NewFormat(expfmt.TypeTextPlain)

// ServeHTTP answers a scrape with the last gather's bytes. Before the first gather it waits
// for it (a scrape during start-up), at most a few seconds, then answers 503.
func (g *cachedGatherer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	select {
	case <-g.ready:
	case <-r.Context().Done():
		return
	case <-time.After(5 * time.Second):
		unavailable(w, "metrics not gathered yet")
		return
	}
	m := g.body.Load()
	h := w.Header()
	h.Set("Content-Type", string(metricsFormat))
	h.Set("Cache-Control", "no-store")
	h.Add("Vary", "Accept-Encoding")
	body := m.plain
	if acceptsGzip(r) {
		h.Set("Content-Encoding", "gzip")
		body = m.gzipped
	}
	h.Set("Content-Length", strconv.Itoa(len(body)))
	if r.Method == http.MethodHead {
		return
	}
	_, _ = w.Write(body)
}

// acceptsGzip reports whether the request's Accept-Encoding lists gzip (without q=0).
func acceptsGzip(r *http.Request) bool {
	for _, v := range r.Header.Values("Accept-Encoding") {
		for _, part := range strings.Split(v, ",") {
			enc, params, _ := strings.Cut(strings.TrimSpace(part), ";")
			if strings.EqualFold(strings.TrimSpace(enc), "gzip") && strings.ReplaceAll(params, " ", "") != "q=0" {
				return true
			}
		}
	}
	return false
}

// unavailable answers 503 with a generic body and a hint to retry.
func unavailable(w http.ResponseWriter, why string) {
	w.Header().Set("Retry-After", "1")
	http.Error(w, why, http.StatusServiceUnavailable)
}

// limiter answers 503 at once to requests beyond its cap in flight, so that a flood of an
// endpoint cannot queue without bound on the service's pool or its CPU.
type limiter chan struct{}

func newLimiter(max int) limiter { return make(limiter, max) }

func (l limiter) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case l <- struct{}{}:
			defer func() { <-l }()
			next.ServeHTTP(w, r)
		default:
			unavailable(w, "busy: too many concurrent requests, retry later")
		}
	})
}

// limitInFlightLogged caps next at max requests in flight (River UI's, which query the
// database), like limiter, and logs the refusals (sampled): an operator told "busy" should
// find why in the log.
func limitInFlightLogged(max int, what string, logger *slog.Logger, next http.Handler) http.Handler {
	l := newLimiter(max)
	var busy sampledWarn
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case l <- struct{}{}:
			defer func() { <-l }()
			next.ServeHTTP(w, r)
		default:
			busy.warn(logger, what+": request refused: every slot is busy (503)", "max_in_flight", max, "peer", r.RemoteAddr, "path", r.URL.Path)
			closeUnreadBody(w, r)
			unavailable(w, "busy: too many concurrent requests, retry later")
		}
	})
}

// sampledWarn logs a repeated refusal at most once every 10 s, with how many it did not
// log. Guards against a flood of refusals flooding the log as well.
type sampledWarn struct {
	mu      sync.Mutex
	last    time.Time
	dropped int
}

func (s *sampledWarn) warn(logger *slog.Logger, msg string, args ...any) {
	s.mu.Lock()
	now := time.Now()
	if now.Sub(s.last) < 10*time.Second {
		s.dropped++
		s.mu.Unlock()
		return
	}
	dropped := s.dropped
	s.last, s.dropped = now, 0
	s.mu.Unlock()
	logger.Warn(msg, append(args, "not_logged_since_last", dropped)...)
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

// raiseInternalErrors passes River UI's log records on, raising those that carry a failure's
// detail (an "internal_error" attribute, such as the database's connection error behind the
// generic "problem connecting to the configured database" answer) from INFO to WARN. Guards
// against: the detail an anonymous caller is not told being lost too, since serve logs WARN
// and above unless -v.
type raiseInternalErrors struct{ slog.Handler }

func (h raiseInternalErrors) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= slog.LevelInfo || h.Handler.Enabled(ctx, l)
}

func (h raiseInternalErrors) Handle(ctx context.Context, r slog.Record) error {
	if r.Level < slog.LevelWarn {
		internal := false
		r.Attrs(func(a slog.Attr) bool {
			internal = a.Key == "internal_error"
			return !internal
		})
		if !internal {
			if !h.Handler.Enabled(ctx, r.Level) {
				return nil
			}
			return h.Handler.Handle(ctx, r)
		}
		r.Level = slog.LevelWarn
	}
	return h.Handler.Handle(ctx, r)
}

func (h raiseInternalErrors) WithAttrs(as []slog.Attr) slog.Handler {
	return raiseInternalErrors{h.Handler.WithAttrs(as)}
}

func (h raiseInternalErrors) WithGroup(name string) slog.Handler {
	return raiseInternalErrors{h.Handler.WithGroup(name)}
}

// genericServerErrors answers every 5xx of next with a generic body and logs the body next
// wrote instead. Guards against: a handler this service does not own (River UI) telling an
// anonymous caller what failed inside (a host, a user, SQL, a server's FATAL text), in this
// version or the next.
func genericServerErrors(next http.Handler, what string, logger *slog.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gw := &genericWriter{ResponseWriter: w}
		next.ServeHTTP(gw, r)
		if gw.status >= 500 {
			logger.Warn(what+": server error answered with a generic body", "method", r.Method, "path", r.URL.Path,
				"status", gw.status, "body", strings.TrimSpace(gw.held.String()))
		}
	})
}

// genericWriter is genericServerErrors' ResponseWriter: below 500 it passes everything on;
// from 500 it writes a generic body itself and holds what the handler writes (up to 4 KiB)
// for the log.
type genericWriter struct {
	http.ResponseWriter
	status int
	held   bytes.Buffer
}

// maxHeldBody bounds the failure body genericWriter keeps for the log.
const maxHeldBody = 4 << 10

func (g *genericWriter) WriteHeader(code int) {
	if g.status != 0 {
		return
	}
	g.status = code
	if code < 500 {
		g.ResponseWriter.WriteHeader(code)
		return
	}
	h := g.ResponseWriter.Header()
	for _, k := range []string{"Content-Length", "Content-Encoding", "Content-Disposition", "Etag", "Last-Modified"} {
		h.Del(k)
	}
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Cache-Control", "no-store")
	g.ResponseWriter.WriteHeader(code)
	_, _ = io.WriteString(g.ResponseWriter, http.StatusText(code)+": the details are in the server's log\n")
}

func (g *genericWriter) Write(p []byte) (int, error) {
	if g.status == 0 {
		g.WriteHeader(http.StatusOK)
	}
	if g.status < 500 {
		return g.ResponseWriter.Write(p)
	}
	if room := maxHeldBody - g.held.Len(); room > 0 {
		g.held.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

// Unwrap lets http.ResponseController reach the connection (deadlines, flushes).
func (g *genericWriter) Unwrap() http.ResponseWriter { return g.ResponseWriter }
