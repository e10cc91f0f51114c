package httpsend

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/stepwise-go/stepwise/internal/outbox"
)

// Rules say what the service's answers prove, from its own documentation. A nil field takes
// its default. Claim no more than an answer proves: a status a proxy, a gateway or an expired
// credential can produce proves nothing about the operation.
type Rules struct {
	// Succeeded reports whether the answer confirms the operation. Default: any 2xx.
	Succeeded func(a *Answer) bool
	// Refused reports whether the answer is the service's final refusal (a declined payment,
	// an invalid account): outbox.Permanent, FAILED_PERMANENT, never sent again. Default:
	// none.
	Refused func(a *Answer) bool
	// NotProcessed reports whether the answer proves the service did not act on the request
	// (a refusal it documents as "not processed, send again"): outbox.NotSent, RETRYABLE,
	// sent again under the same id. Default: none.
	NotProcessed func(a *Answer) bool
}

// Classify returns nil for an answer that confirms the operation, and otherwise a
// *StatusError: wrapped in outbox.Permanent when Refused, in outbox.NotSent when NotProcessed
// (Refused wins), as is (UNKNOWN_EXTERNAL) for every other answer.
func (r Rules) Classify(a *Answer) error {
	succeeded := r.Succeeded
	if succeeded == nil {
		succeeded = func(a *Answer) bool { return a.Status >= 200 && a.Status < 300 }
	}
	e := &StatusError{Answer: a}
	switch {
	case succeeded(a):
		return nil
	case r.Refused != nil && r.Refused(a):
		return outbox.Permanent(e)
	case r.NotProcessed != nil && r.NotProcessed(a):
		return outbox.NotSent(e)
	}
	return e
}

// StatusError is an answer that does not confirm the operation.
type StatusError struct {
	Answer *Answer
}

func (e *StatusError) Error() string {
	a := e.Answer
	s := fmt.Sprintf("httpsend: %d %s", a.Status, http.StatusText(a.Status))
	if body := strings.TrimSpace(string(a.Body)); body != "" {
		const max = 256
		if len(body) > max {
			body = body[:max] + "…"
		}
		s += ": " + body
	}
	return s
}
