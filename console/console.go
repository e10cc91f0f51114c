package console

import (
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stepwise-go/stepwise"
	"github.com/stepwise-go/stepwise/internal/outbox"
	"github.com/stepwise-go/stepwise/internal/reconcile"
)

// Config configures the console. Every field is optional; a nil field hides what it enables.
type Config struct {
	// Prefix is the path the handler is mounted under, e.g. "/console" (no trailing slash).
	// Links and form actions are built with it. Default: "" (mounted at the root).
	Prefix string

	// Authenticate names the user of a request, or reports false when the request carries
	// no valid credentials. With it, every request needs credentials and actions are
	// allowed; the name is the actor of the audit trail. Without it the console is
	// read-only and answers loopback peers only. See ParseUsers (one identity per operator;
	// the choice for production) and BasicAuth (one shared account).
	//
	// Failed sign-ins are limited and logged by Guard; credentials are checked before any
	// part of a request's body is read and before the request takes one of MaxInFlight's
	// slots.
	Authenticate func(r *http.Request) (actor string, ok bool)

	// Hosts lists the names (as browsers send them in Host, with or without a port) the
	// console answers to besides this machine's loopback (localhost, 127.0.0.1, [::1]).
	// Without Authenticate, or when Hosts is set, a request for any other Host gets 421:
	// guards against DNS rebinding, where a page the operator opens re-points its own name
	// at 127.0.0.1 and reads the console as its own origin. With Authenticate and no Hosts,
	// any Host is answered (the browser never sends the operator's credentials to a
	// rebinding page's origin). Behind a proxy, list the name the proxy is reached by.
	Hosts []string

	// Guard limits and logs failed sign-ins (see Guard). Default: one per handler. Share one
	// between the surfaces of a process so an attacker does not get a budget per surface.
	Guard *Guard

	// MaxInFlight caps the requests served at once, counted after authentication (an
	// unauthenticated request never holds a slot); beyond it the console answers 503 at
	// once. Default 8.
	MaxInFlight int

	// Client is the service's Stepwise client: with it the console takes every action
	// through the client's methods, with no adapter to write. Cancel (Client.RunCancelTx),
	// Resume on failed and cancelled runs (Client.RunResumeTx, conditional on the version
	// the operator saw, with the console's audit row in the same transaction), Resolve of
	// MANUAL operations (Client.OperationResolveTx, which runs the kind's outcome callback
	// through the client's outbox) and each operation's requests
	// (Client.OperationRequestList). The pool passed to New is then the client's. Without
	// it the console only reads: a standalone console builds one with
	// stepwise.NewOperatorClient.
	Client *stepwise.Client

	// Statements enables the Totals page: the external statement of each operation kind.
	// Defaults to the Statement of each kind of Client (stepwise.KindConfig.Statement), so a
	// service's console compares what its client is configured with; set it only for a
	// console whose client has no statements (an operator client).
	Statements map[string]reconcile.Statement
	// Location is the time zone of the Totals page's dates. Default: UTC.
	Location *time.Location
	// TotalsTimeout bounds one Totals comparison (the statement and the ledger): keep it below
	// the server's WriteTimeout, or an answer that took longer is lost to it and the operator
	// sees a closed connection instead of the reason. Default 20 s (the sample's serve writes
	// for 30 s).
	TotalsTimeout time.Duration

	// PageSize is the number of rows per list page. Default 50, at most 500.
	PageSize int

	// CSRFKey signs the forms' CSRF tokens. Default: 32 random bytes per handler, so tokens
	// do not survive a restart (a form left open over a deploy is refused; reload it). Set
	// it when several processes serve the console behind one balancer.
	CSRFKey []byte

	// Logger receives internal errors (never shown to the browser) and every action.
	// Default: slog.Default().
	Logger *slog.Logger
}

// request is one request started for an operation, as the operation's page shows it.
type request struct {
	Attempt   int
	StartedAt time.Time
	EndedAt   *time.Time
	Outcome   string
	Detail    string
}

// handler is the console. It is safe for concurrent use.
type handler struct {
	db         outbox.DB
	cfg        Config
	pages      *pages
	logger     *slog.Logger
	errSeq     atomic.Int64
	now        func() time.Time // the CSRF token's clock; nil is time.Now (tests set it)
	slots      chan struct{}
	totalsGate *totalsGate
	busy       sampledLog // 503s
	unauth     sampledLog // 401s without credentials

	misdirected sampledLog // 421s
}

