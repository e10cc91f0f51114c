package main

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/internal/testkit"
)

// lineWriter hands each line written to it to a channel, for a command that runs on.
type lineWriter struct {
	w     *io.PipeWriter
	lines chan string
}

func newLineWriter() *lineWriter {
	r, w := io.Pipe()
	lw := &lineWriter{w: w, lines: make(chan string, 100)}
	go func() {
		s := bufio.NewScanner(r)
		for s.Scan() {
			lw.lines <- s.Text()
		}
		close(lw.lines)
	}()
	return lw
}

func (l *lineWriter) Write(p []byte) (int, error) { return l.w.Write(p) }

// stepwise console serves the console and River UI on loopback, read-only without
// credentials, with the serve hardening: another Host is refused (DNS rebinding), a write
// without credentials is refused, pages cannot be framed; and it stops on its signal.
func TestConsoleServesReadOnlyOnLoopback(t *testing.T) {
	t.Parallel()
	db := testkit.DBURL(t)
	ctx, cancel := context.WithCancel(context.Background())
	out, errOut := newLineWriter(), newLineWriter()
	done := make(chan int, 1)
	// README: stepwise console
	// (on a free port: the default 127.0.0.1:8080 may be taken on a test machine)
	go func() {
		done <- run(ctx, []string{"console", "--addr", "127.0.0.1:0", "--database-url", db}, out, errOut)
	}()
	var first string
	select {
	case first = <-out.lines:
	case code := <-done:
		t.Fatalf("console exited %d at once", code)
	case <-time.After(30 * time.Second):
		t.Fatal("console did not start")
	}
	t.Log(first)
	require.NotContains(t, first, "@", "no user or password of the database URL is printed")
	addr := regexp.MustCompile(`http://([0-9.:]+)/console/`).FindStringSubmatch(first)
	require.NotNil(t, addr, first)
	base := "http://" + addr[1]
	t.Log(<-out.lines)

	get := func(path, host string) *http.Response {
		req, err := http.NewRequest(http.MethodGet, base+path, nil)
		require.NoError(t, err)
		if host != "" {
			req.Host = host
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}
	resp := get("/console/", "")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "DENY", resp.Header.Get("X-Frame-Options"))
	require.Equal(t, http.StatusOK, get("/riverui/", "").StatusCode)
	require.Equal(t, http.StatusMisdirectedRequest, get("/console/", "evil.example:8080").StatusCode, "DNS rebinding")
	require.Equal(t, http.StatusMisdirectedRequest, get("/riverui/api/jobs", "evil.example").StatusCode, "DNS rebinding")

	// Writes without credentials: refused, both surfaces.
	resp, err := http.PostForm(base+"/console/runs/cancel", url.Values{"key": {"x"}, "reason": {"y"}})
	require.NoError(t, err)
	resp.Body.Close()
	require.GreaterOrEqual(t, resp.StatusCode, 400)
	resp, err = http.Post(base+"/riverui/api/jobs/cancel", "application/json", strings.NewReader(`{"ids":[1]}`))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusForbidden, resp.StatusCode)

	cancel()
	select {
	case code := <-done:
		require.Equal(t, 0, code)
	case <-time.After(30 * time.Second):
		t.Fatal("console did not stop")
	}
	for _, w := range []*lineWriter{out, errOut} {
		_ = w.w.Close()
		for line := range w.lines {
			t.Log(line)
		}
	}
}

// With operators configured, every request needs credentials; a pair set by half is refused
// before the database is touched (exit 2). Not parallel: it sets the environment.
func TestConsoleWithCredentials(t *testing.T) {
	db := testkit.DBURL(t)
	t.Setenv("CONSOLE_USER", "ana")
	t.Setenv("CONSOLE_PASSWORD", "")
	r := stepwise(t, "", "console", "--addr", "127.0.0.1:0", "--database-url", db)
	require.Equal(t, 2, r.code)
	require.Contains(t, r.stderr, "CONSOLE_USER is set but CONSOLE_PASSWORD is empty")
	t.Setenv("CONSOLE_PASSWORD", "correct horse battery")
	t.Setenv("RIVERUI_USER", "ana")
	t.Setenv("RIVERUI_PASSWORD", "correct horse battery")
	r = stepwise(t, "", "console", "--addr", "0.0.0.0:0", "--database-url", db)
	require.Equal(t, 2, r.code, "credentials over plain HTTP beyond loopback")
	require.Contains(t, r.stderr, "--behind-tls")

	ctx, cancel := context.WithCancel(context.Background())
	out, errOut := newLineWriter(), newLineWriter()
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"console", "--addr", "127.0.0.1:0", "--no-callback-kind", "payout", "--database-url", db}, out, errOut)
	}()
	first := <-out.lines
	t.Log(first)
	base := "http://" + regexp.MustCompile(`http://([0-9.:]+)/console/`).FindStringSubmatch(first)[1]
	second := <-out.lines
	require.Contains(t, second, "CONSOLE_USER (one shared account)")
	require.Contains(t, second, "resolves: MANUAL operations of payout")
	for _, path := range []string{"/console/", "/riverui/"} {
		resp, err := http.Get(base + path)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusUnauthorized, resp.StatusCode, path)
		req, _ := http.NewRequest(http.MethodGet, base+path, nil)
		req.SetBasicAuth("ana", "correct horse battery")
		resp, err = http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode, path)
	}
	cancel()
	require.Equal(t, 0, <-done)
	for _, w := range []*lineWriter{out, errOut} {
		_ = w.w.Close()
		for line := range w.lines {
			t.Log(line)
		}
	}
}
