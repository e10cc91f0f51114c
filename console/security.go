package console

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"
)

// viewer is who is asking: Actor is empty for an anonymous loopback reader.
type viewer struct {
	Actor string
	CSRF  string
}

// CanAct reports whether the viewer may see action forms.
func (v *viewer) CanAct() bool { return v.Actor != "" }

// BasicAuth returns an Authenticate function accepting HTTP basic-auth credentials equal
// to user and password (compared in constant time). The actor is user. It panics if user or
// password is empty: an empty password would be a console open to anyone who guesses that.
func BasicAuth(user, password string) func(*http.Request) (string, bool) {
	if user == "" || password == "" {
		panic("console.BasicAuth: user and password must both be set")
	}
	return func(r *http.Request) (string, bool) {
		u, p, ok := r.BasicAuth()
		if !ok {
			return "", false
		}
		// Both compared whatever the first gives: no timing signal for "user exists".
		okU := subtle.ConstantTimeCompare([]byte(u), []byte(user))
		okP := subtle.ConstantTimeCompare([]byte(p), []byte(password))
		return user, okU&okP == 1
	}
}

// authorize decides whether the request may read at all, and names its viewer.
func (h *handler) authorize(w http.ResponseWriter, r *http.Request) (*viewer, bool) {
	if h.cfg.Authenticate == nil {
		// Read-only without credentials, and only for this host's own users: anyone who can
		// reach a wider bind would otherwise read every payout and business key.
		if !loopbackPeer(r) {
			h.fail(w, r, http.StatusForbidden, "the console has no credentials configured, so it answers loopback only (and not through a proxy): configure Config.Authenticate (the sample: CONSOLE_USER and CONSOLE_PASSWORD)")
			return nil, false
		}
		return &viewer{}, true
	}
	// A locked-out peer's credentials are not even checked: a lockout that still answered
	// right or wrong would not stop guessing.
	if wait := h.cfg.Guard.wait(r); wait > 0 {
		secs := int((wait + time.Second - 1) / time.Second)
		w.Header().Set("Retry-After", strconv.Itoa(secs))
		h.fail(w, r, http.StatusTooManyRequests, "too many failed sign-ins: credentials are not checked for %d s; the attempts are in the server's log", secs)
		return nil, false
	}
	actor, ok := h.cfg.Authenticate(r)
	if !ok {
		if name, _, sent := r.BasicAuth(); sent || r.Header.Get("Authorization") != "" {
			h.cfg.Guard.failed(r, name)
		} else {
			// A browser's first request carries none (the 401 makes it ask): not a failure.
			h.unauth.logAt(h.logger, slog.LevelInfo, "console: request without credentials refused (401)", "peer", r.RemoteAddr, "path", r.URL.Path)
		}
		w.Header().Set("WWW-Authenticate", `Basic realm="stepwise console", charset="UTF-8"`)
		h.fail(w, r, http.StatusUnauthorized, "credentials required")
		return nil, false
	}
	h.cfg.Guard.succeeded(r)
	// The actor goes into the audit trail verbatim: a newline or control character there
	// could forge a second line in a log or a report.
	if actor == "" || len(actor) > 200 || strings.IndexFunc(actor, unicode.IsControl) >= 0 {
		h.fail(w, r, http.StatusForbidden, "the authenticated user's name is empty, longer than 200 bytes or holds control characters; it cannot name an actor in the audit trail")
		return nil, false
	}
	return &viewer{Actor: actor, CSRF: h.csrfToken(actor)}, true
}

// authorizeAction checks what a change needs beyond reading: credentials, a request made by
// a page of this origin, and the CSRF token of a form this console rendered for this user.
func (h *handler) authorizeAction(w http.ResponseWriter, r *http.Request, v *viewer) bool {
	if !v.CanAct() {
		// Anonymous loopback readers cannot act: the audit trail must name a person.
		h.fail(w, r, http.StatusForbidden, "the console is read-only without credentials: configure Config.Authenticate (the sample: CONSOLE_USER and CONSOLE_PASSWORD) to act")
		return false
	}
	// Same origin: a page on another site can make the browser POST here with the user's
	// basic-auth credentials attached (CSRF); browsers say where a request comes from in
	// Sec-Fetch-Site and Origin, which a page cannot forge.
	if !sameOrigin(r) {
		h.fail(w, r, http.StatusForbidden, "cross-origin request refused: actions are accepted only from the console's own pages (Sec-Fetch-Site same-origin, or an Origin equal to %s); from a script, send the header Origin: http://%s", r.Host, r.Host)
		return false
	}
	// The body is read only now, from an authenticated same-origin request, and within
	// bodyTimeout: a client that announces a body and dribbles it holds its slot that long,
	// not the server's whole read timeout. (ErrNotSupported, from a test recorder, leaves the
	// server's own timeout.)
	_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(bodyTimeout))
	// The CSRF token as well: it also stops an old browser that sends neither header, and a
	// same-site page of another application on this host.
	if err := r.ParseForm(); err != nil {
		h.logger.Warn("console: unreadable form", "actor", v.Actor, "peer", r.RemoteAddr, "path", r.URL.Path, "error", err)
		h.fail(w, r, http.StatusBadRequest, "unreadable form (at most %d bytes, sent within %s): %v", maxBody, bodyTimeout, err)
		return false
	}
	if !h.csrfValid(v.Actor, r.PostForm.Get("csrf")) {
		h.fail(w, r, http.StatusForbidden, "missing or stale CSRF token: reload the page and submit the form again")
		return false
	}
	return true
}

