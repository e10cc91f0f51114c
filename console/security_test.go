package console_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/bcrypt"

	"github.com/stepwise-go/stepwise/console"
	"github.com/stepwise-go/stepwise/internal/outbox"
)

// syncLog is a log sink safe for the handler's goroutines.
type syncLog struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncLog) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncLog) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func usersList(t testing.TB, cost int, users ...string) string {
	t.Helper()
	var b strings.Builder
	for i := 0; i < len(users); i += 2 {
		h, err := bcrypt.GenerateFromPassword([]byte(users[i+1]), cost)
		require.NoError(t, err)
		fmt.Fprintf(&b, "%s:%s\n", users[i], h)
	}
	return b.String()
}

// A users file names each operator; a bad one is refused with the line and
// the fix; a wrong password, an unknown name and a name alone are refused.
func TestUsersFile(t *testing.T) {
	t.Parallel()
	good := usersList(t, 10, "alice", "alice-pw-for-tests", "bob", "bob-pw-for-tests")
	u, err := console.ParseUsersList(strings.NewReader("# operators\n\n"+good), "users")
	require.NoError(t, err)
	require.Equal(t, []string{"alice", "bob"}, u.Names())
	// What a caller gets: the Config.Authenticate itself.
	authenticate, err := console.ParseUsers(strings.NewReader("# operators\n\n"+good), "users")
	require.NoError(t, err)

	req := func(user, password string) *http.Request {
		r, _ := http.NewRequest(http.MethodGet, "/", nil)
		r.SetBasicAuth(user, password)
		return r
	}
	for i := 0; i < 2; i++ { // the second time from the cache of passed checks
		name, ok := authenticate(req("bob", "bob-pw-for-tests"))
		require.True(t, ok)
		require.Equal(t, "bob", name)
	}
	for _, c := range [][2]string{{"bob", "alice-pw-for-tests"}, {"carol", "bob-pw-for-tests"}, {"bob", ""}, {"", "bob-pw-for-tests"}, {"bob", "bob-pw-for-tests "}} {
		_, ok := authenticate(req(c[0], c[1]))
		require.False(t, ok, "%q/%q", c[0], c[1])
	}
	r, _ := http.NewRequest(http.MethodGet, "/", nil)
	_, ok := authenticate(r)
	require.False(t, ok, "no credentials")

	for _, c := range []struct{ text, want string }{
		{"", "lists no operator"},
		{"alice\n", "line 1: want name:bcrypt-hash"},
		{"alice:secret\n", "not a bcrypt hash"},
		{usersList(t, 4, "alice", "x"), "bcrypt cost 4 is too cheap"},
		{good + good, `"alice" is listed twice`},
		{"al ice:" + strings.SplitN(good, ":", 2)[1], "spaces or control characters"},
	} {
		auth, err := console.ParseUsers(strings.NewReader(c.text), "users")
		require.ErrorContains(t, err, c.want)
		require.Nil(t, auth, "no Authenticate beside an error")
		require.NotContains(t, err.Error(), "$2a$", "the hash is not repeated in the error")
	}
	_, err = console.LoadUsers(t.TempDir() + "/missing")
	require.ErrorContains(t, err, "reading the users file")
}

// In the console: failed sign-ins are logged and, after a few, the peer is
// locked out (429, credentials not even checked) while other peers go on; the action is
// audited under the operator's own name.
func TestSignInGuard(t *testing.T) {
	t.Parallel()
	var logged syncLog
	authenticate, err := console.ParseUsers(strings.NewReader(usersList(t, 10, "alice", testPassword, "bob", "bob-pw-for-tests")), "users")
	require.NoError(t, err)
	f := newFixture(t, func(c *console.Config) {
		c.Authenticate = authenticate
		c.Logger = slog.New(slog.NewTextHandler(&logged, nil))
	})
	attacker := "198.51.100.7:4000"
	var codes []int
	for i := range console.GuardFreeFailures + 3 {
		r := httpRequest(t, f, http.MethodGet, "/console/", attacker, "alice", fmt.Sprintf("guess-%d", i))
		codes = append(codes, r.Code)
		if r.Code == http.StatusTooManyRequests {
			require.NotEmpty(t, r.Header().Get("Retry-After"))
		}
	}
	want := []int{401, 401, 401, 401, 401, 401, 429, 429}
	require.Equal(t, want, codes, "5 free failures, the 6th locks the peer out")
	require.Equal(t, console.GuardFreeFailures+1, strings.Count(logged.String(), "sign-in failed"), "every checked failure is logged")
	require.Contains(t, logged.String(), `user="\"alice\""`)
	require.Contains(t, logged.String(), "peer=198.51.100.7")
	require.Equal(t, 1, strings.Count(logged.String(), "sign-in refused without checking"), "a lockout is logged once")
	require.NotContains(t, logged.String(), "guess-", "no password in the log")

	// The right password from the locked-out peer is not checked; from another peer it is.
	require.Equal(t, http.StatusTooManyRequests, httpRequest(t, f, http.MethodGet, "/console/", attacker, "alice", testPassword).Code)
	require.Equal(t, http.StatusOK, httpRequest(t, f, http.MethodGet, "/console/", "203.0.113.5:4000", "bob", "bob-pw-for-tests").Code)
	// A request without credentials (a browser's first) is not a failure.
	require.Equal(t, http.StatusUnauthorized, httpRequest(t, f, http.MethodGet, "/console/", "203.0.113.5:4000", "", "").Code)
	require.Equal(t, console.GuardFreeFailures+1, strings.Count(logged.String(), "sign-in failed"))
}

