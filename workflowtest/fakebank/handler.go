package fakebank

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"
)

// HeaderNotProcessed marks a refusal the bank guarantees it did not apply. Only its presence on a
// 429 makes a failure safe to resend; the status code alone is not enough, since proxies and
// other servers send 429 too.
const HeaderNotProcessed = "X-Not-Processed"

// Error codes in the JSON error body, so a client can tell the bank's own 404 from a wrong URL.
const (
	codeBadRequest   = "bad_request"
	codeConflict     = "conflict"
	codeDeclined     = "declined"
	codeInternal     = "internal"
	codeNotFound     = "not_found"
	codeNotProcessed = "not_processed"
	codeUnavailable  = "unavailable"
)

// errorBody is every non-2xx answer's body. A decline carries the recorded payment.
type errorBody struct {
	Code    string   `json:"code"`
	Message string   `json:"error"`
	Payment *Payment `json:"payment,omitempty"`
}

// maxBody bounds a request body; payment requests are tiny, admin ones too.
const maxBody = 1 << 20

type handler struct {
	b   *Bank
	mux *http.ServeMux
}

func (b *Bank) newHandler() http.Handler {
	h := &handler{b: b, mux: http.NewServeMux()}
	h.mux.HandleFunc("POST /payments", h.pay)
	h.mux.HandleFunc("GET /payments/{key}", h.lookup)
	h.mux.HandleFunc("GET /statement", h.statement)
	h.mux.HandleFunc("GET /admin/ledger", h.ledger)
	h.mux.HandleFunc("POST /admin/faults", h.setFaults)
	h.mux.HandleFunc("GET /admin/requests", h.requests)
	return h
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !h.b.enter() {
		writeJSON(w, http.StatusServiceUnavailable, errorBody{Code: codeUnavailable, Message: "the bank is closed"})
		return
	}
	defer h.b.inflight.Done()
	// The arrival is stamped before any latency, so the request log shows when the caller's
	// request was already at the bank, not when the bank got round to it.
	if r.Method == http.MethodPost && r.URL.Path == "/payments" {
		r = r.WithContext(context.WithValue(r.Context(), arrivedKey{}, time.Now()))
	}
	if !strings.HasPrefix(r.URL.Path, "/admin/") && !h.b.sleep(r.Context(), h.b.cfg.Latency) {
		return // the caller or the bank went away while the request waited
	}
	h.mux.ServeHTTP(w, r)
}

type arrivedKey struct{}

