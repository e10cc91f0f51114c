package httpsend

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"strings"
	"sync"
	"time"

	"github.com/stepwise-go/stepwise/internal/outbox"
)

// MaxAnswerBytes bounds the answer body Do reads. A longer answer is an *Error (the status
// arrived, so the request was processed in some way: UNKNOWN_EXTERNAL).
const MaxAnswerBytes = 8 << 20

// Wire is what one Do did on the network, recorded through net/http/httptrace.
type Wire struct {
	// Attempts is the number of connections the transport handed the request (GotConn): 0
	// when it never had one (a refused or failed dial, DNS, a TLS handshake, a context that
	// ended first), 1 normally, more only when the transport tried again.
	Attempts int
	// Reused says the last connection had carried earlier requests (kept alive); WasIdle and
	// IdleTime say it had waited in the idle pool, and for how long.
	Reused   bool
	WasIdle  bool
	IdleTime time.Duration
	// HeadersWritten says an attempt wrote the request's whole header block (WroteHeaders).
	// net/http reports it once the block is in the connection's buffer, before it is flushed,
	// so it may be true of a request that never left the machine; once it is true, the
	// service may have acted on the request.
	HeadersWritten bool
	// WritesEnded is the number of attempts whose write of the request ended (WroteRequest),
	// WriteErr the last one's error, nil if it wrote the whole request.
	WritesEnded int
	WriteErr    error
	// Answered says the first byte of an answer arrived.
	Answered bool
	// Replayed says the transport began another attempt (asked for a connection, or got
	// one) after an earlier one had written its header block: it resent the request by
	// itself, or tried to. Do prevents that for every method but
	// GET, HEAD, OPTIONS and TRACE; seen, the failure is never classified not sent.
	Replayed bool
}

// NotSent reports whether the wire proves the service never received the request: no
// attempt obtained a connection, or every attempt's write ended before its header block
// was complete. A server dispatches a request only once it has the whole header block.
func (w Wire) NotSent() bool {
	if w.Attempts == 0 {
		return true
	}
	return !w.HeadersWritten && !w.Replayed && w.WritesEnded >= w.Attempts
}

// String describes the wire for an error message.
func (w Wire) String() string {
	switch {
	case w.Attempts == 0:
		return "no connection was obtained: the request was never written"
	case w.NotSent():
		return "the request's header block was never completely written: the service cannot have received it"
	case w.Replayed:
		return "net/http began another attempt after the request had been written: the service may have acted on it more than once"
	}
	var sb strings.Builder
	sb.WriteString("the request was written on a ")
	switch {
	case w.Reused && w.WasIdle:
		fmt.Fprintf(&sb, "reused connection (idle %s)", w.IdleTime.Round(time.Microsecond))
	case w.Reused:
		sb.WriteString("reused connection")
	default:
		sb.WriteString("new connection")
	}
	if w.Answered {
		sb.WriteString(" and an answer began")
	} else {
		sb.WriteString(" and no answer arrived")
	}
	sb.WriteString(": the service may have acted on it")
	return sb.String()
}

// Error is a request that got no whole answer. Err is net/http's error (or the failure to
// read the answer, with Status set); Wire says what happened on the wire. Do wraps it in
// outbox.NotSent when Wire.NotSent(); errors.As finds it either way.
type Error struct {
	// Status is the answer's status when the answer began but its body could not be read
	// (or was too long); 0 when no answer arrived.
	Status int
	Wire   Wire
	Err    error
}

func (e *Error) Error() string {
	s := "httpsend: " + errString(e.Err)
	if e.Status != 0 {
		s = fmt.Sprintf("httpsend: %d %s: %s", e.Status, http.StatusText(e.Status), errString(e.Err))
	}
	return s + " (" + e.Wire.String() + ")"
}

func (e *Error) Unwrap() error { return e.Err }

func errString(err error) string {
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}

// Answer is the service's whole answer to one request.
type Answer struct {
	Status int
	Header http.Header
	Body   []byte
	Wire   Wire
}

