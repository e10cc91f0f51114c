package reconcile

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/internal/outbox"
)

// TestDecide is the table of the reconciliation rules, without a database.
func TestDecide(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	k := &KindConfig{
		Grace:        5 * time.Minute,
		GiveUpAfter:  72 * time.Hour,
		MaxChecks:    10,
		CheckBackoff: func(check int) time.Duration { return time.Duration(check) * time.Minute },
	}
	ago := func(d time.Duration) *time.Time { t := now.Add(-d); return &t }
	op := func(mod func(*outbox.Operation)) *outbox.Operation {
		o := &outbox.Operation{EnqueueParams: outbox.EnqueueParams{Amount: 1000, Currency: "EUR"}, Checks: 1, Attempts: 1,
			CreatedAt: now.Add(-time.Hour), LastSentAt: ago(time.Hour), InFlightUntil: ago(time.Hour), UnknownSince: ago(time.Hour)}
		if mod != nil {
			mod(o)
		}
		return o
	}
	found := LookupResult{Status: LookupFoundSucceeded, ExternalRef: "p-1", Amount: 1000, Currency: "EUR"}

	cases := []struct {
		name       string
		op         *outbox.Operation
		res        LookupResult
		err        error
		maxAttempt int
		wantStay   bool
		wantNext   time.Time
		wantTo     outbox.State
		wantReason string
	}{
		{name: "found succeeded", op: op(nil), res: found, wantTo: outbox.StateSucceeded},
		{name: "found, amount differs", op: op(nil), res: LookupResult{Status: LookupFoundSucceeded, Amount: 999, Currency: "EUR"},
			wantTo: outbox.StateManual, wantReason: "mismatch: the external system holds 999 EUR"},
		{name: "found, currency differs", op: op(nil), res: LookupResult{Status: LookupFoundSucceeded, Amount: 1000, Currency: "USD"},
			wantTo: outbox.StateManual, wantReason: "mismatch"},
		{name: "found, no money on the operation", op: op(func(o *outbox.Operation) { o.Amount, o.Currency = 0, "" }),
			res: LookupResult{Status: LookupFoundSucceeded}, wantTo: outbox.StateSucceeded},
		{name: "found failed", op: op(nil), res: LookupResult{Status: LookupFoundFailed, Reason: "closed"}, wantTo: outbox.StateFailedPermanent},
		{name: "pending", op: op(nil), res: LookupResult{Status: LookupPending}, wantStay: true, wantNext: now.Add(time.Minute)},
		{name: "lookup error", op: op(func(o *outbox.Operation) { o.Checks = 3 }), err: errors.New("timeout"),
			wantStay: true, wantNext: now.Add(3 * time.Minute)},
		{name: "unknown status is an error", op: op(nil), res: LookupResult{Status: "maybe"}, wantStay: true, wantNext: now.Add(time.Minute)},
		{name: "not found inside grace", op: op(func(o *outbox.Operation) { o.LastSentAt, o.InFlightUntil = ago(time.Minute), ago(time.Minute) }),
			res: LookupResult{Status: LookupNotFound}, wantStay: true, wantNext: now.Add(4 * time.Minute)},
		{name: "not found after grace", op: op(nil), res: LookupResult{Status: LookupNotFound}, wantTo: outbox.StateRetryable},
		{name: "not found after grace, out of attempts", op: op(func(o *outbox.Operation) { o.Attempts = 5 }),
			res: LookupResult{Status: LookupNotFound}, maxAttempt: 5, wantTo: outbox.StateManual, wantReason: "not found after 5 attempts"},
		{name: "pending, too old", op: op(func(o *outbox.Operation) { o.UnknownSince = ago(73 * time.Hour) }),
			res: LookupResult{Status: LookupPending}, wantTo: outbox.StateManual, wantReason: "gave up: unknown for 73h0m0s"},
		{name: "error, too many checks", op: op(func(o *outbox.Operation) { o.Checks = 10 }), err: errors.New("503"),
			wantTo: outbox.StateManual, wantReason: "gave up: 10 checks (MaxChecks 10); last lookup: lookup failed: 503"},
		{name: "not found after grace, too old", op: op(func(o *outbox.Operation) { o.UnknownSince = ago(100 * time.Hour) }),
			res: LookupResult{Status: LookupNotFound}, wantTo: outbox.StateManual, wantReason: "gave up"},
		{name: "found, however old", op: op(func(o *outbox.Operation) { o.UnknownSince, o.Checks = ago(1000*time.Hour), 99 }),
			res: found, wantTo: outbox.StateSucceeded},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := decide(tc.op, tc.res, tc.err, now, k, tc.maxAttempt)
			require.Equal(t, tc.wantStay, d.stay, d.lookup)
			if tc.wantStay {
				require.WithinDuration(t, tc.wantNext, d.next, time.Second)
				return
			}
			require.Equal(t, tc.wantTo, d.to, d.reason)
			require.Contains(t, d.reason, tc.wantReason)
			if tc.wantTo == outbox.StateSucceeded {
				require.Equal(t, tc.res.ExternalRef, d.ref)
			}
		})
	}
}

func TestDefaultCheckBackoff(t *testing.T) {
	t.Parallel()
	for check, base := range map[int]time.Duration{1: 5 * time.Second, 3: 20 * time.Second, 30: time.Hour} {
		for range 50 {
			d := DefaultCheckBackoff(check)
			require.GreaterOrEqual(t, d, base*3/4)
			require.LessOrEqual(t, d, base*5/4)
		}
	}
}
