package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/bcrypt"

	"github.com/stepwise-go/stepwise/console"
	"github.com/stepwise-go/stepwise/workflowtest"
	"github.com/stepwise-go/stepwise/workflowtest/fakebank"
)

// The operator's HTTP surface is read-only without credentials; changes to River's jobs need
// RIVERUI_USER / RIVERUI_PASSWORD, and are refused outright when those are not configured.
// Once credentials exist, reads need them too, and a write must be a same-origin JSON
// request (CSRF: a foreign page must not make a logged-in browser re-run a job).
func TestRiverUIWritesNeedCredentials(t *testing.T) {
	t.Parallel()
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	tests := []struct {
		name             string
		user, password   string // configured
		method           string
		sendUser, sendPw string // sent; empty: no Authorization header
		headers          map[string]string
		want             int
	}{
		{name: "read without credentials", user: "ops", password: "pw", method: http.MethodGet, want: http.StatusUnauthorized},
		{name: "read with credentials", user: "ops", password: "pw", method: http.MethodGet, sendUser: "ops", sendPw: "pw", want: http.StatusOK},
		{name: "read, none configured", method: http.MethodGet, want: http.StatusOK},
		{name: "write, none configured", method: http.MethodPost, sendUser: "ops", sendPw: "pw", want: http.StatusForbidden},
		{name: "write without credentials", user: "ops", password: "pw", method: http.MethodPost, want: http.StatusUnauthorized},
		{name: "write, wrong password", user: "ops", password: "pw", method: http.MethodPost, sendUser: "ops", sendPw: "nope", want: http.StatusUnauthorized},
		{name: "write, wrong user", user: "ops", password: "pw", method: http.MethodDelete, sendUser: "eve", sendPw: "pw", want: http.StatusUnauthorized},
		{name: "write with credentials", user: "ops", password: "pw", method: http.MethodPost, sendUser: "ops", sendPw: "pw",
			headers: map[string]string{"Content-Type": "application/json"}, want: http.StatusOK},
		{name: "same-origin write from the page", user: "ops", password: "pw", method: http.MethodPost, sendUser: "ops", sendPw: "pw",
			headers: map[string]string{"Content-Type": "application/json", "Origin": "http://example.com", "Sec-Fetch-Site": "same-origin"}, want: http.StatusOK},
		{name: "text/plain write (CSRF form)", user: "ops", password: "pw", method: http.MethodPost, sendUser: "ops", sendPw: "pw",
			headers: map[string]string{"Content-Type": "text/plain"}, want: http.StatusForbidden},
		{name: "write from another origin", user: "ops", password: "pw", method: http.MethodPost, sendUser: "ops", sendPw: "pw",
			headers: map[string]string{"Content-Type": "application/json", "Origin": "http://evil.example"}, want: http.StatusForbidden},
		{name: "cross-site write", user: "ops", password: "pw", method: http.MethodPost, sendUser: "ops", sendPw: "pw",
			headers: map[string]string{"Content-Type": "application/json", "Sec-Fetch-Site": "cross-site"}, want: http.StatusForbidden},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := readOnlyUnlessAuthorized(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				auth := &operatorAuth{RiverUser: tt.user, RiverPassword: tt.password, Guard: console.NewGuard(quietLogger())}
				console.Protect(ok, "River UI", auth, 4, quietLogger()).ServeHTTP(w, r)
			}))
			req := httptest.NewRequest(tt.method, "/riverui/api/jobs/cancel", nil)
			if tt.sendUser != "" {
				req.SetBasicAuth(tt.sendUser, tt.sendPw)
			}
			for k, v := range tt.headers {
				req.Header.Set(k, v)
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			require.Equal(t, tt.want, rec.Code)
		})
	}

	// Outside /riverui/ nothing but reads is served, credentials or not.
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodPost, "/metrics", nil)
	req.SetBasicAuth("ops", "pw")
	readOnlyUnlessAuthorized(ok).ServeHTTP(rec, req)
	require.Equal(t, http.StatusMethodNotAllowed, rec.Code)
}

