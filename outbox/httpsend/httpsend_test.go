package httpsend_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/internal/outbox"
	"github.com/stepwise-go/stepwise/outbox/httpsend"
)

// hostile is a service that does not deduplicate: it counts every request that reaches its
// handler, and on /die it processes the request, then kills the connection without an
// answer (and, with /die?down=1, closes its port first, so a new connection is refused).
type hostile struct {
	srv *httptest.Server
	mu  sync.Mutex
	n   map[string]int
}

func newHostile(t *testing.T) *hostile {
	t.Helper()
	h := &hostile{n: map[string]int{}}
	h.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		h.mu.Lock()
		h.n[r.URL.Path]++
		h.mu.Unlock()
		switch r.URL.Path {
		case "/die":
			if r.URL.Query().Get("down") == "1" {
				_ = h.srv.Listener.Close()
			}
			conn, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				_ = conn.Close()
			}
		case "/moved":
			http.Redirect(w, r, "/elsewhere", http.StatusTemporaryRedirect)
		default:
			_, _ = io.WriteString(w, "ok")
		}
	}))
	t.Cleanup(h.srv.Close)
	return h
}

func (h *hostile) count(path string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.n[path]
}

// client returns a kept-alive client whose next request reuses a connection.
func (h *hostile) warmClient(t *testing.T) *http.Client {
	t.Helper()
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	hc := &http.Client{Transport: tr, Timeout: 5 * time.Second}
	resp, err := hc.Get(h.srv.URL + "/warm")
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	require.NoError(t, resp.Body.Close())
	return hc
}

// TestDoNeverResendsAWrittenRequest: on a kept-alive connection that dies after the service
// processed the request, net/http resends a POST carrying the canonical Idempotency-Key (the
// control, so the test proves something), and httpsend.Do never does, whatever the header's
// name and whether the request has a body. The failure is not "not sent".
func TestDoNeverResendsAWrittenRequest(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name, header, body string
	}{
		{"IdempotencyKeyWithBody", "Idempotency-Key", `{"amount":1250}`},
		{"IdempotencyKeyNoBody", "Idempotency-Key", ""},
		{"XIdempotencyKeyWithBody", "X-Idempotency-Key", `{"amount":1250}`},
		{"XIdempotencyKeyNoBody", "X-Idempotency-Key", ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			newReq := func(h *hostile) *http.Request {
				var body io.Reader
				if tt.body != "" {
					body = strings.NewReader(tt.body)
				}
				req, err := http.NewRequest(http.MethodPost, h.srv.URL+"/die", body)
				require.NoError(t, err)
				req.Header.Set(tt.header, "op-1")
				return req
			}

			control := newHostile(t)
			resp, err := control.warmClient(t).Do(newReq(control))
			if err == nil {
				_ = resp.Body.Close()
			}
			require.Equal(t, 2, control.count("/die"), "net/http did not resend: the control proves nothing (err %v)", err)

			h := newHostile(t)
			_, err = httpsend.Do(h.warmClient(t), newReq(h))
			require.Error(t, err)
			require.Equal(t, 1, h.count("/die"))
			require.False(t, outbox.IsNotSent(err), "%v", err)
			require.Equal(t, outbox.StateUnknownExternal, outbox.Classify(err))
			var he *httpsend.Error
			require.ErrorAs(t, err, &he)
			require.True(t, he.Wire.Reused, "%+v", he.Wire)
			require.True(t, he.Wire.HeadersWritten, "%+v", he.Wire)
			require.Equal(t, 1, he.Wire.Attempts)
			require.False(t, he.Wire.Replayed)
		})
	}
}

// TestConnectionRefusedAfterAResendIsNotNotSent: net/http resends a GET whatever Do does; when
// the service processed it and then went away, the resend's error is "connection refused",
// the error a Sender reading error text takes for "never sent". The wire says otherwise.
func TestConnectionRefusedAfterAResendIsNotNotSent(t *testing.T) {
	t.Parallel()
	h := newHostile(t)
	req, err := http.NewRequest(http.MethodGet, h.srv.URL+"/die?down=1", nil)
	require.NoError(t, err)
	_, err = httpsend.Do(h.warmClient(t), req)
	require.Error(t, err)
	require.ErrorContains(t, err, "connection refused")
	require.Equal(t, 1, h.count("/die"))
	require.False(t, outbox.IsNotSent(err), "%v", err)
	var he *httpsend.Error
	require.ErrorAs(t, err, &he)
	require.True(t, he.Wire.Replayed, "%+v", he.Wire)
	require.Contains(t, err.Error(), "may have acted on it more than once")
}

