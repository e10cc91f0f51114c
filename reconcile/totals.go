package reconcile

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/stepwise-go/stepwise"
	"github.com/stepwise-go/stepwise/internal/ledger"
	"github.com/stepwise-go/stepwise/outbox"
)

// StatementEntry is one effect on an external system's statement.
type StatementEntry struct {
	// Key is the idempotency key the effect was applied under: our operation_id.
	Key string
	// ExternalRef is the external system's own reference.
	ExternalRef string
	// Amount in minor units, and Currency.
	Amount   int64
	Currency string
	// At is when the external system applied it.
	At time.Time
}

// Statement is an external system's list of applied effects (a bank statement).
type Statement interface {
	// Entries returns the effects applied at or after from and before to.
	Entries(ctx context.Context, from, to time.Time) ([]StatementEntry, error)
}

// StatementFunc adapts a function to Statement.
type StatementFunc func(ctx context.Context, from, to time.Time) ([]StatementEntry, error)

// Entries calls f.
func (f StatementFunc) Entries(ctx context.Context, from, to time.Time) ([]StatementEntry, error) {
	return f(ctx, from, to)
}

// TotalsParams selects what CompareTotals compares.
type TotalsParams struct {
	// Kind is the kind of operation compared. Required.
	Kind string
	// From (inclusive) and To (exclusive) bound the period: on the statement, by the time the
	// external system applied an effect; in the ledger, by the time the operation was last
	// sent (an effect is applied while it is being sent). An operation sent just before To
	// and applied just after it shows up as a difference on each side of the boundary.
	// Required.
	From, To time.Time
}

// Sum is a count and a sum of amounts.
type Sum struct {
	Count  int
	Amount int64
}

// DifferenceKind says how the ledger and the statement disagree on one effect.
type DifferenceKind string

const (
	// OnlyHere: SUCCEEDED in the ledger, missing from the statement.
	OnlyHere DifferenceKind = "only_here"
	// OnlyThere: on the statement, not SUCCEEDED in the ledger (OurState says what the ledger
	// holds, if anything: UNKNOWN_EXTERNAL means the reconciler has yet to find it).
	OnlyThere DifferenceKind = "only_there"
	// AmountDiffers: on both, with different amounts or currencies.
	AmountDiffers DifferenceKind = "amount_differs"
)

// Difference is one effect the ledger and the statement disagree on.
type Difference struct {
	Kind        DifferenceKind
	Key         string       // the idempotency key (operation_id)
	BusinessKey string       // ours, when the ledger has the operation
	OurState    outbox.State // the ledger's state, "" when the ledger has no such operation
	ExternalRef string
	OurAmount   int64
	OurCurrency string
	Amount      int64 // the statement's
	Currency    string
}

// Totals is the comparison of the ledger's SUCCEEDED operations of a kind with an external
// statement over a period: count and sum per currency on each side, and every difference.
type Totals struct {
	Kind        string
	From, To    time.Time
	Here        map[string]Sum // per currency, the ledger's SUCCEEDED operations
	There       map[string]Sum // per currency, the statement's entries
	Differences []Difference
}

// Match reports whether the two sides agree on every effect.
func (t *Totals) Match() bool { return len(t.Differences) == 0 }

// String renders the comparison for people: totals per currency, then each difference.
func (t *Totals) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s from %s to %s\n", t.Kind, t.From.UTC().Format(time.RFC3339), t.To.UTC().Format(time.RFC3339))
	currencies := map[string]bool{}
	for c := range t.Here {
		currencies[c] = true
	}
	for c := range t.There {
		currencies[c] = true
	}
	var cs []string
	for c := range currencies {
		cs = append(cs, c)
	}
	sort.Strings(cs)
	fmt.Fprintf(&b, "  %-8s %11s %16s %11s %16s\n", "currency", "count here", "sum here", "count there", "sum there")
	for _, c := range cs {
		h, th := t.Here[c], t.There[c]
		mark := ""
		if h != th {
			mark = "  ≠"
		}
		fmt.Fprintf(&b, "  %-8s %11d %16d %11d %16d%s\n", c, h.Count, h.Amount, th.Count, th.Amount, mark)
	}
	if t.Match() {
		b.WriteString("  every effect matches\n")
		return b.String()
	}
	fmt.Fprintf(&b, "  %d differences:\n", len(t.Differences))
	for _, d := range t.Differences {
		switch d.Kind {
		case OnlyHere:
			fmt.Fprintf(&b, "  only here:      %s %q %d %s\n", d.Key, d.BusinessKey, d.OurAmount, d.OurCurrency)
		case OnlyThere:
			state := string(d.OurState)
			if state == "" {
				state = "not in the ledger"
			}
			fmt.Fprintf(&b, "  only there:     %s ref %q %d %s (%s)\n", d.Key, d.ExternalRef, d.Amount, d.Currency, state)
		case AmountDiffers:
			fmt.Fprintf(&b, "  amount differs: %s %q here %d %s, there %d %s\n", d.Key, d.BusinessKey, d.OurAmount, d.OurCurrency, d.Amount, d.Currency)
		}
	}
	return b.String()
}