// httpRequest serves one request from remote with basic auth (user "" sends none).
func httpRequest(t testing.TB, f *fixture, method, target, remote, user, password string) *httptest.ResponseRecorder {
	t.Helper()
	r, err := http.NewRequest(method, "http://console.test"+target, nil)
	require.NoError(t, err)
	r.RemoteAddr = remote
	if user != "" {
		r.SetBasicAuth(user, password)
	}
	w := httptest.NewRecorder()
	f.h.ServeHTTP(w, r)
	return w
}

// Without credentials the console answers loopback names and the listed
// ones only (DNS rebinding); with credentials and Hosts set, the same; a bad entry is refused.
func TestHostsAnswered(t *testing.T) {
	t.Parallel()
	anon := newFixture(t, func(c *console.Config) { c.Authenticate = nil; c.Hosts = []string{"ops.example.test"} })
	get := func(f *fixture, host string, auth bool) int {
		r, err := http.NewRequest(http.MethodGet, "http://x/console/", nil)
		require.NoError(t, err)
		r.Host, r.RemoteAddr = host, "127.0.0.1:4000"
		if auth {
			r.SetBasicAuth(testUser, testPassword)
		}
		w := httptest.NewRecorder()
		f.h.ServeHTTP(w, r)
		return w.Code
	}
	for _, h := range []string{"localhost:8080", "localhost", "127.0.0.1:8080", "127.0.0.2", "[::1]:8080", "::1", "ops.example.test", "OPS.example.test:8443"} {
		require.Equal(t, http.StatusOK, get(anon, h, false), h)
	}
	for _, h := range []string{"evil.example:8080", "evil.example", "localhost.evil.example", "127.0.0.1.nip.io:8080", "ops.example.test.evil", ""} {
		require.Equal(t, http.StatusMisdirectedRequest, get(anon, h, false), h)
	}
	authed := newFixture(t, nil)
	require.Equal(t, http.StatusOK, get(authed, "ops.example.com", true), "with credentials and no Hosts any Host is answered")
	listed := newFixture(t, func(c *console.Config) { c.Hosts = []string{"ops.example.com:8443"} })
	require.Equal(t, http.StatusOK, get(listed, "ops.example.com:8443", true))
	require.Equal(t, http.StatusMisdirectedRequest, get(listed, "ops.example.com:9000", true), "a listed port is that port only")

	for _, bad := range []string{"https://ops.example.com", "*.example.com", "ops.example.com/console", ""} {
		_, err := console.New(anon.pool, &console.Config{Hosts: []string{bad}})
		require.ErrorContains(t, err, "Hosts entry", bad)
	}
}

// In the console: credentials come before the in-flight slots, so requests
// without valid credentials are answered 401 at once while every slot is busy, and never
// 503; a signed-in request beyond the slots gets 503, logged.
func TestUnauthenticatedHoldsNoSlot(t *testing.T) {
	t.Parallel()
	var logged syncLog
	f := newFixture(t, func(c *console.Config) {
		c.MaxInFlight = 1
		c.Logger = slog.New(slog.NewTextHandler(&logged, nil))
	})
	f.enqueue(t, "s", "", 1)
	id := outbox.OperationID("payout", "s-0")
	// The slot holder: an operation page whose read waits on a lock the test holds (a slow
	// database, as an operator meets it).
	ctx := context.Background()
	lock, err := f.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = lock.Rollback(ctx) }()
	_, err = lock.Exec(ctx, `LOCK TABLE stepwise_operation IN ACCESS EXCLUSIVE MODE`)
	require.NoError(t, err)
	done := make(chan int)
	go func() {
		done <- httpRequest(t, f, http.MethodGet, "/console/operation?id="+id.String(), "127.0.0.1:4000", testUser, testPassword).Code
	}()
	require.Eventually(t, func() bool {
		var n int
		err := f.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n)
		return err == nil && n > 0
	}, 10*time.Second, 5*time.Millisecond, "the slot holder never started")
	for range 20 {
		require.Equal(t, http.StatusUnauthorized, httpRequest(t, f, http.MethodGet, "/console/", "127.0.0.1:4001", "", "").Code)
	}
	require.Equal(t, http.StatusUnauthorized, httpRequest(t, f, http.MethodPost, "/console/run/cancel", "127.0.0.1:4001", "", "").Code)
	require.Equal(t, http.StatusServiceUnavailable, httpRequest(t, f, http.MethodGet, "/console/", "127.0.0.1:4002", testUser, testPassword).Code)
	require.Contains(t, logged.String(), "every slot is busy (503)")
	require.NoError(t, lock.Rollback(ctx))
	require.Equal(t, http.StatusOK, <-done)
	require.Equal(t, http.StatusOK, httpRequest(t, f, http.MethodGet, "/console/", "127.0.0.1:4002", testUser, testPassword).Code)
}