// TestNotSentOnlyWithoutAConnection: a refused dial and a context that ended before any
// connection are provably not sent, and say why.
func TestNotSentOnlyWithoutAConnection(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	url := "http://" + ln.Addr().String()
	require.NoError(t, ln.Close())

	req, err := http.NewRequest(http.MethodPost, url+"/pay", strings.NewReader("{}"))
	require.NoError(t, err)
	_, err = httpsend.Do(nil, req)
	require.True(t, outbox.IsNotSent(err), "%v", err)
	require.Equal(t, outbox.StateRetryable, outbox.Classify(err))
	var he *httpsend.Error
	require.ErrorAs(t, err, &he)
	require.Zero(t, he.Wire.Attempts)
	require.Contains(t, err.Error(), "the request was never written")

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	h := newHostile(t)
	req, err = http.NewRequestWithContext(ctx, http.MethodPost, h.srv.URL+"/pay", strings.NewReader("{}"))
	require.NoError(t, err)
	_, err = httpsend.Do(nil, req)
	require.True(t, outbox.IsNotSent(err), "%v", err)
	require.Zero(t, h.count("/pay"))
}

// TestDoReturnsRedirects: a 307 would make net/http send the body again, elsewhere; Do hands
// the redirect back as the service's answer.
func TestDoReturnsRedirects(t *testing.T) {
	t.Parallel()
	h := newHostile(t)
	req, err := http.NewRequest(http.MethodPost, h.srv.URL+"/moved", strings.NewReader("{}"))
	require.NoError(t, err)
	ans, err := httpsend.Do(nil, req)
	require.NoError(t, err)
	require.Equal(t, http.StatusTemporaryRedirect, ans.Status)
	require.Zero(t, h.count("/elsewhere"))
	require.Equal(t, outbox.StateUnknownExternal, outbox.Classify(httpsend.Rules{}.Classify(ans)))

	req, err = http.NewRequest(http.MethodPost, h.srv.URL+"/pay", strings.NewReader("{}"))
	require.NoError(t, err)
	req.Header.Set("Idempotency-Key", "op-1")
	ans, err = httpsend.Do(nil, req)
	require.NoError(t, err)
	require.Equal(t, "ok", string(ans.Body))
	require.NoError(t, httpsend.Rules{}.Classify(ans))
	require.Equal(t, "op-1", req.Header.Get("Idempotency-Key"), "the caller's request is not changed")
}

func TestRulesClassify(t *testing.T) {
	t.Parallel()
	rules := httpsend.Rules{
		Refused: func(a *httpsend.Answer) bool { return a.Status == 422 },
		NotProcessed: func(a *httpsend.Answer) bool {
			return a.Status == 429 && a.Header.Get("X-Not-Processed") == "true" || a.Status == 422
		},
	}
	for _, tt := range []struct {
		rules  httpsend.Rules
		status int
		header http.Header
		want   outbox.State
	}{
		{httpsend.Rules{}, 200, nil, outbox.StateSucceeded},
		{httpsend.Rules{}, 201, nil, outbox.StateSucceeded},
		{httpsend.Rules{}, 422, nil, outbox.StateUnknownExternal},
		{httpsend.Rules{}, 429, nil, outbox.StateUnknownExternal},
		{httpsend.Rules{}, 503, nil, outbox.StateUnknownExternal},
		{rules, 422, nil, outbox.StateFailedPermanent}, // Refused wins over NotProcessed
		{rules, 429, http.Header{"X-Not-Processed": {"true"}}, outbox.StateRetryable},
		{rules, 429, nil, outbox.StateUnknownExternal},
		{httpsend.Rules{Succeeded: func(a *httpsend.Answer) bool { return a.Status == 201 }}, 200, nil, outbox.StateUnknownExternal},
	} {
		err := tt.rules.Classify(&httpsend.Answer{Status: tt.status, Header: tt.header, Body: []byte(`{"error":"x"}`)})
		require.Equal(t, tt.want, outbox.Classify(err), "%d %v: %v", tt.status, tt.header, err)
		if err != nil {
			var se *httpsend.StatusError
			require.True(t, errors.As(err, &se))
			require.Contains(t, err.Error(), `{"error":"x"}`)
		}
	}
}

func TestWireNotSent(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		w    httpsend.Wire
		want bool
	}{
		{httpsend.Wire{}, true},
		{httpsend.Wire{Attempts: 1, WritesEnded: 1, WriteErr: io.ErrClosedPipe}, true},
		{httpsend.Wire{Attempts: 1}, false}, // the write may still be under way
		{httpsend.Wire{Attempts: 1, WritesEnded: 1, HeadersWritten: true}, false},
		{httpsend.Wire{Attempts: 2, WritesEnded: 1}, false},
		{httpsend.Wire{Attempts: 2, WritesEnded: 2, Replayed: true}, false},
	} {
		require.Equal(t, tt.want, tt.w.NotSent(), "%+v", tt.w)
	}
}
