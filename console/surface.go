package console

// The operator's HTTP surface around the console: what a service that serves the console,
// River UI and endpoints of its own needs, in the order that is safe, behind four calls.
//
//	auth, err := console.LoadAuth(logger)                 // credentials and one failure guard
//	mux.Handle("/console/", cons)                          // checks its own, in its own order
//	mux.Handle("/riverui/", console.Protect(ui, "River UI", auth, 4, logger))
//	srv := console.NewServer(console.Harden(mux, hosts, logger))
//
// Harden is the outside (headers against framing, the body cap, the Host check against DNS
// rebinding); Protect the inside of a handler that writes (credentials before a slot, CSRF
// checks on writes, an in-flight cap answering 503 at once, the body read within a deadline,
// generic bodies for server errors); NewServer sets every timeout. See docs/console.md,
// "Threat model".

import (
	"bytes"
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Protect guards next, a handler the console does not own that may write (River UI, or an
// endpoint of the service's own), in the order that is safe: credentials first (auth's River
// UI account; failures limited by auth.Guard), then one of maxInFlight slots (503 at once
// beyond), then the write's body, read within a deadline, then next, whose server errors are
// answered with a generic body and logged under what. See requireAuthForWrites for who may
// do what. A nil auth.Guard gives this handler a guard of its own: set it (LoadAuth does) to
// share one budget of failed sign-ins with the console.
//
// Guards against the lockout measured before this order: four connections that announce a
// 1 MB body and never send it held River UI's and the console's four slots each, and every
// operator request got 503 for as long as they stayed.
func Protect(next http.Handler, what string, auth *Auth, maxInFlight int, logger *slog.Logger) http.Handler {
	if logger == nil {
		logger = slog.Default()
	}
	guard := auth.Guard
	if guard == nil {
		guard = NewGuard(logger)
	}
	return requireAuthForWrites(limitInFlight(maxInFlight, what, logger, readWriteBody(genericServerErrors(next, what, logger), logger)),
		auth.RiverUser, auth.RiverPassword, guard)
}

// Harden is the outside of an operator's HTTP surface, around the mux that holds the
// console, Protect's handlers and the rest: headers against framing and sniffing, the body
// cap (1 MiB), and the Host check that answers 421 to any Host but loopback and hosts (DNS
// rebinding; /healthz and /readyz excepted).
func Harden(next http.Handler, hosts []string, logger *slog.Logger) http.Handler {
	if logger == nil {
		logger = slog.Default()
	}
	return headers(limitBodies(allowedHostsOnly(hosts, logger, next)))
}

// RiverUILogger is logger for River UI's handler: it raises the records that carry a
// failure's detail (an "internal_error" attribute, such as the database's connection error
// behind River UI's generic "problem connecting to the configured database") from INFO to
// WARN. Guards against: the detail an anonymous caller is not told being lost too, when the
// service logs WARN and above.
func RiverUILogger(logger *slog.Logger) *slog.Logger {
	if logger == nil {
		logger = slog.Default()
	}
	return slog.New(raiseInternalErrors{logger.Handler()})
}

// requireAuthForWrites guards River UI.
//
//   - With credentials configured (RIVERUI_USER and RIVERUI_PASSWORD), every request needs
//     them, reads too: the job list shows arguments and errors of payment jobs.
//   - Without credentials, reads are open (bind to loopback) and writes are refused.
//   - A write (anything but GET, HEAD, OPTIONS) must also come from River UI's own page.
//     Guards against CSRF: a browser holding the basic-auth credentials sends them with a
//     form or text/plain POST that a foreign page makes it submit (measured on 616d8b1: a
//     cross-origin text/plain POST re-ran a job). So a write must be JSON (a cross-origin
//     JSON request needs a CORS preflight, which this server never grants), and a browser's
//     Sec-Fetch-Site, when sent, must be same-origin, and its Origin, when sent, must be this
//     host. Clients that are not browsers (curl, scripts) send neither header and pass.
//
// It runs before the in-flight cap and reads no body: a request without valid credentials
// never holds a slot. Failed sign-ins are limited and logged by guard (429 with Retry-After
// while the peer, or everyone, is locked out; see Guard).
func requireAuthForWrites(next http.Handler, user, password string, guard *Guard) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		write := true
		switch r.Method {
		case http.MethodGet, http.MethodHead, http.MethodOptions:
			write = false
		}
		if user == "" || password == "" {
			if write {
				CloseUnreadBody(w, r)
				http.Error(w, "River UI is read-only here: set RIVERUI_USER and RIVERUI_PASSWORD on the process serving it to allow changes", http.StatusForbidden)
				return
			}
			next.ServeHTTP(w, r)
			return
		}
		// Every refusal here is made without reading the body: hang up after it.
		if wait := guard.wait(r); wait > 0 {
			CloseUnreadBody(w, r)
			w.Header().Set("Retry-After", strconv.Itoa(int((wait+time.Second-1)/time.Second)))
			http.Error(w, "too many failed sign-ins: credentials are not checked for a while; the attempts are in the server's log", http.StatusTooManyRequests)
			return
		}
		u, p, ok := r.BasicAuth()
		// Both compared whatever the first gives: no timing signal for "user exists".
		okU := subtle.ConstantTimeCompare([]byte(u), []byte(user))
		okP := subtle.ConstantTimeCompare([]byte(p), []byte(password))
		if !ok || okU&okP != 1 {
			if ok || r.Header.Get("Authorization") != "" {
				guard.failed(r, u)
			}
			CloseUnreadBody(w, r)
			w.Header().Set("WWW-Authenticate", `Basic realm="stepwise river ui", charset="UTF-8"`)
			http.Error(w, "credentials required", http.StatusUnauthorized)
			return
		}
		guard.succeeded(r)
		if write {
			if why := crossSiteWrite(r); why != "" {
				CloseUnreadBody(w, r)
				http.Error(w, "refused: "+why, http.StatusForbidden)
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

// crossSiteWrite returns why a write request may come from a foreign page, or "".
func crossSiteWrite(r *http.Request) string {
	if site := r.Header.Get("Sec-Fetch-Site"); site != "" && site != "same-origin" {
		return "a write must come from River UI's own page (Sec-Fetch-Site: " + site + ")"
	}
	if origin := r.Header.Get("Origin"); origin != "" {
		u, err := url.Parse(origin)
		if err != nil || u.Host != r.Host {
			return "a write must come from River UI's own page (Origin is another site)"
		}
	}
	mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if mt != "application/json" {
		return "a write must be a JSON request (Content-Type: application/json)"
	}
	return ""
}

// maxRequestBody bounds every request body: River UI's largest write is a list of job ids.
const maxRequestBody = 1 << 20

// limitBodies caps request bodies (a larger one fails to read, and River UI answers 4xx),
// so that a client cannot make the process buffer without bound.
func limitBodies(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength > maxRequestBody {
			CloseUnreadBody(w, r)
			http.Error(w, "request body too large", http.StatusRequestEntityTooLarge)
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, maxRequestBody)
		next.ServeHTTP(w, r)
	})
}

// bodyReadTimeout bounds reading an authenticated write's body: River UI's writes are a few
// hundred bytes, sent at once.
const bodyReadTimeout = 5 * time.Second

// readWriteBody reads a write's body (already capped by limitBodies) before next sees it,
// within bodyReadTimeout, and answers 413 when it is over the cap. Reads (GET, HEAD,
// OPTIONS) pass without their body being read.
//
// Guards against: a body sent without a length (chunked) passing limitBodies' Content-Length
// check, being cut at the cap while River UI decodes it, and answered as a malformed request
// (400) instead of a refused size; and a client that announces a body and dribbles it holding
// a slot for the server's whole read timeout. It runs after authentication and under the
// in-flight cap, so only an operator's request is read, at most that many at once.
func readWriteBody(next http.Handler, logger *slog.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.Method {
		case http.MethodGet, http.MethodHead, http.MethodOptions:
			next.ServeHTTP(w, r)
			return
		}
		if r.Body == nil || r.Body == http.NoBody {
			next.ServeHTTP(w, r)
			return
		}
		// ErrNotSupported (a test recorder) leaves the server's own read timeout.
		_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(bodyReadTimeout))
		body, err := io.ReadAll(r.Body)
		if err != nil {
			var tooLarge *http.MaxBytesError
			if errors.As(err, &tooLarge) {
				http.Error(w, "request body too large", http.StatusRequestEntityTooLarge)
				return
			}
			logger.Warn("operator surface: request body not received in time or unreadable", "peer", r.RemoteAddr, "path", r.URL.Path, "timeout", bodyReadTimeout, "err", err)
			http.Error(w, "reading the request body failed (send it at once, within "+bodyReadTimeout.String()+")", http.StatusBadRequest)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		next.ServeHTTP(w, r)
	})
}