// Behind an authenticating proxy, the operator's name comes from the
// proxy's header, believed only from the proxy's address; the audit names that operator.
func TestProxyUser(t *testing.T) {
	t.Parallel()
	auth, err := console.ProxyUser("X-Forwarded-User", []string{"10.0.0.0/24", "127.0.0.1"})
	require.NoError(t, err)
	f := newFixture(t, func(c *console.Config) { c.Authenticate = auth })
	get := func(remote string, names ...string) int {
		r, err := http.NewRequest(http.MethodGet, "http://console.test/console/", nil)
		require.NoError(t, err)
		r.RemoteAddr = remote
		for _, n := range names {
			r.Header.Add("X-Forwarded-User", n)
		}
		w := httptest.NewRecorder()
		f.h.ServeHTTP(w, r)
		if w.Code == http.StatusOK {
			require.Contains(t, w.Body.String(), names[0], "the page names the operator")
		}
		return w.Code
	}
	require.Equal(t, http.StatusOK, get("10.0.0.7:5000", "carol"))
	require.Equal(t, http.StatusOK, get("127.0.0.1:5000", "dave"))
	require.Equal(t, http.StatusUnauthorized, get("10.0.1.7:5000", "carol"), "not from the proxy: the header is anyone's")
	require.Equal(t, http.StatusUnauthorized, get("10.0.0.7:5000"), "no name")
	require.Equal(t, http.StatusUnauthorized, get("10.0.0.7:5000", "carol", "mallory"), "two copies: one is the client's")
	require.Equal(t, http.StatusUnauthorized, get("10.0.0.7:5000", "carol\nforged"), "control characters")

	for _, c := range []struct {
		header  string
		trusted []string
		want    string
	}{
		{"", []string{"127.0.0.1"}, "want a header name"},
		{"X-Forwarded-User", nil, "no trusted proxy"},
		{"X-Forwarded-User", []string{"proxy.example"}, "want an address or a CIDR"},
	} {
		_, err := console.ProxyUser(c.header, c.trusted)
		require.ErrorContains(t, err, c.want)
	}
}

// Behind a trusted proxy, failed sign-ins count against the client the proxy names in
// X-Forwarded-For, not against the proxy: one guesser does not lock every operator out, and
// a client cannot escape its count by forging entries left of the proxy's.
func TestGuardBehindProxy(t *testing.T) {
	t.Parallel()
	g := console.NewGuard(slog.New(slog.DiscardHandler))
	require.NoError(t, g.TrustProxies([]string{"10.0.0.1", "10.9.0.0/16"}))
	require.ErrorContains(t, g.TrustProxies([]string{"proxy.example"}), "want an address or a CIDR")
	f := newFixture(t, func(c *console.Config) { c.Guard = g })
	via := func(xff []string, user, password string) int {
		r, err := http.NewRequest(http.MethodGet, "http://console.test/console/", nil)
		require.NoError(t, err)
		r.RemoteAddr = "10.0.0.1:443"
		for _, v := range xff {
			r.Header.Add("X-Forwarded-For", v)
		}
		r.SetBasicAuth(user, password)
		w := httptest.NewRecorder()
		f.h.ServeHTTP(w, r)
		return w.Code
	}
	for i := range console.GuardFreeFailures + 1 {
		// The guesser forges a first entry each time; the proxy appends its real address.
		require.Equal(t, http.StatusUnauthorized, via([]string{fmt.Sprintf("192.0.2.%d, 198.51.100.7", i)}, testUser, "wrong"))
	}
	require.Equal(t, http.StatusTooManyRequests, via([]string{"198.51.100.7"}, testUser, testPassword), "the guesser is locked out")
	require.Equal(t, http.StatusOK, via([]string{"203.0.113.5"}, testUser, testPassword), "another client of the same proxy is not")
	require.Equal(t, http.StatusOK, via([]string{"203.0.113.5", "10.9.3.3"}, testUser, testPassword), "a chain of trusted proxies is skipped")
}
