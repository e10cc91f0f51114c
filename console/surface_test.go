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
// 503 at once, and a write's body is read before the handler sees it. Harden refuses a
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

	res := do(http.MethodGet, "/riverui/jobs", true, "")
	require.Equal(t, "DENY", res.Header.Get("X-Frame-Options"))
	req, err := http.NewRequest(http.MethodGet, srv.URL+"/riverui/jobs", nil)
	require.NoError(t, err)
	req.Host = "rebound.example"
	res, err = srv.Client().Do(req)
	require.NoError(t, err)
	_ = res.Body.Close()
	require.Equal(t, http.StatusMisdirectedRequest, res.StatusCode, "a Host that is not ours")
}