// BenchmarkScrape is the CPU one /metrics request costs the serve process, with the families
// of a real serve process's registry (Go and process collectors included): "encoded" is what
// serve answers with (the last gather's bytes), "promhttp" what it answered with before
// (encoding and gzipping the families per request).
func BenchmarkScrape(b *testing.B) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	g := newCachedGatherer(reg, time.Hour, quietLogger())
	g.gatherOnce()
	close(g.ready)
	mfs, err := reg.Gather()
	if err != nil {
		b.Fatal(err)
	}
	fixed := prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) { return mfs, nil })
	for _, h := range []struct {
		name string
		h    http.Handler
	}{
		{"encoded", g},
		{"promhttp", promhttp.HandlerFor(fixed, promhttp.HandlerOpts{})},
	} {
		b.Run(h.name, func(b *testing.B) {
			req := httptest.NewRequest(http.MethodGet, "/metrics", nil)
			req.Header.Set("Accept-Encoding", "gzip")
			for b.Loop() {
				rec := httptest.NewRecorder()
				h.h.ServeHTTP(rec, req)
				if rec.Code != http.StatusOK {
					b.Fatal(rec.Code)
				}
			}
		})
	}
}

// A server error of a handler serve does not own (River UI) reaches the caller as a generic
// body; what the handler wrote goes to the log. Below 500 the handler's answer passes as is.
func TestGenericServerErrors(t *testing.T) {
	t.Parallel()
	var logged bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&logged, nil))
	secret := `connecting to host=10.0.0.5 user=payments database=ledger: FATAL: password authentication failed`
	h := console.Protect(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/fail":
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Content-Length", "999")
			w.WriteHeader(http.StatusInternalServerError)
			_, _ = io.WriteString(w, `{"message":"`+secret+`"}`)
		case "/missing":
			http.Error(w, "job 42 not found", http.StatusNotFound)
		default:
			_, _ = io.WriteString(w, "fine")
		}
	}), "River UI", &operatorAuth{}, 4, logger)

	for path, want := range map[string]struct {
		code int
		body string
	}{
		"/fail":    {http.StatusInternalServerError, "Internal Server Error: the details are in the server's log\n"},
		"/missing": {http.StatusNotFound, "job 42 not found\n"},
		"/ok":      {http.StatusOK, "fine"},
	} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		require.Equal(t, want.code, rec.Code, path)
		require.Equal(t, want.body, rec.Body.String(), path)
	}
	require.Contains(t, logged.String(), "password authentication failed", "the detail is in the log")
	require.Contains(t, logged.String(), "path=/fail")
}

// Passwords of the operator-surface tests (long enough for serve's minimum).
const (
	alicePassword = "alice-password-for-tests"
	bobPassword   = "bob-password-for-tests"
	riverPassword = "river-password-for-tests"
)

// writeUsersFile writes a CONSOLE_USERS file with a bcrypt hash (cost 10) per operator.
func writeUsersFile(t *testing.T, users map[string]string) string {
	t.Helper()
	var b strings.Builder
	b.WriteString("# operators of the test\n")
	for name, pw := range users {
		hash, err := bcrypt.GenerateFromPassword([]byte(pw), 10)
		require.NoError(t, err)
		fmt.Fprintf(&b, "%s:%s\n", name, hash)
	}
	path := filepath.Join(t.TempDir(), "users")
	require.NoError(t, os.WriteFile(path, []byte(b.String()), 0o600))
	return path
}

// clientFrom is an HTTP client whose connections come from the loopback address src (any of
// 127.0.0.0/8 reaches a server on 127.0.0.1): a second "peer" on one machine.
func clientFrom(src string) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 5 * time.Second}
	return &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{DialContext: d.DialContext, MaxIdleConnsPerHost: 16}}
}