// allowedHostsOnly answers 421 to a request whose Host is neither loopback nor in hosts,
// except for /healthz and /readyz (an orchestrator's probe sends the pod's address; they
// show nothing). Guards against DNS rebinding: a page the operator opens re-points its own
// name at 127.0.0.1 (or at the address an ssh -L listens on) and then reads River UI's API
// (payment jobs' arguments), /metrics and the console as its own origin. See
// allowedHost.
func allowedHostsOnly(hosts []string, logger *slog.Logger, next http.Handler) http.Handler {
	var refused sampledLog
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" || r.URL.Path == "/readyz" || allowedHost(r.Host, hosts) {
			next.ServeHTTP(w, r)
			return
		}
		CloseUnreadBody(w, r)
		refused.log(logger, "operator surface: request for a host that is not ours refused (421): a DNS-rebinding page, or a name to list with --allowed-host",
			"host", fmt.Sprintf("%.100q", r.Host), "peer", r.RemoteAddr, "path", r.URL.Path)
		http.Error(w, fmt.Sprintf("this server does not answer to the host %.100q: it answers localhost, 127.0.0.1 and [::1], and the names this server was given with --allowed-host; open it by one of those, or list this name if it is yours", r.Host),
			http.StatusMisdirectedRequest)
	})
}