func (h *handler) pay(w http.ResponseWriter, r *http.Request) {
	h.b.countRequest()
	arrived, ok := r.Context().Value(arrivedKey{}).(time.Time)
	if !ok {
		arrived = time.Now()
	}
	rec := h.b.arrive(arrived)
	// The caller hanging up is part of the record: it is when the request ended for the
	// caller, which a resend must wait for (plus the grace period).
	stopWatch := context.AfterFunc(r.Context(), func() {
		h.b.update(rec, func(rec *Request) {
			if rec.Answered.IsZero() {
				rec.Abandoned = time.Now()
			}
		})
	})
	defer stopWatch()
	w = &answerStamp{ResponseWriter: w, b: h.b, rec: rec}
	defer func() {
		// The hang-up is recorded here too, not only by the AfterFunc above: that runs in a
		// goroutine of its own, and a stalled handler woken by the same cancellation could
		// reach this point first and log the hang-up as an answer (seen under -race).
		hungUp := r.Context().Err() != nil
		h.b.update(rec, func(rec *Request) {
			if rec.Outcome == "" {
				rec.Outcome = OutcomeAbandoned
			}
			if rec.Answered.IsZero() && rec.Abandoned.IsZero() {
				if hungUp {
					rec.Abandoned = time.Now()
				} else {
					rec.Answered = time.Now()
				}
			}
		})
	}()
	key := r.Header.Get("Idempotency-Key")
	h.b.update(rec, func(rec *Request) { rec.OperationID = key })
	if key == "" {
		h.b.update(rec, func(rec *Request) { rec.Outcome, rec.Decided = OutcomeMalformed, time.Now() })
		writeJSON(w, http.StatusBadRequest, errorBody{Code: codeBadRequest,
			Message: "the Idempotency-Key header is required: the bank applies each key at most once"})
		return
	}
	var req PaymentRequest
	if err := decodeJSON(w, r, &req); err != nil {
		h.b.update(rec, func(rec *Request) { rec.Outcome, rec.Decided = OutcomeMalformed, time.Now() })
		writeJSON(w, http.StatusBadRequest, errorBody{Code: codeBadRequest,
			Message: fmt.Sprintf("payment under idempotency key %q: %v", key, err)})
		return
	}
	h.b.update(rec, func(rec *Request) {
		rec.Account, rec.Amount, rec.Currency, rec.Reference = req.Account, req.Amount, req.Currency, req.Reference
	})
	if msg := malformed(req); msg != "" {
		h.b.update(rec, func(rec *Request) { rec.Outcome, rec.Decided = OutcomeMalformed, time.Now() })
		writeJSON(w, http.StatusBadRequest, errorBody{Code: codeBadRequest,
			Message: fmt.Sprintf("payment under idempotency key %q: %s", key, msg)})
		return
	}

	latency, stall := h.b.drawLatency()
	h.b.update(rec, func(rec *Request) { rec.Latency, rec.Stall = latency, stall })
	// A slow request is decided after its latency even if the caller hung up meanwhile: a
	// real bank does not cancel a payment because its client timed out. Only Close cuts it.
	if !h.b.sleep(context.WithoutCancel(r.Context()), latency) {
		return
	}

	fault := h.b.takeFault(key)
	h.b.update(rec, func(rec *Request) { rec.Fault = fault })
	switch fault {
	case RefuseBeforeApply:
		h.b.update(rec, func(rec *Request) { rec.Outcome, rec.Decided = OutcomeRefused, time.Now() })
		w.Header().Set(HeaderNotProcessed, "true")
		w.Header().Set("Retry-After", "1")
		writeJSON(w, http.StatusTooManyRequests, errorBody{Code: codeNotProcessed,
			Message: fmt.Sprintf("too many requests; payment under idempotency key %q was not processed, resend it", key)})
		return
	case Error5xxBeforeApply:
		h.b.update(rec, func(rec *Request) { rec.Outcome, rec.Decided = OutcomeRefused, time.Now() })
		writeJSON(w, h.b.error5xxStatus(), errorBody{Code: codeInternal, Message: "internal error"})
		return
	}

	status, body := h.b.apply(key, req, rec)
	if !h.b.sleep(r.Context(), stall) {
		return // a stalled answer: the caller gave up (or the bank closed) first
	}

	switch fault {
	case Error5xxAfterApply:
		// Same statuses and body as Error5xxBeforeApply, so a caller that reads "503" as "not
		// applied" resends into a payment that exists, and the test catches it.
		writeJSON(w, h.b.error5xxStatus(), errorBody{Code: codeInternal, Message: "internal error"})
		return
	case DropAfterApply:
		drop(w)
		return
	case CrashAfterApply:
		h.b.update(rec, func(rec *Request) { rec.Answered = time.Now() }) // the crash is the answer
		// A caller whose transport resends on a new connection is refused: the error it
		// sees ("connection refused") follows a payment that was made.
		_ = h.b.SetDown(true) // fails only if the bank is closing, which cuts the connection too
		return
	case DelayAfterApply:
		if !h.b.sleep(r.Context(), h.b.cfg.Delay) {
			return
		}
	}
	writeJSON(w, status, body)
}

// drop closes the connection without a byte of answer. Without a hijackable connection
// (HTTP/2), aborting the handler resets the stream, which the caller sees the same way.
func drop(w http.ResponseWriter) {
	if hj, ok := w.(http.Hijacker); ok {
		if conn, _, err := hj.Hijack(); err == nil {
			_ = conn.Close() // the caller is meant to see a dead connection; nothing to report
			return
		}
	}
	panic(http.ErrAbortHandler)
}