// opGet is a GET through c with basic auth (user "" sends none) and the Host given ("" the
// address's own); it returns the status, the body and the headers.
func opGet(t *testing.T, c *http.Client, addr, host, path, user, password string) (int, string, http.Header) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, "http://"+addr+path, nil)
	require.NoError(t, err)
	if host != "" {
		req.Host = host
	}
	if user != "" {
		req.SetBasicAuth(user, password)
	}
	resp, err := c.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), resp.Header
}

func countLines(p *workflowtest.Process, substr string) int {
	n := 0
	for _, l := range p.Lines() {
		if strings.Contains(l, substr) {
			n++
		}
	}
	return n
}

// Against a real serve process: connections that announce a 1 MB body and
// never send it, without credentials, must not lock the operators out. Before, bodies were
// read inside the 4-slot in-flight cap before credentials were checked: four such
// connections per surface held every slot of River UI and of the console for the server's
// read timeout, and every operator request was answered 503, with nothing in the log. Now
// credentials come first (an unauthenticated request is answered 401 at once and holds no
// slot) and a body is read only for an authenticated write, within 5 s.
func TestServeSlowBodiesLockNoOperatorOut(t *testing.T) {
	t.Parallel()
	dbURL := seededDBURL(t)
	bank := fakebank.New(nil)
	require.NoError(t, bank.Start())
	t.Cleanup(func() { _ = bank.Close() })
	users := writeUsersFile(t, map[string]string{"alice": alicePassword})
	_, addr := startServeEnv(t, []string{"CONSOLE_USERS=" + users, "CONSOLE_USER=", "CONSOLE_PASSWORD=",
		"RIVERUI_USER=ops", "RIVERUI_PASSWORD=" + riverPassword}, "slowbody",
		"--database-url", dbURL, "--bank-url", bank.URL(), "--scheduler=false")

	// The attackers: 4 connections per surface (the cap of each), each announcing a 1 MB body
	// and sending none of it; when the server hangs up, they connect again.
	ctx, stop := context.WithCancel(context.Background())
	var attackers sync.WaitGroup
	var mu sync.Mutex
	attackAnswers := map[string]int{}
	for i := range 8 {
		path, ct := "/console/run/cancel", "application/x-www-form-urlencoded"
		if i%2 == 1 {
			path, ct = "/riverui/api/jobs/retry", "application/json"
		}
		attackers.Add(1)
		go func() {
			defer attackers.Done()
			for ctx.Err() == nil {
				conn, err := net.Dial("tcp", addr)
				if err != nil {
					return
				}
				go func() { <-ctx.Done(); conn.Close() }()
				fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: %s\r\nContent-Length: 1000000\r\n\r\n", path, addr, ct)
				resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
				if err == nil {
					mu.Lock()
					attackAnswers[path+" "+strconv.Itoa(resp.StatusCode)]++
					mu.Unlock()
					resp.Body.Close()
				}
				// Hold the connection as long as the server lets us.
				_, _ = io.Copy(io.Discard, conn)
				conn.Close()
			}
		}()
	}
	t.Cleanup(func() { stop(); attackers.Wait() })
	time.Sleep(500 * time.Millisecond) // the attackers are in

	// The operators, meanwhile, for 8 s (the server's read timeout is 15 s).
	c := &http.Client{Timeout: 20 * time.Second}
	codes := map[string]int{}
	deadline := time.Now().Add(8 * time.Second)
	n := 0
	for time.Now().Before(deadline) {
		code, _, _ := opGet(t, c, addr, "", "/console/", "alice", alicePassword)
		codes["console "+strconv.Itoa(code)]++
		code, _, _ = opGet(t, c, addr, "", "/riverui/api/queues", "ops", riverPassword)
		codes["riverui "+strconv.Itoa(code)]++
		n++
		time.Sleep(200 * time.Millisecond)
	}
	stop()
	attackers.Wait()
	mu.Lock()
	t.Logf("operators, %d requests per surface under 8 slow-body connections: %v; the attackers were answered: %v", n, codes, attackAnswers)
	mu.Unlock()
	require.Equal(t, map[string]int{"console 200": n, "riverui 200": n}, codes, "every operator request must be served while unauthenticated clients dribble bodies")
	require.Positive(t, attackAnswers["/console/run/cancel 401"], "the unauthenticated writes are answered 401 at once, without their bodies")
	require.Positive(t, attackAnswers["/riverui/api/jobs/retry 401"])
}