// CloseUnreadBody makes the server hang up after answering a request whose body it refuses
// unread. Guards against: the server reading up to 256 KB of that body before it answers (so
// that the connection can be reused), which a client that announced a body and sends none
// turns into a wait, holding its connection, for the whole read timeout.
func CloseUnreadBody(w http.ResponseWriter, r *http.Request) {
	if r.ContentLength != 0 {
		w.Header().Set("Connection", "close")
	}
}

// headers: no page of the operator surface may be framed by another site (River UI's
// buttons clickjacked: an invisible frame over a decoy), nor sniffed into another type. The
// console sets a stricter policy of its own.
func headers(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("X-Frame-Options", "DENY")
		h.Set("Content-Security-Policy", "frame-ancestors 'none'")
		h.Set("X-Content-Type-Options", "nosniff")
		next.ServeHTTP(w, r)
	})
}

// NewServer is the operator surface's server, with every timeout set. Guards against
// slow clients (slowloris: headers or bodies dribbled a byte at a time) holding connections
// and goroutines without bound.
func NewServer(h http.Handler) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       15 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       60 * time.Second,
		MaxHeaderBytes:    64 << 10,
	}
}

// unavailable answers 503 with a generic body and a hint to retry.
func unavailable(w http.ResponseWriter, why string) {
	w.Header().Set("Retry-After", "1")
	http.Error(w, why, http.StatusServiceUnavailable)
}

// limitInFlight caps next at max requests in flight (River UI's, which query the database):
// beyond it, 503 at once instead of a queue on the pool. It logs the refusals (sampled): an
// operator told "busy" should find why in the log.
func limitInFlight(max int, what string, logger *slog.Logger, next http.Handler) http.Handler {
	l := make(chan struct{}, max)
	var busy sampledLog
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case l <- struct{}{}:
			defer func() { <-l }()
			next.ServeHTTP(w, r)
		default:
			busy.log(logger, what+": request refused: every slot is busy (503)", "max_in_flight", max, "peer", r.RemoteAddr, "path", r.URL.Path)
			CloseUnreadBody(w, r)
			unavailable(w, "busy: too many concurrent requests, retry later")
		}
	})
}

// raiseInternalErrors is RiverUILogger's handler.
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