// Do sends req through c (http.DefaultClient if nil) once, as the package documentation
// describes, and returns the whole answer whatever its status. req is not changed (Do sends
// a clone), but its body is consumed; the context of the send is req's.
//
// On failure the error is an *Error, wrapped in outbox.NotSent only when its Wire proves the
// service never received the request: return it from a Sender as is.
func Do(c *http.Client, req *http.Request) (*Answer, error) {
	if c == nil {
		c = http.DefaultClient
	}
	ctx, cancel := context.WithCancelCause(req.Context())
	defer cancel(nil)
	rec := &recorder{cancel: cancel, replayable: replayableMethod(req.Method)}
	r := req.Clone(httptrace.WithClientTrace(ctx, rec.trace()))
	// No rewind, no replay: net/http resends a request it has written only when it can
	// rewind the body (GetBody). Guards against the transport resending, unseen, a request
	// the service processed before its kept-alive connection died.
	r.GetBody = nil
	if r.Body == nil || r.Body == http.NoBody {
		// A bodiless request needs no rewinding; net/http then treats it as replayable when
		// it carries the canonical Idempotency-Key or X-Idempotency-Key. Stored under a
		// lower-case name, the header goes out the same (names are case-insensitive) and
		// the request is not replayable.
		lowerReplayHeaders(r.Header)
	}
	once := *c
	// A redirect is the service's answer; following a 307 or 308 would send the body again.
	once.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	resp, err := once.Do(r)
	if err != nil {
		e := &Error{Wire: rec.snapshot(), Err: err}
		if e.Wire.NotSent() {
			return nil, outbox.NotSent(e)
		}
		return nil, e
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, MaxAnswerBytes+1))
	switch {
	case err != nil:
		// The answer began, so the request was read; an answer we cannot read proves nothing.
		return nil, &Error{Status: resp.StatusCode, Wire: rec.snapshot(), Err: fmt.Errorf("reading the answer: %w", err)}
	case len(body) > MaxAnswerBytes:
		return nil, &Error{Status: resp.StatusCode, Wire: rec.snapshot(),
			Err: fmt.Errorf("the answer is longer than %d bytes (httpsend.MaxAnswerBytes)", MaxAnswerBytes)}
	}
	return &Answer{Status: resp.StatusCode, Header: resp.Header, Body: body, Wire: rec.snapshot()}, nil
}

// replayableMethod reports the methods net/http resends whatever the request's headers.
func replayableMethod(m string) bool {
	switch m {
	case "", http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return true
	}
	return false
}

// lowerReplayHeaders moves the header names net/http reads as "replayable" to lower case.
func lowerReplayHeaders(h http.Header) {
	for _, k := range []string{"Idempotency-Key", "X-Idempotency-Key"} {
		if vs, ok := h[k]; ok {
			delete(h, k)
			lk := strings.ToLower(k)
			h[lk] = append(h[lk], vs...)
		}
	}
}

// recorder collects the trace of one Do. Its hooks run on net/http's goroutines, some of
// them after Client.Do has returned, hence the lock and the snapshot.
type recorder struct {
	mu         sync.Mutex
	w          Wire
	cancel     context.CancelCauseFunc
	replayable bool
}

// errReplay is the cause of the context Do cancels when the transport starts another attempt.
var errReplay = errors.New("httpsend: net/http began to resend a request it had already written; stopped")

func (rc *recorder) trace() *httptrace.ClientTrace {
	return &httptrace.ClientTrace{
		// GetConn starts each HTTP/1 attempt, before any dial: a resend that is refused a
		// connection is seen here too.
		GetConn: func(string) {
			rc.mu.Lock()
			defer rc.mu.Unlock()
			rc.replayLocked()
		},
		GotConn: func(info httptrace.GotConnInfo) {
			rc.mu.Lock()
			defer rc.mu.Unlock()
			rc.w.Attempts++
			rc.w.Reused, rc.w.WasIdle, rc.w.IdleTime = info.Reused, info.WasIdle, info.IdleTime
			rc.replayLocked() // HTTP/2 retries a stream without a new GetConn
		},
		WroteHeaders: func() {
			rc.mu.Lock()
			defer rc.mu.Unlock()
			rc.w.HeadersWritten = true
		},
		WroteRequest: func(info httptrace.WroteRequestInfo) {
			rc.mu.Lock()
			defer rc.mu.Unlock()
			rc.w.WritesEnded++
			rc.w.WriteErr = info.Err
		},
		GotFirstResponseByte: func() {
			rc.mu.Lock()
			defer rc.mu.Unlock()
			rc.w.Answered = true
		},
	}
}

// replayLocked notes a new attempt after one wrote its header block: the transport is
// resending the request by itself.
func (rc *recorder) replayLocked() {
	if !rc.w.HeadersWritten {
		return
	}
	rc.w.Replayed = true
	if !rc.replayable {
		// Belt and braces: Do's clone cannot be rewound, but should a transport resend it
		// anyway (HTTP/2 retries some resets of a bodiless request), end it. net/http waits
		// for a new connection and HTTP/2 writes headers only while the context is live.
		rc.cancel(errReplay)
	}
}

func (rc *recorder) snapshot() Wire {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.w
}