// Against a real serve process without credentials: a DNS-rebinding page (its
// own name re-pointed at 127.0.0.1) must read nothing — not the console, not River UI's API,
// not /metrics. Only loopback names and the names listed (SERVE_ALLOWED_HOSTS /
// --allowed-host) are answered; any other Host gets 421 with the fix. Health probes answer
// whatever the Host. And against clickjacking: River UI and the console may not be framed.
func TestServeRefusesRebinding(t *testing.T) {
	t.Parallel()
	dbURL := seededDBURL(t)
	bank := fakebank.New(nil)
	require.NoError(t, bank.Start())
	t.Cleanup(func() { _ = bank.Close() })
	p, addr := startServeEnv(t, []string{"CONSOLE_USERS=", "CONSOLE_USER=", "CONSOLE_PASSWORD=", "RIVERUI_USER=", "RIVERUI_PASSWORD=",
		"SERVE_ALLOWED_HOSTS=ops.example.test"}, "rebind",
		"--database-url", dbURL, "--bank-url", bank.URL(), "--scheduler=false", "--metrics-interval", "200ms")
	_, port, err := net.SplitHostPort(addr)
	require.NoError(t, err)
	c := &http.Client{Timeout: 20 * time.Second}
	paths := []string{"/console/", "/console/runs", "/riverui/api/jobs?state=completed", "/riverui/api/queues", "/riverui/", "/metrics"}

	for _, host := range []string{"evil.example:" + port, "evil.example", "localhost.evil.example:" + port, "127.0.0.1.nip.io:" + port, "ops.example.test.evil:" + port} {
		for i, path := range paths {
			code, body, _ := opGet(t, c, addr, host, path, "", "")
			if i == 0 {
				t.Logf("Host %s %s → %d %s", host, path, code, truncateForLog(body))
			}
			require.Equal(t, http.StatusMisdirectedRequest, code, "Host %s must not be answered %s", host, path)
			require.Contains(t, body, "allowed-host", "the refusal names the fix")
		}
		code, _, _ := opGet(t, c, addr, host, "/healthz", "", "")
		require.Equal(t, http.StatusOK, code, "health probes answer whatever the Host")
	}
	require.Positive(t, countLines(p, "not ours refused (421)"), "the refusals are logged")

	for _, host := range []string{"", "localhost:" + port, "LOCALHOST:" + port, "127.0.0.1:" + port, "[::1]:" + port, "ops.example.test:" + port, "ops.example.test"} {
		for _, path := range paths {
			code, body, hdr := opGet(t, c, addr, host, path, "", "")
			require.Equal(t, http.StatusOK, code, "Host %q %s: %s", host, path, truncateForLog(body))
			if path == "/riverui/" || path == "/console/" {
				require.Equal(t, "DENY", hdr.Get("X-Frame-Options"), "%s may not be framed", path)
				require.Contains(t, hdr.Get("Content-Security-Policy"), "frame-ancestors 'none'", path)
			}
		}
	}
}

var csrfFieldRE = regexp.MustCompile(`name="csrf" value="([0-9a-f]+)"`)

