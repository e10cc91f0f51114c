package console_test

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/console"
)

// TestProtectChecksCredentialsBeforeASlot: with River UI's one slot held, a request without
// credentials is answered 401 (checked before it could wait for a slot), an operator's gets
// 503 at once, and a write's body is read before the handler sees it (a chunked one over the
// cap is 413, not cut). Harden refuses a
// Host that is not ours (421) and sets the anti-framing headers. Guards against the order
// that let slow-body connections hold every slot and lock the operators out.
func TestProtectChecksCredentialsBeforeASlot(t *testing.T) {
	t.Parallel()
	logger := slog.New(slog.DiscardHandler)
	held, release := make(chan struct{}), make(chan struct{})
	bodies := make(chan string, 1)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/riverui/hold" {
			close(held)
			<-release
			return
		}
		b, _ := io.ReadAll(r.Body)
		if len(b) > 0 {
			bodies <- string(b)
		}
	})
	auth := &console.Auth{RiverUser: "ops", RiverPassword: "a-long-password", Guard: console.NewGuard(logger)}
	mux := http.NewServeMux()
	mux.Handle("/riverui/", console.Protect(h, "River UI", auth, 1, logger))
	srv := httptest.NewServer(console.Harden(mux, nil, logger))
	defer srv.Close()

	do := func(method, path string, creds bool, body string) *http.Response {
		t.Helper()
		req, err := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
		require.NoError(t, err)
		if creds {
			req.SetBasicAuth("ops", "a-long-password")
		}
		if method == http.MethodPost {
			req.Header.Set("Content-Type", "application/json")
		}
		res, err := srv.Client().Do(req)
		require.NoError(t, err)
		_ = res.Body.Close()
		return res
	}
	go do(http.MethodGet, "/riverui/hold", true, "")
	<-held
	require.Equal(t, http.StatusUnauthorized, do(http.MethodGet, "/riverui/jobs", false, "").StatusCode, "credentials before a slot")
	require.Equal(t, http.StatusServiceUnavailable, do(http.MethodGet, "/riverui/jobs", true, "").StatusCode, "the one slot is held: 503 at once")
	close(release)
	require.Eventually(t, func() bool {
		return do(http.MethodPost, "/riverui/api/jobs/retry", true, `{"ids":[1]}`).StatusCode == http.StatusOK
	}, 5*time.Second, 10*time.Millisecond)
	require.Equal(t, `{"ids":[1]}`, <-bodies, "the write's body reaches the handler whole")

	// A body sent without a length (chunked), over the 1 MiB cap: read before the handler
	// and refused as too large, not cut and passed on.
	req, err := http.NewRequest(http.MethodPost, srv.URL+"/riverui/api/jobs/retry", io.MultiReader(strings.NewReader(strings.Repeat("x", 2<<20))))
	require.NoError(t, err)
	req.SetBasicAuth("ops", "a-long-password")
	req.Header.Set("Content-Type", "application/json")
	res, err := srv.Client().Do(req)
	require.NoError(t, err)
	_ = res.Body.Close()
	require.Equal(t, http.StatusRequestEntityTooLarge, res.StatusCode, "a chunked body over the cap")

	res = do(http.MethodGet, "/riverui/jobs", true, "")
	require.Equal(t, "DENY", res.Header.Get("X-Frame-Options"))
	req, err = http.NewRequest(http.MethodGet, srv.URL+"/riverui/jobs", nil)
	require.NoError(t, err)
	req.Host = "rebound.example"
	res, err = srv.Client().Do(req)
	require.NoError(t, err)
	_ = res.Body.Close()
	require.Equal(t, http.StatusMisdirectedRequest, res.StatusCode, "a Host that is not ours")
}

// TestLoadAuthTrustsTheProxiesForTheGuard: behind the proxy named in CONSOLE_TRUSTED_PROXIES,
// failed sign-ins count against the client the proxy names in X-Forwarded-For, not against
// the proxy: one guesser is locked out (429) and an operator behind the same proxy still gets
// in. Guards against LoadAuth's Guard not trusting the proxies (every visitor shares the
// proxy's address, and five wrong passwords from anyone lock every operator out).
func TestLoadAuthTrustsTheProxiesForTheGuard(t *testing.T) {
	t.Setenv("CONSOLE_TRUSTED_PROXIES", "192.0.2.1")
	t.Setenv("RIVERUI_USER", "ops")
	t.Setenv("RIVERUI_PASSWORD", "a-long-password")
	logger := slog.New(slog.DiscardHandler)
	auth, err := console.LoadAuth(logger)
	require.NoError(t, err)
	h := console.Protect(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}), "River UI", auth, 4, logger)
	do := func(client, password string) int {
		req := httptest.NewRequest(http.MethodGet, "/riverui/jobs", nil)
		req.RemoteAddr = "192.0.2.1:40000"
		req.Header.Set("X-Forwarded-For", client)
		req.SetBasicAuth("ops", password)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Code
	}
	var codes []int
	for range 8 {
		codes = append(codes, do("203.0.113.5", "wrong-password"))
	}
	require.Equal(t, http.StatusTooManyRequests, codes[len(codes)-1], "the guesser is locked out: %v", codes)
	require.Equal(t, http.StatusOK, do("198.51.100.7", "a-long-password"), "an operator behind the same proxy still signs in")

	t.Setenv("CONSOLE_TRUSTED_PROXIES", "proxy.example")
	_, err = console.LoadAuth(logger)
	require.ErrorContains(t, err, "CONSOLE_TRUSTED_PROXIES")
}
