package fakebank

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
)

// ErrNotFound is returned (wrapped in an *Error) by Client.Lookup when the bank has no payment
// under the key. Only the bank's own "not found" answer produces it, never a 404 from a wrong URL.
// It means "not applied yet": a request still in flight may land after the lookup.
var ErrNotFound = errors.New("no payment under this idempotency key")

// Error is a failed call to the bank. Classify it with IsDeclined, IsNotProcessed and IsConflict;
// anything else is ambiguous and the payment must be treated as UNKNOWN.
type Error struct {
	// Op is the client call: "pay", "lookup", "statement", "ledger" or "set faults".
	Op string
	// Key is the idempotency key, for pay and lookup.
	Key string
	// StatusCode is the HTTP status, or 0 when no answer arrived.
	StatusCode int
	// NotProcessed means the bank provably did not apply the request (a pay, or set faults):
	// a 429 carrying X-Not-Processed, or a request the wire shows never reached the bank
	// (httpsend.Wire). Resending under the same key is safe. Reads never set it.
	NotProcessed bool
	// Declined means the bank applied the payment as failed (422), for good.
	Declined bool
	// Body is the answer's body, if any.
	Body string
	// Err is the transport or decoding error, or ErrNotFound.
	Err error
}

func (e *Error) Error() string {
	var sb strings.Builder
	sb.WriteString("fakebank: ")
	sb.WriteString(e.Op)
	if e.Key != "" {
		fmt.Fprintf(&sb, " %q", e.Key)
	}
	if e.StatusCode != 0 {
		fmt.Fprintf(&sb, ": %d %s", e.StatusCode, http.StatusText(e.StatusCode))
	}
	switch {
	case e.Err != nil:
		sb.WriteString(": ")
		sb.WriteString(e.Err.Error())
	case e.Body != "":
		sb.WriteString(": ")
		sb.WriteString(e.message())
	}
	return sb.String()
}

// message prefers the bank's own error text; a body from something else is shown as is.
func (e *Error) message() string {
	var body errorBody
	if json.Unmarshal([]byte(e.Body), &body) == nil && body.Message != "" {
		return body.Message
	}
	const max = 512
	if len(e.Body) > max {
		return e.Body[:max] + "…"
	}
	return strings.TrimSpace(e.Body)
}

func (e *Error) Unwrap() error { return e.Err }

// IsDeclined reports whether the bank declined the payment (422). The decision is permanent and
// stored under the key: mark the operation failed, do not resend.
func IsDeclined(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Declined
}

// IsNotProcessed reports whether the request provably never took effect: the bank refused it
// with 429 and X-Not-Processed, or the wire shows the request never reached the bank (no
// connection was obtained, as when the dial is refused, or the header block was never
// completely written; see httpsend.Wire.NotSent). Resending under the same key is safe.
//
// A dial error alone is not that proof: net/http resends a request by itself after its
// kept-alive connection died, and the error it returns is the resend's, so "connection
// refused" can follow a request the bank applied. The Client stops those resends, and only
// its own *Error says what the wire showed; any other error is not NotProcessed.
//
// Any other failure, including a timeout, a reset, EOF and any 5xx, is ambiguous: the bank may
// have applied the payment. Treat it as UNKNOWN and find out (Lookup), never as failed.
func IsNotProcessed(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.NotProcessed
}

// IsConflict reports whether the key was already used for a different payment (409). It is a
// bug in the caller, which must never reuse a key for another payment.
func IsConflict(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.StatusCode == http.StatusConflict
}