const (
	defaultPageSize = 50
	maxPageSize     = 500
	// defaultMaxInFlight is Config.MaxInFlight's default.
	defaultMaxInFlight = 8
	// bodyTimeout bounds reading an authenticated form's body: a form of ours arrives in one
	// packet; a client that announces a body and sends it slowly holds a slot only this long.
	bodyTimeout = 5 * time.Second
	// maxBody bounds a form: a reason and a few ids. Anything bigger is not a form of ours.
	maxBody = 16 << 10
	// maxReason bounds an action's reason: a sentence and a ticket number, not an essay.
	maxReason = 500
)

// New returns the console, an http.Handler safe for concurrent use, reading and writing
// through pool: the pool of Config.Client when there is one.
func New(pool *pgxpool.Pool, cfg *Config) (http.Handler, error) {
	if pool == nil {
		return nil, errors.New("console.New: pool is nil; pass the pool your stepwise.Client uses")
	}
	c := Config{}
	if cfg != nil {
		c = *cfg
	}
	// "//host" would make every link of the console point at another site.
	if c.Prefix != "" && (!strings.HasPrefix(c.Prefix, "/") || strings.HasPrefix(c.Prefix, "//") || strings.HasSuffix(c.Prefix, "/")) {
		return nil, fmt.Errorf("console.New: Prefix %q: want a path such as /console (leading slash, no trailing slash)", c.Prefix)
	}
	switch {
	case c.PageSize == 0:
		c.PageSize = defaultPageSize
	case c.PageSize < 1 || c.PageSize > maxPageSize:
		return nil, fmt.Errorf("console.New: PageSize %d: want 1 to %d", c.PageSize, maxPageSize)
	}
	if c.Location == nil {
		c.Location = time.UTC
	}
	switch {
	case c.TotalsTimeout == 0:
		c.TotalsTimeout = defaultTotalsTimeout
	case c.TotalsTimeout < 0:
		return nil, fmt.Errorf("console.New: TotalsTimeout %s: want a positive duration below the server's WriteTimeout, or 0 for the default %s", c.TotalsTimeout, defaultTotalsTimeout)
	}
	if len(c.Statements) == 0 && c.Client != nil {
		c.Statements = c.Client.KindStatements()
	}
	for kind, s := range c.Statements {
		if s == nil {
			return nil, fmt.Errorf("console.New: Statements[%q] is nil", kind)
		}
	}
	if len(c.CSRFKey) == 0 {
		c.CSRFKey = make([]byte, 32)
		if _, err := rand.Read(c.CSRFKey); err != nil {
			return nil, fmt.Errorf("console.New: generating the CSRF key: %w", err)
		}
	} else if len(c.CSRFKey) < 16 {
		return nil, fmt.Errorf("console.New: CSRFKey has %d bytes: want at least 16 random bytes", len(c.CSRFKey))
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if err := checkHosts(c.Hosts); err != nil {
		return nil, err
	}
	switch {
	case c.MaxInFlight == 0:
		c.MaxInFlight = defaultMaxInFlight
	case c.MaxInFlight < 0:
		return nil, fmt.Errorf("console.New: MaxInFlight %d: want 1 or more, or 0 for the default (%d)", c.MaxInFlight, defaultMaxInFlight)
	}
	if c.Guard == nil {
		c.Guard = NewGuard(c.Logger)
	}
	p, err := parsePages()
	if err != nil {
		return nil, err
	}
	return &handler{db: pool, cfg: c, pages: p, logger: c.Logger, slots: make(chan struct{}, c.MaxInFlight), totalsGate: newTotalsGate()}, nil
}

// ServeHTTP checks who is asking and whether they may, then serves the page or action.
func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	setSecurityHeaders(w)
	// A form of ours is a few hundred bytes; an unbounded body is a way to hold memory.
	r.Body = http.MaxBytesReader(w, r.Body, maxBody)

	path, ok := strings.CutPrefix(r.URL.Path, h.cfg.Prefix)
	if !ok {
		h.fail(w, r, http.StatusNotFound, "no such page: %s is outside the console's prefix %s", r.URL.Path, h.cfg.Prefix)
		return
	}
	if path == "" {
		path = "/"
	}
	// Host first: a rebinding page must learn nothing, not even whether credentials exist.
	if !h.hostAllowed(w, r) {
		return
	}
	// Credentials before anything else is read or held: an unauthenticated client (one that
	// announces a body and never sends it, say) is answered at once and takes no slot.
	v, ok := h.authorize(w, r)
	if !ok {
		return
	}
	// The slots bound what authenticated requests cost at once (each may query the database).
	select {
	case h.slots <- struct{}{}:
		defer func() { <-h.slots }()
	default:
		h.busy.log(h.logger, "console: request refused: every slot is busy (503)", "max_in_flight", h.cfg.MaxInFlight, "actor", v.Actor, "path", r.URL.Path)
		w.Header().Set("Retry-After", "1")
		h.fail(w, r, http.StatusServiceUnavailable, "busy: %d requests are being served; retry in a moment", h.cfg.MaxInFlight)
		return
	}
	switch r.Method {
	case http.MethodGet, http.MethodHead:
		// r.URL.Query() drops what it cannot parse: "state=MANUAL&%%" would quietly list
		// everything, and an operator would act on the wrong list.
		if _, err := url.ParseQuery(r.URL.RawQuery); err != nil {
			h.fail(w, r, http.StatusBadRequest, "malformed query string: %v", err)
			return
		}
		h.serveRead(w, r, v, path)
	case http.MethodPost:
		if !h.authorizeAction(w, r, v) {
			return
		}
		h.serveAction(w, r, v, path)
	default:
		w.Header().Set("Allow", "GET, HEAD, POST")
		h.fail(w, r, http.StatusMethodNotAllowed, "method %s: the console answers GET, and POST for its forms", r.Method)
	}
}

