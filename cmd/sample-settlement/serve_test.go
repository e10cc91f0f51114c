package main

import (
	"bytes"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"
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
				requireAuthForWrites(ok, tt.user, tt.password).ServeHTTP(w, r)
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
	h := genericServerErrors(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
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
	}), "River UI", logger)

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
