package fakebank

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"time"
)

// Outcome is what the bank did with one POST /payments request.
type Outcome string

const (
	// OutcomeApplied: a payment was recorded and money moved.
	OutcomeApplied Outcome = "applied"
	// OutcomeDeclined: a decline was recorded (an effect too: the bank decided under the key).
	OutcomeDeclined Outcome = "declined"
	// OutcomeReplayed: the key was known and the stored answer returned (default mode only).
	OutcomeReplayed Outcome = "replayed"
	// OutcomeConflict: the key was known for another payment (default mode only).
	OutcomeConflict Outcome = "conflict"
	// OutcomeRefused: a fault refused the request before applying it.
	OutcomeRefused Outcome = "refused"
	// OutcomeMalformed: the request was rejected as malformed; nothing recorded.
	OutcomeMalformed Outcome = "malformed"
	// OutcomeAbandoned: the bank closed before it decided.
	OutcomeAbandoned Outcome = "abandoned"
)

// Request is the bank's record of one POST /payments request: which operation (idempotency
// key) it was for, how much, and when it arrived, was decided and was answered. A test checks
// send discipline against this log: two requests of one key in flight at once, or a request
// after the caller's ledger recorded the operation final, are visible here even when the bank
// answered both correctly.
type Request struct {
	Seq         int    `json:"seq"`
	OperationID string `json:"operation_id"` // the Idempotency-Key header
	Account     string `json:"account"`
	Amount      int64  `json:"amount"`
	Currency    string `json:"currency"`
	Reference   string `json:"reference"`
	// Arrived is when the request reached the bank, before any latency.
	Arrived time.Time `json:"arrived"`
	// Decided is when the bank decided the request's effect (applied, declined, refused...);
	// after Arrived by the latency of a slow request. Zero if it never decided.
	Decided time.Time `json:"decided"`
	// Answered is when the bank finished writing its answer (or dropped the connection).
	// Zero if the caller went away first.
	Answered time.Time `json:"answered"`
	// Abandoned is when the caller hung up before the answer (its timeout, say); zero if it
	// waited for the answer.
	Abandoned time.Time `json:"abandoned"`
	// Latency is the processing delay the latency profile drew for the request, Stall the
	// answer hold after applying.
	Latency time.Duration `json:"latency"`
	Stall   time.Duration `json:"stall"`
	Fault   Fault         `json:"fault"`
	Outcome Outcome       `json:"outcome"`
	// Effect says the bank recorded a payment (or a decline) for this request: in strict mode
	// every such request is an effect of its own.
	Effect    bool   `json:"effect"`
	PaymentID string `json:"payment_id,omitempty"`
}

// Ended is when the request ended for its caller: the answer, or the caller hanging up,
// whichever came first. Zero if neither has happened yet.
func (r *Request) Ended() time.Time {
	switch {
	case r.Abandoned.IsZero():
		return r.Answered
	case r.Answered.IsZero() || r.Abandoned.Before(r.Answered):
		return r.Abandoned
	}
	return r.Answered
}

// Requests returns the request log: every POST /payments that reached the bank, in arrival order.
func (b *Bank) Requests() []Request {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]Request, len(b.requests))
	for i, r := range b.requests {
		out[i] = *r
	}
	return out
}

// arrive opens a request record, stamped with the time the request reached the bank.
func (b *Bank) arrive(arrived time.Time) *Request {
	b.mu.Lock()
	defer b.mu.Unlock()
	r := &Request{Seq: len(b.requests) + 1, Arrived: arrived}
	b.requests = append(b.requests, r)
	return r
}

// update changes a request record under the lock, since Requests may be reading it.
func (b *Bank) update(r *Request, f func(r *Request)) {
	b.mu.Lock()
	defer b.mu.Unlock()
	f(r)
}

// LatencyProfile is how long the bank takes over payment requests, drawn per request from the
// bank's seeded source. The zero value answers at once.
//
// A slow request is decided only after its latency, whether or not the caller is still
// waiting (a real bank does not cancel a payment because the client hung up): pick SlowMax
// above the caller's timeout to make a share of requests time out and apply afterwards. A
// stalled request is applied at once, then its answer is held for StallFor (or until the
// caller hangs up): the caller cannot tell it from a slow one.
type LatencyProfile struct {
	// Slow is the share of requests in [0, 1] decided after a latency drawn uniformly from
	// [SlowMin, SlowMax].
	Slow             float64       `json:"slow,omitempty"`
	SlowMin, SlowMax time.Duration `json:"-"`
	// Stall is the share of requests in [0, 1] applied at once and answered after StallFor.
	Stall    float64       `json:"stall,omitempty"`
	StallFor time.Duration `json:"-"`
}

// ProfileZero answers every request at once.
func ProfileZero() LatencyProfile { return LatencyProfile{} }

// ProfileSlow makes 60% of requests slow, with latencies from half the caller's timeout to
// one and a half times it, so about a fifth of all requests time out at the caller and apply
// afterwards.
func ProfileSlow(callerTimeout time.Duration) LatencyProfile {
	return LatencyProfile{Slow: 0.6, SlowMin: callerTimeout / 2, SlowMax: callerTimeout * 3 / 2}
}

// ProfileStalls applies 10% of requests at once and holds their answer for three times the
// caller's timeout: the caller times out on a payment that was made.
func ProfileStalls(callerTimeout time.Duration) LatencyProfile {
	return LatencyProfile{Stall: 0.1, StallFor: 3 * callerTimeout}
}

// Validate reports a share outside [0, 1], shares summing above 1, or bad durations.
func (p LatencyProfile) Validate() error {
	switch {
	case p.Slow < 0 || p.Slow > 1 || p.Stall < 0 || p.Stall > 1:
		return fmt.Errorf("latency profile: shares slow %v and stall %v must be between 0 and 1", p.Slow, p.Stall)
	case p.Slow+p.Stall > 1+1e-9:
		return fmt.Errorf("latency profile: shares slow %v and stall %v sum to more than 1", p.Slow, p.Stall)
	case p.Slow > 0 && (p.SlowMin < 0 || p.SlowMax < p.SlowMin):
		return fmt.Errorf("latency profile: slow latencies [%s, %s] must be non-negative and ordered", p.SlowMin, p.SlowMax)
	case p.Stall > 0 && p.StallFor <= 0:
		return fmt.Errorf("latency profile: StallFor %s must be positive when Stall is %v", p.StallFor, p.Stall)
	}
	return nil
}

// draw picks one request's processing latency and answer stall.
func (p LatencyProfile) draw(rng *rand.Rand) (latency, stall time.Duration) {
	if p.Slow == 0 && p.Stall == 0 {
		return 0, 0
	}
	u := rng.Float64()
	switch {
	case u < p.Slow:
		return p.SlowMin + time.Duration(rng.Int64N(int64(p.SlowMax-p.SlowMin)+1)), 0
	case u < p.Slow+p.Stall:
		return 0, p.StallFor
	}
	return 0, 0
}

// drawLatency draws from the bank's seeded source under its lock.
func (b *Bank) drawLatency() (latency, stall time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.cfg.Profile.draw(b.rng)
}

// RequestsFor returns the requests of one operation, in arrival order.
func RequestsFor(log []Request, operationID string) []Request {
	return slices.DeleteFunc(slices.Clone(log), func(r Request) bool { return r.OperationID != operationID })
}
