package console

import (
	"bufio"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/netip"
	"os"
	"sort"
	"strings"
	"sync"
	"time"
	"unicode"

	"golang.org/x/crypto/bcrypt"
)

// users is a list of operators, each with a name and a bcrypt hash of their password: one
// identity per person, so that the audit trail says who resolved a payout, not which shared
// account did. Its authenticate checks HTTP basic-auth credentials against the list, at the
// cost ParseUsers describes; an unknown name costs the same comparison as a known one (no
// timing signal for "this operator exists").
type users struct {
	hashes map[string][]byte
	dummy  []byte // a hash compared for unknown names

	mu     sync.Mutex
	key    []byte
	passed map[[sha256.Size]byte]time.Time // HMAC(name, password) → until when it is trusted
	now    func() time.Time
}

const (
	// minBcryptCost is the cheapest hash a users list accepts: below it a stolen file is cracked fast.
	minBcryptCost = 10
	// usersCacheTTL is how long a passed name and password skip bcrypt.
	usersCacheTTL = 5 * time.Minute
	// usersCacheMax bounds the remembered passes (one per operator and password in use).
	usersCacheMax = 1024
	// maxNameLen bounds an operator's name: it goes verbatim into the audit trail.
	maxNameLen = 200
)

// loadUsers reads a users file: one operator per line, "name:bcrypt-hash" (the format
// "htpasswd -nBC 12 name" prints); blank lines and lines starting with # are ignored.
func loadUsers(path string) (*users, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("console: reading the users file: %w", err)
	}
	defer f.Close()
	return parseUsers(f, path)
}

// ParseUsers reads a list of operators from r, one per line as "name:bcrypt-hash" (what
// "htpasswd -nBC 12 NAME" prints; cost 10 or more; blank lines and lines starting with # are
// ignored), and returns a Config.Authenticate that checks HTTP basic-auth credentials
// against it: one identity per operator, so that the audit trail names the person. source
// names the list in errors. CONSOLE_USERS (LoadAuth) reads a file this way. On an error it
// returns nil: a Config with a nil Authenticate is the read-only, loopback-only console.
//
// A check costs one bcrypt comparison (tens of milliseconds by design); a name and password
// that passed are remembered for a few minutes (as an HMAC under a per-process key, never the
// password itself), so a page load does not pay it again. A failed check is never remembered,
// and an unknown name costs the same comparison as a known one.
func ParseUsers(r io.Reader, source string) (func(*http.Request) (string, bool), error) {
	u, err := parseUsers(r, source)
	if err != nil {
		return nil, err
	}
	return u.authenticate, nil
}

// parseUsers reads a users list (see ParseUsers) from r.
func parseUsers(r io.Reader, source string) (*users, error) {
	u := &users{hashes: map[string][]byte{}, passed: map[[sha256.Size]byte]time.Time{}, now: time.Now}
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, hash, ok := strings.Cut(line, ":")
		switch {
		case !ok || name == "" || hash == "":
			return nil, fmt.Errorf("console: %s line %d: want name:bcrypt-hash (make one with: htpasswd -nBC 12 NAME)", source, n)
		case len(name) > maxNameLen || strings.IndexFunc(name, unicode.IsControl) >= 0 || strings.ContainsAny(name, " \t"):
			return nil, fmt.Errorf("console: %s line %d: the name is longer than %d bytes or holds spaces or control characters; it names the actor in the audit trail", source, n, maxNameLen)
		case u.hashes[name] != nil:
			return nil, fmt.Errorf("console: %s line %d: %q is listed twice; one line per operator", source, n, name)
		}
		cost, err := bcrypt.Cost([]byte(hash))
		if err != nil {
			return nil, fmt.Errorf("console: %s line %d (%s): not a bcrypt hash (%v); make one with: htpasswd -nBC 12 %s", source, n, name, err, name)
		}
		if cost < minBcryptCost {
			return nil, fmt.Errorf("console: %s line %d (%s): bcrypt cost %d is too cheap to stand a stolen file; want %d or more: htpasswd -nBC 12 %s", source, n, name, cost, minBcryptCost, name)
		}
		u.hashes[name] = []byte(hash)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("console: reading %s: %w", source, err)
	}
	if len(u.hashes) == 0 {
		return nil, fmt.Errorf("console: %s lists no operator: want one name:bcrypt-hash line per operator", source)
	}
	u.key = make([]byte, 32)
	if _, err := rand.Read(u.key); err != nil {
		return nil, fmt.Errorf("console: generating the users cache key: %w", err)
	}
	dummy, err := bcrypt.GenerateFromPassword(u.key[:16], minBcryptCost)
	if err != nil {
		return nil, fmt.Errorf("console: generating the unknown-name hash: %w", err)
	}
	u.dummy = dummy
	return u, nil
}

