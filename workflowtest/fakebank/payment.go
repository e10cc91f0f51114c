package fakebank

import (
	"slices"
	"time"
)

// PaymentRequest is the body of POST /payments. Two requests under one idempotency key are "the
// same" when these fields are equal; formatting of the JSON does not matter.
type PaymentRequest struct {
	// Account is the payee. An account starting with "closed-" is declined.
	Account string `json:"account"`
	// Amount is in minor units (cents). Zero or negative is declined.
	Amount int64 `json:"amount"`
	// Currency is an ISO 4217 code such as "EUR".
	Currency string `json:"currency"`
	// Reference is the caller's business reference (a settlement id, say). The bank does not
	// dedupe on it; DuplicateReferences reports references paid under more than one key.
	Reference string `json:"reference"`
}

// Status is the bank's final decision on a payment.
type Status string

const (
	// StatusSucceeded means the money moved.
	StatusSucceeded Status = "succeeded"
	// StatusFailed means the bank declined the payment for good; resending it under the same key
	// returns the same decline.
	StatusFailed Status = "failed"
)

// Payment is what the bank recorded under an idempotency key.
type Payment struct {
	ID             string    `json:"id"`
	IdempotencyKey string    `json:"idempotency_key"`
	Account        string    `json:"account"`
	Amount         int64     `json:"amount"`
	Currency       string    `json:"currency"`
	Reference      string    `json:"reference"`
	Status         Status    `json:"status"`
	DeclineReason  string    `json:"decline_reason,omitempty"`
	CreatedAt      time.Time `json:"created_at"`
}

func (p *Payment) request() PaymentRequest {
	return PaymentRequest{Account: p.Account, Amount: p.Amount, Currency: p.Currency, Reference: p.Reference}
}

// StatementQuery filters a statement. Zero fields do not filter.
type StatementQuery struct {
	// Currency keeps only payments in this currency.
	Currency string
	// From keeps payments created at or after it.
	From time.Time
	// To keeps payments created before it, so consecutive windows never count a payment twice.
	To time.Time
}

func (q *StatementQuery) match(p *Payment) bool {
	return p.Status == StatusSucceeded &&
		(q.Currency == "" || p.Currency == q.Currency) &&
		(q.From.IsZero() || !p.CreatedAt.Before(q.From)) &&
		(q.To.IsZero() || p.CreatedAt.Before(q.To))
}

// Stats counts what the bank saw. Requests counts every POST /payments that reached the bank,
// malformed and faulted ones included; Applied counts new keys (declines included, also counted
// in Declined); Faults counts the faults met, by kind.
type Stats struct {
	Requests  int           `json:"requests"`
	Applied   int           `json:"applied"`
	Declined  int           `json:"declined"`
	Replays   int           `json:"replays"`
	Conflicts int           `json:"conflicts"`
	Faults    map[Fault]int `json:"faults"`
}

// Ledger is a snapshot of everything the bank applied, for checking invariants from outside,
// possibly from another process (GET /admin/ledger).
type Ledger struct {
	// Payments holds every payment the bank applied, declined ones included, in the order it
	// applied them.
	Payments []Payment `json:"payments"`
	// References maps each reference to the keys it was paid (succeeded) under, in order.
	References map[string][]string `json:"references"`
	Stats      Stats               `json:"stats"`
}

// Effects counts the payments applied under key. The bank makes it 0 or 1; a test asserts it
// rather than trusting that.
func (l *Ledger) Effects(key string) int {
	n := 0
	for i := range l.Payments {
		if l.Payments[i].IdempotencyKey == key {
			n++
		}
	}
	return n
}

// DuplicateReferences returns the references paid under more than one key: the mark of a caller
// that resent under a new key instead of the one it first used.
func (l *Ledger) DuplicateReferences() map[string][]string {
	return duplicates(l.References)
}

func duplicates(refs map[string][]string) map[string][]string {
	out := make(map[string][]string)
	for ref, keys := range refs {
		if len(keys) > 1 {
			out[ref] = slices.Clone(keys)
		}
	}
	return out
}