func (h *handler) serveRead(w http.ResponseWriter, r *http.Request, v *viewer, path string) {
	switch path {
	case "/":
		h.overview(w, r, v)
	case "/runs":
		h.runs(w, r, v)
	case "/run":
		h.run(w, r, v)
	case "/operations":
		h.operations(w, r, v)
	case "/operation":
		h.operation(w, r, v)
	case "/totals":
		h.totals(w, r, v)
	case "/audit":
		h.audit(w, r, v)
	default:
		h.fail(w, r, http.StatusNotFound, "no such page %q: see the overview at %s/", path, h.cfg.Prefix)
	}
}

func (h *handler) serveAction(w http.ResponseWriter, r *http.Request, v *viewer, path string) {
	switch path {
	case "/run/cancel":
		h.cancelRun(w, r, v)
	case "/run/resume":
		h.resumeRun(w, r, v)
	case "/operation/resolve":
		h.resolveOperation(w, r, v)
	default:
		h.fail(w, r, http.StatusNotFound, "no such action %q", path)
	}
}

// setSecurityHeaders: no script may run, nothing is fetched from elsewhere, no other site may
// frame the console (clickjacking an action button), and no page is cached by a shared proxy.
func setSecurityHeaders(w http.ResponseWriter) {
	hd := w.Header()
	hd.Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("X-Frame-Options", "DENY")
	hd.Set("Referrer-Policy", "same-origin")
	hd.Set("Cache-Control", "no-store")
}

// fail answers a client error with a page that says what was wrong and how to fix it.
func (h *handler) fail(w http.ResponseWriter, r *http.Request, status int, format string, args ...any) {
	if r.PostForm == nil {
		// The body was never read (a refusal before the form): hang up after the answer.
		CloseUnreadBody(w, r)
	}
	h.renderError(w, r, status, fmt.Sprintf(format, args...))
}

// internal answers a server-side failure without its details (which may name hosts, users
// or SQL), and logs them under a reference the operator can quote.
func (h *handler) internal(w http.ResponseWriter, r *http.Request, what string, err error) {
	ref := h.errSeq.Add(1)
	h.logger.Error("console: "+what, "ref", ref, "path", r.URL.Path, "error", err)
	h.renderError(w, r, http.StatusInternalServerError,
		fmt.Sprintf("internal error while %s (reference %d): the details are in the server's log", what, ref))
}