// csrfWindow is how often the CSRF token rotates. A token is bound to the user and to its
// window; the previous window's token is still accepted (the grace for a page rendered just
// before the rotation), so a token lives between one and two windows. Guards against a token
// that leaked (a screenshot, a log, a shared page's source) staying good until the next
// restart, as a token bound to the user alone did.
const csrfWindow = time.Hour

// csrfToken is the user's token of the current window: a token seen by one user is no use to
// another, nor to anyone after two windows.
func (h *handler) csrfToken(actor string) string {
	return h.csrfTokenAt(actor, h.csrfNow())
}

func (h *handler) csrfNow() int64 {
	now := time.Now
	if h.now != nil {
		now = h.now
	}
	return now().Unix() / int64(csrfWindow/time.Second)
}

func (h *handler) csrfTokenAt(actor string, window int64) string {
	m := hmac.New(sha256.New, h.cfg.CSRFKey)
	m.Write([]byte("stepwise-console-csrf\x00"))
	m.Write([]byte(actor))
	m.Write([]byte("\x00" + strconv.FormatInt(window, 10)))
	return hex.EncodeToString(m.Sum(nil))
}

// csrfValid accepts the user's token of this window or the previous one (compared in
// constant time).
func (h *handler) csrfValid(actor, got string) bool {
	w := h.csrfNow()
	cur := subtle.ConstantTimeCompare([]byte(got), []byte(h.csrfTokenAt(actor, w)))
	prev := subtle.ConstantTimeCompare([]byte(got), []byte(h.csrfTokenAt(actor, w-1)))
	return cur|prev == 1
}

// sameOrigin: Sec-Fetch-Site when the browser sends it; otherwise Origin's host must be the
// request's; neither is a refusal (every current browser sends Origin on a form POST).
func sameOrigin(r *http.Request) bool {
	if s := r.Header.Get("Sec-Fetch-Site"); s != "" {
		if s != "same-origin" {
			return false
		}
	}
	o := r.Header.Get("Origin")
	if o == "" {
		return r.Header.Get("Sec-Fetch-Site") == "same-origin"
	}
	u, err := url.Parse(o)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return false // includes "null": a sandboxed frame or a file
	}
	return strings.EqualFold(u.Host, r.Host)
}

// loopbackPeer: the TCP peer is this host and no proxy says it forwards someone else.
func loopbackPeer(r *http.Request) bool {
	if r.Header.Get("X-Forwarded-For") != "" || r.Header.Get("Forwarded") != "" || r.Header.Get("X-Real-Ip") != "" {
		return false
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// hostAllowed answers 421 to a request whose Host is neither loopback nor listed in
// Config.Hosts, when the console checks Host (see Config.Hosts). Guards against DNS
// rebinding (see allowedHost).
func (h *handler) hostAllowed(w http.ResponseWriter, r *http.Request) bool {
	if h.cfg.Authenticate != nil && len(h.cfg.Hosts) == 0 {
		return true
	}
	if allowedHost(r.Host, h.cfg.Hosts) {
		return true
	}
	h.misdirected.log(h.logger, "console: request for a host that is not ours refused (421): a DNS-rebinding page, or a name missing from Config.Hosts",
		"host", fmt.Sprintf("%.100q", r.Host), "peer", r.RemoteAddr, "path", r.URL.Path)
	h.fail(w, r, http.StatusMisdirectedRequest, "the console does not answer to the host %.100q: it answers localhost, 127.0.0.1 and [::1], and the names listed in Config.Hosts (the sample: --allowed-host). Open it by one of those names; if this name is yours, list it", r.Host)
	return false
}

// sampledLog logs a repeated event at most once every 10 s, with how many were not logged.
// Guards against a flood of refusals flooding the log as well.
type sampledLog struct {
	mu      sync.Mutex
	last    time.Time
	dropped int
}

func (s *sampledLog) log(l *slog.Logger, msg string, args ...any) {
	s.logAt(l, slog.LevelWarn, msg, args...)
}

func (s *sampledLog) logAt(l *slog.Logger, level slog.Level, msg string, args ...any) {
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
	l.Log(context.Background(), level, msg, append(args, "not_logged_since_last", dropped)...)
}
