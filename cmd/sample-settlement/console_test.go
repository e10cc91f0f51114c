package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/cmd/sample-settlement/settlement"
)

// serve mounts the operator's console at /console/: read-only for a loopback browser
// without CONSOLE_USER/CONSOLE_PASSWORD, its actions refused with the fix (by the console,
// not by serve's read-only guard, which would only say "method not allowed"); with them,
// every request needs the credentials.
func TestServeMountsTheConsole(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	pool, err := openPool(ctx, seededDBURL(t), 0) // sized for a Service
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	svc, err := settlement.NewService(pool, &settlement.ServiceConfig{Bank: dialBank("http://127.0.0.1:1", time.Second), Logger: quietLogger()})
	require.NoError(t, err)

	do := func(h http.Handler, method, path string) (int, string) {
		req := httptest.NewRequest(method, path, strings.NewReader("reason=x"))
		req.RemoteAddr = "127.0.0.1:5000"
		req.Host = "127.0.0.1:8080" // a loopback name: any other Host is refused (DNS rebinding)
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Origin", "http://127.0.0.1:8080")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Code, rec.Body.String()
	}

	t.Setenv("CONSOLE_USER", "")
	t.Setenv("CONSOLE_PASSWORD", "")
	h, err := serveHandler(ctx, svc, &readiness{}, serveOps{metricsInterval: time.Second, maxScrapes: 4, maxUIRequests: 4}, quietLogger())
	require.NoError(t, err)
	code, body := do(h, http.MethodGet, "/console/")
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, "read-only (no credentials)")
	code, body = do(h, http.MethodGet, "/console/totals")
	require.Equal(t, http.StatusOK, code, "totals against the bank's statement are wired: %s", body)
	code, body = do(h, http.MethodPost, "/console/run/cancel")
	require.Equal(t, http.StatusForbidden, code)
	require.Contains(t, body, "CONSOLE_USER and CONSOLE_PASSWORD")

	t.Setenv("CONSOLE_USER", "ops")
	t.Setenv("CONSOLE_PASSWORD", "pw-for-tests")
	h, err = serveHandler(ctx, svc, &readiness{}, serveOps{metricsInterval: time.Second, maxScrapes: 4, maxUIRequests: 4}, quietLogger())
	require.NoError(t, err)
	code, _ = do(h, http.MethodGet, "/console/")
	require.Equal(t, http.StatusUnauthorized, code)

	// The demo serves the same console on --console-addr and prints where.
	t.Setenv("CONSOLE_USER", "")
	t.Setenv("CONSOLE_PASSWORD", "")
	var printed string
	stop, err := serveDemoConsole(pool, svc, quietLogger(), "127.0.0.1:0", func(format string, args ...any) { printed = fmt.Sprintf(format, args...) })
	require.NoError(t, err)
	defer stop()
	m := regexp.MustCompile(`^console: (http://127\.0\.0\.1:\d+/console/) `).FindStringSubmatch(printed)
	require.NotNil(t, m, printed)
	resp, err := http.Get(m[1])
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
}