// CompareTotals compares the ledger's SUCCEEDED operations of a kind over a period with the
// external system's statement for it, effect by effect (matched by idempotency key), and
// returns the totals per currency and every difference. It reads only; what to do about a
// difference is a person's decision (Resolve).
func CompareTotals(ctx context.Context, q stepwise.DBTX, stmt Statement, params *TotalsParams) (*Totals, error) {
	if params == nil || params.Kind == "" || params.From.IsZero() || params.To.IsZero() || !params.From.Before(params.To) {
		return nil, errors.New("reconcile.CompareTotals: TotalsParams needs a Kind and a period with From before To")
	}
	if stmt == nil {
		return nil, errors.New("reconcile.CompareTotals: statement is nil")
	}
	entries, err := stmt.Entries(ctx, params.From, params.To)
	if err != nil {
		return nil, fmt.Errorf("reading the statement: %w", err)
	}
	t := &Totals{Kind: params.Kind, From: params.From, To: params.To, Here: map[string]Sum{}, There: map[string]Sum{}}

	type ours struct {
		op      *outbox.Operation
		matched bool
	}
	here := map[string]*ours{}
	var order []string
	rows, err := q.Query(ctx, `SELECT `+ledger.Columns("o")+` FROM stepwise_operation o
		WHERE kind = $1 AND state = 'SUCCEEDED' AND last_sent_at >= $2 AND last_sent_at < $3
		ORDER BY last_sent_at, operation_id`, params.Kind, params.From, params.To)
	if err != nil {
		return nil, fmt.Errorf("reading the ledger's operations: %w", err)
	}
	ops, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (*outbox.Operation, error) { return ledger.Scan[*outbox.Operation](r) })
	if err != nil {
		return nil, fmt.Errorf("reading the ledger's operations: %w", err)
	}
	for _, op := range ops {
		key := op.IdempotencyKey()
		here[key] = &ours{op: op}
		order = append(order, key)
		s := t.Here[op.Currency]
		s.Count++
		s.Amount += op.Amount
		t.Here[op.Currency] = s
	}

	var unmatched []StatementEntry
	for _, e := range entries {
		s := t.There[e.Currency]
		s.Count++
		s.Amount += e.Amount
		t.There[e.Currency] = s
		o, ok := here[e.Key]
		if !ok {
			unmatched = append(unmatched, e)
			continue
		}
		o.matched = true
		if o.op.Amount != e.Amount || o.op.Currency != e.Currency {
			t.Differences = append(t.Differences, Difference{Kind: AmountDiffers, Key: e.Key, BusinessKey: o.op.BusinessKey,
				OurState: o.op.State, ExternalRef: e.ExternalRef, OurAmount: o.op.Amount, OurCurrency: o.op.Currency,
				Amount: e.Amount, Currency: e.Currency})
		}
	}
	for _, key := range order {
		if o := here[key]; !o.matched {
			t.Differences = append(t.Differences, Difference{Kind: OnlyHere, Key: key, BusinessKey: o.op.BusinessKey,
				OurState: o.op.State, ExternalRef: o.op.ExternalRef, OurAmount: o.op.Amount, OurCurrency: o.op.Currency})
		}
	}
	if len(unmatched) > 0 {
		// Say what the ledger holds for each, if anything: an UNKNOWN_EXTERNAL operation the
		// reconciler has yet to find is a different story from a payment nobody sent.
		states, err := statesOf(ctx, q, unmatched)
		if err != nil {
			return nil, err
		}
		for _, e := range unmatched {
			d := Difference{Kind: OnlyThere, Key: e.Key, ExternalRef: e.ExternalRef, Amount: e.Amount, Currency: e.Currency}
			if op, ok := states[e.Key]; ok {
				d.OurState, d.BusinessKey, d.OurAmount, d.OurCurrency = op.State, op.BusinessKey, op.Amount, op.Currency
			}
			t.Differences = append(t.Differences, d)
		}
	}
	return t, nil
}

func statesOf(ctx context.Context, q stepwise.DBTX, entries []StatementEntry) (map[string]*outbox.Operation, error) {
	var ids []uuid.UUID
	for _, e := range entries {
		if id, err := uuid.Parse(e.Key); err == nil {
			ids = append(ids, id)
		}
	}
	out := map[string]*outbox.Operation{}
	if len(ids) == 0 {
		return out, nil
	}
	rows, err := q.Query(ctx, `SELECT `+ledger.Columns("o")+` FROM stepwise_operation o WHERE operation_id = ANY($1)`, ids)
	if err != nil {
		return nil, fmt.Errorf("reading the ledger's operations: %w", err)
	}
	ops, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (*outbox.Operation, error) { return ledger.Scan[*outbox.Operation](r) })
	if err != nil {
		return nil, fmt.Errorf("reading the ledger's operations: %w", err)
	}
	for _, op := range ops {
		out[op.IdempotencyKey()] = op
	}
	return out, nil
}