// names lists the operators, sorted.
func (u *users) names() []string {
	out := make([]string, 0, len(u.hashes))
	for n := range u.hashes {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// authenticate is a Config.Authenticate: the basic-auth name, when its password matches.
func (u *users) authenticate(r *http.Request) (string, bool) {
	name, password, ok := r.BasicAuth()
	if !ok || name == "" || len(name) > maxNameLen || len(password) > 1024 {
		return "", false
	}
	m := hmac.New(sha256.New, u.key)
	m.Write([]byte(name))
	m.Write([]byte{0})
	m.Write([]byte(password))
	var sum [sha256.Size]byte
	copy(sum[:], m.Sum(nil))
	now := u.now()
	u.mu.Lock()
	until, seen := u.passed[sum]
	u.mu.Unlock()
	if seen && now.Before(until) {
		return name, true
	}
	hash, known := u.hashes[name]
	if !known {
		hash = u.dummy
	}
	if bcrypt.CompareHashAndPassword(hash, []byte(password)) != nil || !known {
		return "", false
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	if len(u.passed) >= usersCacheMax {
		for k, t := range u.passed {
			if !now.Before(t) || len(u.passed) >= usersCacheMax {
				delete(u.passed, k)
			}
		}
	}
	u.passed[sum] = now.Add(usersCacheTTL)
	return name, true
}

// Guard limits failed sign-ins, per peer and in all, and logs them. Guards against
// unlimited password guessing (measured before it existed: 97,318 guesses in 20 s from one
// client, none logged).
//
//   - Per peer (an IP address; an IPv6 peer by its /64, which one host owns whole): the
//     first 5 failures cost nothing more; each one after locks the peer out for twice as
//     long as the last, from 1 s up to a minute. A peer's failures are forgotten after 15
//     minutes without one, or on a sign-in that passes. Past its free
//     failures a peer gets one check at a time (concurrent guesses do not all slip through
//     before the first fails).
//   - In all: at most 60 failures a minute from every peer together (a
//     burst of as many); beyond, every sign-in is refused until the budget refills. Guards
//     against guessing spread over many addresses. A check takes its unit before it runs
//     and gives it back when it passes, so concurrent checks cannot overdraw the budget.
//
// While locked out, a request's credentials are not checked at all, even right ones:
// otherwise the lockout would still answer "right" or "wrong" to each guess. The answer is
// 429 with Retry-After. Every failure is logged (name tried, peer, count; never the
// password), and the first refusal of each lockout.
//
// One Guard can serve several surfaces (serve shares one between the console and River UI),
// so that an attacker does not get a budget per surface.
type Guard struct {
	logger *slog.Logger
	now    func() time.Time

	mu         sync.Mutex
	proxies    []netip.Prefix // see TrustProxies
	peers      map[string]*peerFailures
	tokens     float64 // global failure budget left
	refilled   time.Time
	globalLock bool // the global budget ran out (logged once per episode)
}

type peerFailures struct {
	n           int // failures
	inflight    int // checks let through by wait, not yet failed or succeeded
	last        time.Time
	lockedUntil time.Time
	refusals    int // refused while locked, since the lockout began
}

// The Guard's limits, as its doc gives them.
const (
	guardFreeFailures    = 5
	guardMaxLockout      = time.Minute
	guardForget          = 15 * time.Minute
	guardGlobalPerMinute = 60
	guardMaxPeers        = 10_000
)

// NewGuard returns a Guard logging to logger (default slog.Default()).
func NewGuard(logger *slog.Logger) *Guard {
	if logger == nil {
		logger = slog.Default()
	}
	return &Guard{logger: logger, now: time.Now, peers: map[string]*peerFailures{}, tokens: guardGlobalPerMinute}
}

// TrustProxies makes the Guard count a request relayed by one of proxies (addresses or CIDR
// prefixes: a reverse proxy or load balancer in front) against the client the proxy names in
// X-Forwarded-For (the rightmost address that is not itself a listed proxy), not against the
// proxy. Guards against: behind a proxy every visitor shares the proxy's address, and five
// wrong passwords from anyone would lock every operator out. Call it before use.
func (g *Guard) TrustProxies(proxies []string) error {
	nets, err := parsePrefixes(proxies)
	if err != nil {
		return fmt.Errorf("trusted proxies: %w", err)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.proxies = nets
	return nil
}

// peerKey is who a failure is counted against: the peer's IP (or, from a trusted proxy, the
// client it forwards), an IPv6 one by its /64.
func (g *Guard) peerKey(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	addr, err := netip.ParseAddr(host)
	if err != nil {
		return host
	}
	addr = addr.Unmap().WithZone("")
	g.mu.Lock()
	proxies := g.proxies
	g.mu.Unlock()
	if inPrefixes(addr, proxies) {
		// X-Forwarded-For: client, proxy1, proxy2 — each proxy appends its peer; entries left
		// of the last untrusted one are the client's to forge.
		hops := strings.Split(strings.Join(r.Header.Values("X-Forwarded-For"), ","), ",")
		for i := len(hops) - 1; i >= 0; i-- {
			a, err := netip.ParseAddr(strings.TrimSpace(hops[i]))
			if err != nil {
				break
			}
			if a = a.Unmap().WithZone(""); !inPrefixes(a, proxies) {
				addr = a
				break
			}
		}
	}
	if addr.Is6() {
		p, _ := addr.Prefix(64)
		return p.String()
	}
	return addr.String()
}

// parsePrefixes reads addresses and CIDR prefixes.
func parsePrefixes(list []string) ([]netip.Prefix, error) {
	out := make([]netip.Prefix, 0, len(list))
	for _, t := range list {
		p, err := netip.ParsePrefix(t)
		if err != nil {
			a, aerr := netip.ParseAddr(t)
			if aerr != nil {
				return nil, fmt.Errorf("trusted proxy %q: want an address or a CIDR prefix (10.0.0.0/24)", t)
			}
			p = netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen())
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

func inPrefixes(a netip.Addr, nets []netip.Prefix) bool {
	for _, n := range nets {
		if n.Contains(a) {
			return true
		}
	}
	return false
}

// refill adds the budget earned since the last call. Called with mu held.
func (g *Guard) refill(now time.Time) {
	if !g.refilled.IsZero() {
		g.tokens = math.Min(guardGlobalPerMinute, g.tokens+now.Sub(g.refilled).Minutes()*guardGlobalPerMinute)
	}
	g.refilled = now
}

// wait reports how long r's peer (or everyone) must wait before its credentials are
// checked again; 0: check them now. A refusal is logged once per lockout.
//
// A request that carries credentials (an Authorization header) and is let through holds a
// reservation until failed or succeeded: one unit of the global budget, and its peer's
// place in line. Guards against a burst of concurrent guesses all passing the check before
// the first of them fails: the global budget is spent up front, and a peer past its free
// failures gets one check at a time.
func (g *Guard) wait(r *http.Request) time.Duration {
	now := g.now()
	key := g.peerKey(r)
	g.mu.Lock()
	defer g.mu.Unlock()
	g.refill(now)
	p := g.peers[key]
	if p != nil && now.Before(p.lockedUntil) {
		p.refusals++
		if p.refusals == 1 {
			g.logger.Warn("console: sign-in refused without checking: too many failed sign-ins from this peer",
				"peer", key, "failures", p.n, "locked_for", p.lockedUntil.Sub(now).Round(time.Millisecond), "path", r.URL.Path)
		}
		return p.lockedUntil.Sub(now)
	}
	if g.tokens < 1 {
		wait := time.Duration((1 - g.tokens) / guardGlobalPerMinute * float64(time.Minute))
		if !g.globalLock {
			g.globalLock = true
			g.logger.Warn("console: every sign-in refused for now: more than the failed sign-ins allowed a minute, from all peers together",
				"allowed_per_minute", guardGlobalPerMinute, "peer", key, "retry_after", wait.Round(time.Millisecond))
		}
		return max(wait, time.Second)
	}
	g.globalLock = false
	if !carriesCredentials(r) {
		return 0
	}
	if p == nil {
		p = g.peer(key, now)
	}
	if p.inflight > 0 && p.n+p.inflight >= guardFreeFailures {
		return time.Second // past the free failures: one check at a time
	}
	p.inflight++
	g.tokens--
	return 0
}

// carriesCredentials: the request holds a Guard reservation from wait (see wait).
func carriesCredentials(r *http.Request) bool { return r.Header.Get("Authorization") != "" }

// peer returns key's record, made if need be. Called with mu held.
func (g *Guard) peer(key string, now time.Time) *peerFailures {
	if p := g.peers[key]; p != nil {
		if p.n > 0 && now.Sub(p.last) > guardForget {
			p.n, p.lockedUntil = 0, time.Time{}
		}
		return p
	}
	if len(g.peers) >= guardMaxPeers {
		g.sweep(now)
	}
	p := &peerFailures{}
	if len(g.peers) < guardMaxPeers {
		// Beyond the cap a peer is limited by the global budget only.
		g.peers[key] = p
	}
	return p
}

// failed records and logs a failed sign-in of name (as sent) from r's peer.
func (g *Guard) failed(r *http.Request, name string) {
	now := g.now()
	key := g.peerKey(r)
	g.mu.Lock()
	defer g.mu.Unlock()
	g.refill(now)
	p := g.peer(key, now)
	if carriesCredentials(r) {
		p.inflight = max(p.inflight-1, 0) // its budget unit was spent in wait
	} else {
		g.tokens = max(g.tokens-1, 0)
	}
	p.n++
	p.last = now
	var lock time.Duration
	if p.n > guardFreeFailures {
		lock = min(time.Second<<min(p.n-guardFreeFailures-1, 30), guardMaxLockout)
		p.lockedUntil = now.Add(lock)
		p.refusals = 0
	}
	if len(name) > 64 {
		name = name[:64] + "…"
	}
	g.logger.Warn("console: sign-in failed", "user", fmt.Sprintf("%q", name), "peer", key, "path", r.URL.Path,
		"failures", p.n, "locked_for", lock)
}

// succeeded forgets r's peer's failures and gives back the reservation of wait.
func (g *Guard) succeeded(r *http.Request) {
	key := g.peerKey(r)
	g.mu.Lock()
	defer g.mu.Unlock()
	if carriesCredentials(r) {
		g.tokens = min(g.tokens+1, guardGlobalPerMinute)
	}
	p := g.peers[key]
	if p == nil {
		return
	}
	p.inflight = max(p.inflight-1, 0)
	p.n, p.lockedUntil = 0, time.Time{}
	if p.inflight == 0 {
		delete(g.peers, key)
	}
}

// sweep drops peers whose failures are forgotten. Called with mu held.
func (g *Guard) sweep(now time.Time) {
	for k, p := range g.peers {
		if p.inflight == 0 && now.Sub(p.last) > guardForget && !now.Before(p.lockedUntil) {
			delete(g.peers, k)
		}
	}
}

// allowedHost reports whether host (a request's Host: name or address, with or without a
// port) names this machine's loopback — localhost, 127.0.0.0/8, ::1 — or is listed. A listed
// entry with a port matches that port only; one without, any port.
//
// Guards against DNS rebinding: a page the operator opens at http://evil.example:8080 has
// its name re-pointed at 127.0.0.1, and the browser then lets that page read whatever answers
// there — the console, River UI's API, /metrics — as "its own origin". The browser still
// sends Host: evil.example:8080, which is never one of ours.
func allowedHost(host string, listed []string) bool {
	name, _, err := net.SplitHostPort(host)
	if err != nil {
		name = host // no port
	}
	name = strings.ToLower(strings.TrimSuffix(strings.TrimPrefix(name, "["), "]"))
	if name == "localhost" {
		return true
	}
	if ip := net.ParseIP(name); ip != nil && ip.IsLoopback() {
		return true
	}
	for _, l := range listed {
		l = strings.ToLower(l)
		if strings.EqualFold(l, host) || l == name || strings.Trim(l, "[]") == name {
			return true
		}
	}
	return false
}

// checkHosts refuses list entries that cannot be a Host header: a URL, a path, a wildcard.
func checkHosts(list []string) error {
	for _, h := range list {
		if h == "" || strings.ContainsAny(h, "/*@ \t") || strings.Contains(h, "://") {
			return fmt.Errorf("console.New: Hosts entry %q: want a host name or address as browsers send it in Host, with or without a port (e.g. ops.example.com or ops.example.com:8443)", h)
		}
	}
	return nil
}

// ProxyUser returns a Config.Authenticate for a console behind an authenticating reverse
// proxy (oauth2-proxy, an identity-aware proxy, a web server doing SSO): the operator's name
// is the value of header (e.g. X-Forwarded-User), believed only on a request whose TCP peer
// is one of trusted (addresses or CIDR prefixes: the proxy's). A request from any other peer,
// or without the header, is not authenticated.
//
// Only correct when the proxy sets header itself on every request and removes any copy the
// client sent, and when nothing but the proxy can reach the console's address (bind it to
// loopback or a private interface): whoever reaches it from a trusted address names
// themselves. The name goes into the audit trail verbatim, so one with control characters
// or over 200 bytes is refused.
func ProxyUser(header string, trusted []string) (func(*http.Request) (string, bool), error) {
	if header == "" || strings.ContainsAny(header, " :\t") {
		return nil, fmt.Errorf("console.ProxyUser: header %q: want a header name such as X-Forwarded-User", header)
	}
	if len(trusted) == 0 {
		return nil, errors.New("console.ProxyUser: no trusted proxy: list the proxy's addresses (e.g. 127.0.0.1 or 10.0.0.0/24)")
	}
	nets, err := parsePrefixes(trusted)
	if err != nil {
		return nil, fmt.Errorf("console.ProxyUser: %w", err)
	}
	return func(r *http.Request) (string, bool) {
		ap, err := netip.ParseAddrPort(r.RemoteAddr)
		if err != nil {
			return "", false
		}
		trustedPeer := inPrefixes(ap.Addr().Unmap(), nets)
		vals := r.Header.Values(header)
		if !trustedPeer || len(vals) != 1 {
			return "", false // a second copy: the client's, passed on by a proxy that appends
		}
		name := strings.TrimSpace(vals[0])
		if name == "" || len(name) > maxNameLen || strings.IndexFunc(name, unicode.IsControl) >= 0 {
			return "", false
		}
		return name, true
	}, nil
}