// Against a real serve process: one identity per operator (CONSOLE_USERS),
// guessing limited and logged, actions audited under the operator's own name. Before, one
// shared password took 97,318 guesses in 20 s with none logged, and every action named the
// one shared account.
func TestServeLimitsSignInFailures(t *testing.T) {
	t.Parallel()
	dbURL := seededDBURL(t)
	bank := fakebank.New(nil)
	require.NoError(t, bank.Start())
	t.Cleanup(func() { _ = bank.Close() })
	users := writeUsersFile(t, map[string]string{"alice": alicePassword, "bob": bobPassword})
	p, addr := startServeEnv(t, []string{"CONSOLE_USERS=" + users, "CONSOLE_USER=", "CONSOLE_PASSWORD=",
		"RIVERUI_USER=ops", "RIVERUI_PASSWORD=" + riverPassword}, "guess",
		"--database-url", dbURL, "--bank-url", bank.URL(), "--scheduler=false")
	attacker, operator := clientFrom("127.0.0.1"), clientFrom("127.0.0.2")

	code, _, _ := opGet(t, operator, addr, "", "/console/", "", "")
	require.Equal(t, http.StatusUnauthorized, code, "with operators configured the console needs credentials")
	code, body, _ := opGet(t, operator, addr, "", "/console/", "alice", alicePassword)
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, "alice", "the page names the operator signed in")

	// Guessing alice's password from one peer, 4 at a time, for 3 s, on the console and River
	// UI (which share the limit).
	var verified, throttled, other atomic.Int64
	var wg sync.WaitGroup
	stopAt := time.Now().Add(3 * time.Second)
	var guess atomic.Int64
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(stopAt) {
				path, user := "/console/", "alice"
				if i == 3 {
					path, user = "/riverui/api/queues", "ops"
				}
				req, _ := http.NewRequest(http.MethodGet, "http://"+addr+path, nil)
				req.SetBasicAuth(user, fmt.Sprintf("guess-%d", guess.Add(1)))
				resp, err := attacker.Do(req)
				if err != nil {
					other.Add(1)
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				switch resp.StatusCode {
				case http.StatusUnauthorized:
					verified.Add(1)
				case http.StatusTooManyRequests:
					throttled.Add(1)
					require.NotEmpty(t, resp.Header.Get("Retry-After"))
				default:
					other.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	t.Logf("3 s of guessing from one peer: %d guesses checked (401), %d refused unchecked (429), %d other", verified.Load(), throttled.Load(), other.Load())
	require.Zero(t, other.Load(), "a wrong password is never let in")
	require.LessOrEqual(t, verified.Load(), int64(20), "guessing is limited: 5 free failures, then a lockout doubling from 1 s")
	require.Positive(t, throttled.Load())
	// The server's log reaches us through its stderr pipe, behind the HTTP answers: a
	// starved machine can deliver the last lines a while after the guessing stopped, so wait
	// for them rather than read once.
	require.Eventually(t, func() bool {
		return countLines(p, "sign-in failed") >= int(min(verified.Load(), 5)) &&
			countLines(p, "sign-in refused without checking") > 0
	}, 30*time.Second, 50*time.Millisecond, "every failed sign-in and the lockout are logged")
	// The guesses checked (5 free, then a lockout) may all have been the River UI's "ops" on a
	// starved machine (seen beside a CPU hog): either account named will do.
	named := 0
	for _, user := range []string{"alice", "ops"} {
		named += countLines(p, `user="\"`+user+`\""`) + countLines(p, `user="`+user+`"`) + countLines(p, `user=`+user+` `)
	}
	require.Positive(t, named, "the log names the account tried")
	for _, l := range p.Lines() {
		require.NotContains(t, l, "guess-", "no password in the log")
	}

	// While the attacker's peer is locked out, even alice's right password is not checked
	// there (the lockout would otherwise still answer each guess); from another peer she and
	// bob sign in.
	code, _, hdr := opGet(t, attacker, addr, "", "/console/", "alice", alicePassword)
	require.Equal(t, http.StatusTooManyRequests, code)
	require.NotEmpty(t, hdr.Get("Retry-After"))
	code, _, _ = opGet(t, operator, addr, "", "/console/", "alice", alicePassword)
	require.Equal(t, http.StatusOK, code, "another peer is not locked out")

	// Bob cancels a run: the audit names bob, not a shared account.
	pool, err := pgxpool.New(context.Background(), dbURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	key := "console-sec-run"
	_, err = pool.Exec(context.Background(), `INSERT INTO stepwise_checkpoint (key, cursor, fencing_token, steps) VALUES ($1, '{}', 1, 0)`, key)
	require.NoError(t, err)
	_, err = pool.Exec(context.Background(), `INSERT INTO stepwise_run (key, workflow, input, status) VALUES ($1, 'not-registered', '{}', 'pending')`, key)
	require.NoError(t, err)
	code, page, _ := opGet(t, operator, addr, "", "/console/run?key="+key, "bob", bobPassword)
	require.Equal(t, http.StatusOK, code, page)
	m := csrfFieldRE.FindStringSubmatch(page)
	require.NotNil(t, m, "bob is offered the cancel form")
	form := url.Values{"key": {key}, "seen": {"pending"}, "reason": {"ticket OPS-1"}, "csrf": {m[1]}}
	req, err := http.NewRequest(http.MethodPost, "http://"+addr+"/console/run/cancel", strings.NewReader(form.Encode()))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", "http://"+addr)
	req.SetBasicAuth("bob", bobPassword)
	operator.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	resp, err := operator.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	var actor string
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT actor FROM stepwise_event WHERE subject = $1 AND kind = 'console.action'`, key).Scan(&actor))
	require.Equal(t, "bob", actor, "the action is audited under the operator who took it")

	// Guessing spread over many peers (127.0.0.10 and up, one failure each, 16 at a time)
	// meets the global budget (60 a minute): then every sign-in is refused for a while,
	// logged once. (More peers than the budget, so that its refill while bcrypt runs on a
	// loaded machine cannot cover them all.)
	var spread401, spread429 atomic.Int64
	var spread sync.WaitGroup
	sem := make(chan struct{}, 16)
	for i := range 200 {
		spread.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; spread.Done() }()
			if spread429.Load() > 0 {
				return
			}
			c := clientFrom(fmt.Sprintf("127.0.%d.%d", 1+i/200, 10+i%200))
			code, _, _ := opGet(t, c, addr, "", "/console/", "alice", fmt.Sprintf("spread-%d", i))
			switch code {
			case http.StatusTooManyRequests:
				spread429.Add(1)
			case http.StatusUnauthorized:
				spread401.Add(1)
			default:
				t.Errorf("a guess from a fresh peer was answered %d", code)
			}
		}()
	}
	spread.Wait()
	t.Logf("guesses from fresh peers: %d checked before the global limit refused (%d refused)", spread401.Load(), spread429.Load())
	require.Positive(t, spread429.Load(), "guessing spread over many peers meets the global limit")
	require.Less(t, spread401.Load(), int64(100), "the global limit holds: 60 a minute, reserved before each check, so concurrent guesses cannot overdraw it")
	require.Positive(t, countLines(p, "every sign-in refused for now"))
}

// serve refuses credentials it cannot use safely, with the fix, before it
// touches the database: a user or password set by half (the surface was silently anonymous),
// a short password, both console forms at once, a cheap or malformed users file, and
// credentials over plain HTTP beyond loopback unless --behind-tls says TLS is terminated in
// front.
func TestServeRefusesUnsafeCredentials(t *testing.T) {
	t.Parallel()
	dbURL := seededDBURL(t)
	bank := fakebank.New(nil)
	require.NoError(t, bank.Start())
	t.Cleanup(func() { _ = bank.Close() })
	common := []string{"--database-url", dbURL, "--bank-url", bank.URL(), "--scheduler=false"}
	cheap, err := bcrypt.GenerateFromPassword([]byte(alicePassword), 4)
	require.NoError(t, err)
	cheapFile := filepath.Join(t.TempDir(), "cheap")
	require.NoError(t, os.WriteFile(cheapFile, []byte("alice:"+string(cheap)+"\n"), 0o600))
	plainFile := filepath.Join(t.TempDir(), "plain")
	require.NoError(t, os.WriteFile(plainFile, []byte("alice:"+alicePassword+"\n"), 0o600))
	users := writeUsersFile(t, map[string]string{"alice": alicePassword})
	unset := []string{"CONSOLE_USERS=", "CONSOLE_USER=", "CONSOLE_PASSWORD=", "RIVERUI_USER=", "RIVERUI_PASSWORD=",
		"CONSOLE_PROXY_USER_HEADER=", "CONSOLE_TRUSTED_PROXIES="}

	for _, c := range []struct {
		name string
		env  []string
		args []string
		want string
	}{
		{"console user only", []string{"CONSOLE_USER=ops"}, nil, "CONSOLE_PASSWORD is empty"},
		{"console password only", []string{"CONSOLE_PASSWORD=" + alicePassword}, nil, "CONSOLE_USER is empty"},
		{"river user only", []string{"RIVERUI_USER=ops"}, nil, "RIVERUI_PASSWORD is empty"},
		{"short password", []string{"CONSOLE_USER=ops", "CONSOLE_PASSWORD=x"}, nil, "want at least 12"},
		{"both console forms", []string{"CONSOLE_USERS=" + users, "CONSOLE_USER=ops", "CONSOLE_PASSWORD=" + alicePassword}, nil, "more than one of"},
		{"users and a proxy", []string{"CONSOLE_USERS=" + users, "CONSOLE_PROXY_USER_HEADER=X-Forwarded-User", "CONSOLE_TRUSTED_PROXIES=127.0.0.1"}, nil, "more than one of"},
		{"proxy header without proxies", []string{"CONSOLE_PROXY_USER_HEADER=X-Forwarded-User"}, nil, "needs CONSOLE_TRUSTED_PROXIES"},
		{"proxy not an address", []string{"CONSOLE_PROXY_USER_HEADER=X-Forwarded-User", "CONSOLE_TRUSTED_PROXIES=proxy.example"}, nil, "want an address or a CIDR"},
		{"cheap hash", []string{"CONSOLE_USERS=" + cheapFile}, nil, "bcrypt cost 4 is too cheap"},
		{"plain password in the file", []string{"CONSOLE_USERS=" + plainFile}, nil, "not a bcrypt hash"},
		{"users file missing", []string{"CONSOLE_USERS=" + plainFile + ".missing"}, nil, "no such file"},
		{"credentials over plain HTTP", []string{"CONSOLE_USERS=" + users}, []string{"--addr", "0.0.0.0:0"}, "--behind-tls"},
		{"river credentials over plain HTTP", []string{"RIVERUI_USER=ops", "RIVERUI_PASSWORD=" + riverPassword}, []string{"--addr", "0.0.0.0:0"}, "--behind-tls"},
	} {
		args := append([]string{"serve", "--addr", "127.0.0.1:0", "--id", "unsafe"}, common...)
		args = append(args, c.args...)
		proc := workflowtest.Start(t, "cli", append(append([]string{"SS_ARGS=" + strings.Join(args, argsSep)}, unset...), c.env...)...)
		waitCtx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		line, err := proc.WaitForLine(waitCtx, "serving: ")
		cancel()
		if err == nil {
			_ = proc.Signal(syscall.SIGTERM)
			_ = proc.Wait()
			t.Fatalf("%s: serve started (%s) instead of refusing", c.name, line)
		}
		out := strings.Join(proc.Lines(), "\n")
		t.Logf("%s: %s", c.name, truncateForLog(out))
		require.Contains(t, out, "exit code 2", c.name)
		require.Contains(t, out, c.want, c.name)
		require.NotContains(t, out, alicePassword, "%s: no password in the output", c.name)
	}

	// Behind TLS (a proxy in front), credentials on a wider bind are accepted.
	args := append([]string{"serve", "--addr", "0.0.0.0:0", "--id", "tls", "--behind-tls"}, common...)
	proc := workflowtest.Start(t, "cli", append(append([]string{"SS_ARGS=" + strings.Join(args, argsSep)}, unset...),
		"CONSOLE_USERS="+users, "RIVERUI_USER=ops", "RIVERUI_PASSWORD="+riverPassword)...)
	waitCtx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	_, err = proc.WaitForLine(waitCtx, "operators: console CONSOLE_USERS (alice)")
	require.NoError(t, err)
	require.NoError(t, proc.Signal(syscall.SIGTERM))
	require.NoError(t, proc.Wait())
}