func (h *handler) lookup(w http.ResponseWriter, r *http.Request) {
	key := r.PathValue("key")
	h.b.mu.Lock()
	p, ok := h.b.payments[key]
	var cp Payment
	if ok {
		cp = *p
	}
	h.b.mu.Unlock()
	if !ok {
		writeJSON(w, http.StatusNotFound, errorBody{Code: codeNotFound,
			Message: fmt.Sprintf("no payment under idempotency key %q", key)})
		return
	}
	// A declined payment is found too: 200 with status "failed", since the lookup succeeded.
	writeJSON(w, http.StatusOK, &cp)
}

func (h *handler) statement(w http.ResponseWriter, r *http.Request) {
	v := r.URL.Query()
	q := StatementQuery{Currency: v.Get("currency")}
	for _, f := range []struct {
		name string
		dst  *time.Time
	}{{"from", &q.From}, {"to", &q.To}} {
		s := v.Get(f.name)
		if s == "" {
			continue
		}
		t, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			writeJSON(w, http.StatusBadRequest, errorBody{Code: codeBadRequest,
				Message: fmt.Sprintf("statement: %s=%q is not an RFC 3339 time such as 2026-03-08T00:00:00Z", f.name, s)})
			return
		}
		*f.dst = t
	}
	writeJSON(w, http.StatusOK, h.b.Statement(q))
}

func (h *handler) ledger(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, h.b.Ledger())
}

func (h *handler) requests(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, h.b.Requests())
}

// answerStamp stamps the request record when the answer is written or the connection dropped.
type answerStamp struct {
	http.ResponseWriter
	b   *Bank
	rec *Request
}

func (a *answerStamp) Write(p []byte) (int, error) {
	n, err := a.ResponseWriter.Write(p)
	a.b.update(a.rec, func(rec *Request) {
		if rec.Answered.IsZero() {
			rec.Answered = time.Now()
		}
	})
	return n, err
}

// Hijack keeps DropAfterApply working through the wrapper; the drop is the answer.
func (a *answerStamp) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	hj, ok := a.ResponseWriter.(http.Hijacker)
	if !ok {
		return nil, nil, http.ErrNotSupported
	}
	a.b.update(a.rec, func(rec *Request) {
		if rec.Answered.IsZero() {
			rec.Answered = time.Now()
		}
	})
	return hj.Hijack()
}

func (h *handler) setFaults(w http.ResponseWriter, r *http.Request) {
	var m Mix
	if err := decodeJSON(w, r, &m); err != nil {
		writeJSON(w, http.StatusBadRequest, errorBody{Code: codeBadRequest, Message: fmt.Sprintf("fault mix: %v", err)})
		return
	}
	if err := h.b.SetFaults(m); err != nil {
		writeJSON(w, http.StatusBadRequest, errorBody{Code: codeBadRequest, Message: err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, m)
}

// malformed rejects requests a real bank's API would not accept at all. They are not declines:
// nothing is recorded, so the key stays free.
func malformed(req PaymentRequest) string {
	if req.Account == "" {
		return "account is required"
	}
	if len(req.Currency) != 3 || strings.IndexFunc(req.Currency, func(r rune) bool { return r < 'A' || r > 'Z' }) >= 0 {
		return fmt.Sprintf("currency %q must be a three-letter ISO 4217 code such as \"EUR\"", req.Currency)
	}
	return ""
}

func decodeJSON(w http.ResponseWriter, r *http.Request, v any) error {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody))
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("invalid JSON body: %w", err)
	}
	if dec.More() {
		return fmt.Errorf("invalid JSON body: more than one JSON value")
	}
	return nil
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	// A write error means the caller is gone; there is no one left to tell.
	_ = json.NewEncoder(w).Encode(v)
}
