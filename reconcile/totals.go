package reconcile

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"
	"unsafe"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/stepwise-go/stepwise"
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
	// Entries returns the effects applied at or after from and before to. The slice is
	// CompareTotals's to keep for the call: it sorts it by Key in place.
	Entries(ctx context.Context, from, to time.Time) ([]StatementEntry, error)
}

// StatementFunc adapts a function to Statement.
type StatementFunc func(ctx context.Context, from, to time.Time) ([]StatementEntry, error)

// Entries calls f.
func (f StatementFunc) Entries(ctx context.Context, from, to time.Time) ([]StatementEntry, error) {
	return f(ctx, from, to)
}

// DefaultMaxDifferences is TotalsParams.MaxDifferences when it is zero.
const DefaultMaxDifferences = 1000

// TotalsParams selects what CompareTotals compares.
type TotalsParams struct {
	// Kind is the kind of operation compared. Required.
	Kind string
	// From (inclusive) and To (exclusive) bound the period. On the statement an effect is
	// dated by when the external system applied it; in the ledger by when it was sent, the
	// nearest moment the ledger records: the start of the operation's last request, or, when
	// its dispatcher died holding the claim (no request recorded, the reconciler proved the
	// outcome later), when that claim was taken. An operation sent just before To and applied
	// just after it shows up as a difference on each side of the boundary. Required.
	From, To time.Time
	// MaxDifferences bounds the differences listed of each DifferenceKind; beyond it they are
	// only counted (Totals.Counts), so that a statement missing a whole day cannot make the
	// result as large as the day. Default DefaultMaxDifferences.
	MaxDifferences int
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
	// Duplicate: on the statement again under a key it already lists: the external system
	// applied the effect more than once (OurState is the ledger's, "" when it has no such
	// operation).
	Duplicate DifferenceKind = "duplicate"
)

// differenceKinds is the order Totals lists differences in.
var differenceKinds = []DifferenceKind{AmountDiffers, OnlyHere, Duplicate, OnlyThere}

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
// statement over a period: count and sum per currency on each side, and the differences.
type Totals struct {
	Kind     string
	From, To time.Time
	Here     map[string]Sum // per currency, the ledger's SUCCEEDED operations
	There    map[string]Sum // per currency, the statement's entries
	// Differences lists the differences, at most TotalsParams.MaxDifferences of each kind, by
	// kind (amount differs, only here, duplicate, only there) and key.
	Differences []Difference
	// Counts is the number of differences of each kind found, listed or not.
	Counts map[DifferenceKind]int
}

// Match reports whether the two sides agree on every effect.
func (t *Totals) Match() bool { return t.DifferenceCount() == 0 }

// DifferenceCount is the number of differences found, listed or not.
func (t *Totals) DifferenceCount() int {
	n := 0
	for _, c := range t.Counts {
		n += c
	}
	return max(n, len(t.Differences))
}

// Omitted is the number of differences found but not listed (beyond MaxDifferences).
func (t *Totals) Omitted() int { return t.DifferenceCount() - len(t.Differences) }

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
	fmt.Fprintf(&b, "  %d differences:\n", t.DifferenceCount())
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
		case Duplicate:
			fmt.Fprintf(&b, "  duplicate:      %s ref %q %d %s applied again\n", d.Key, d.ExternalRef, d.Amount, d.Currency)
		}
	}
	if n := t.Omitted(); n > 0 {
		fmt.Fprintf(&b, "  ... and %d more not listed\n", n)
	}
	return b.String()
}

// sentAt is the moment an operation is dated by in totals (TotalsParams.From): its last
// request's start, or the claim its dispatcher died holding. The expression is the one
// migration 010's stepwise_operation_totals_idx is built on; keep them identical, or a day's
// totals read every SUCCEEDED operation of the kind.
const sentAt = `greatest(last_sent_at, claimed_at)`

// totalsWhere selects a kind's SUCCEEDED operations sent in [$2, $3): one range of
// stepwise_operation_totals_idx.
const totalsWhere = `FROM stepwise_operation WHERE kind = $1 AND state = 'SUCCEEDED' AND ` + sentAt + ` >= $2 AND ` + sentAt + ` < $3`

// CompareTotals compares the ledger's SUCCEEDED operations of a kind over a period with the
// external system's statement for it, effect by effect (matched by idempotency key), and
// returns the totals per currency and the differences. It reads only; what to do about a
// difference is a person's decision (Resolve).
//
// Its cost is bounded by the period, not by the ledger: the totals are summed by the database
// over one range of an index (migration 010), and the period's operations are streamed in key
// order and merged with the statement sorted by key, so memory holds the statement and at
// most MaxDifferences differences of each kind, never the period's operations. On a pool (or
// a *pgx.Conn) both reads are made in one read-only repeatable-read transaction, so the totals
// and the differences describe the same ledger; on a caller's transaction, in that one.
func CompareTotals(ctx context.Context, q stepwise.DBTX, stmt Statement, params *TotalsParams) (*Totals, error) {
	if params == nil || params.Kind == "" || params.From.IsZero() || params.To.IsZero() || !params.From.Before(params.To) {
		return nil, errors.New("reconcile.CompareTotals: TotalsParams needs a Kind and a period with From before To")
	}
	if params.MaxDifferences < 0 {
		return nil, fmt.Errorf("reconcile.CompareTotals: MaxDifferences %d: want 0 (the default, %d) or more", params.MaxDifferences, DefaultMaxDifferences)
	}
	if stmt == nil {
		return nil, errors.New("reconcile.CompareTotals: statement is nil")
	}
	limit := params.MaxDifferences
	if limit == 0 {
		limit = DefaultMaxDifferences
	}
	entries, err := stmt.Entries(ctx, params.From, params.To)
	if err != nil {
		return nil, fmt.Errorf("reading the statement: %w", err)
	}
	t := &Totals{Kind: params.Kind, From: params.From, To: params.To, Here: map[string]Sum{}, There: map[string]Sum{},
		Counts: map[DifferenceKind]int{}}
	for _, e := range entries {
		s := t.There[e.Currency]
		s.Count++
		s.Amount += e.Amount
		t.There[e.Currency] = s
	}
	// Key order, as the ledger streams its operations (a uuid's byte order is the order of its
	// lower-case text); a key applied twice keeps its entries in the order applied.
	if !slices.IsSortedFunc(entries, compareEntries) {
		slices.SortFunc(entries, compareEntries)
	}

	if b, ok := q.(interface {
		BeginTx(context.Context, pgx.TxOptions) (pgx.Tx, error)
	}); ok {
		tx, err := b.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
		if err != nil {
			return nil, fmt.Errorf("reading the ledger's totals: %w", err)
		}
		defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
		q = tx
	}
	if err := sumHere(ctx, q, params, t); err != nil {
		return nil, err
	}
	diffs := &differences{limit: limit, counts: t.Counts, byKind: map[DifferenceKind][]Difference{}}
	if err := mergeLedger(ctx, q, params, entries, diffs); err != nil {
		return nil, err
	}
	if err := diffs.describe(ctx, q); err != nil {
		return nil, err
	}
	for _, k := range differenceKinds {
		t.Differences = append(t.Differences, diffs.byKind[k]...)
	}
	return t, nil
}

func compareEntries(a, b StatementEntry) int {
	if c := strings.Compare(a.Key, b.Key); c != 0 {
		return c
	}
	return a.At.Compare(b.At)
}

// sumHere sums the period's SUCCEEDED operations per currency in the database: an index-only
// range scan of stepwise_operation_totals_idx on a settled day.
func sumHere(ctx context.Context, q stepwise.DBTX, params *TotalsParams, t *Totals) error {
	rows, err := q.Query(ctx, `SELECT coalesce(currency, ''), count(*), coalesce(sum(amount), 0)::bigint `+totalsWhere+` GROUP BY 1`,
		params.Kind, params.From, params.To)
	if err != nil {
		return fmt.Errorf("reading the ledger's totals: %w", err)
	}
	var cur string
	var s Sum
	if _, err := pgx.ForEachRow(rows, []any{&cur, &s.Count, &s.Amount}, func() error {
		t.Here[cur] = s
		return nil
	}); err != nil {
		return fmt.Errorf("reading the ledger's totals: %w", err)
	}
	return nil
}

// mergeLedger streams the period's SUCCEEDED operations in key order (key, amount and
// currency only: never a payload) and merges them with the statement sorted by key, recording
// every difference in diffs. Memory does not grow with the period: one row at a time.
func mergeLedger(ctx context.Context, q stepwise.DBTX, params *TotalsParams, entries []StatementEntry, diffs *differences) error {
	rows, err := q.Query(ctx, `SELECT operation_id, coalesce(amount, 0), coalesce(currency, '') `+totalsWhere+` ORDER BY operation_id`,
		params.Kind, params.From, params.To)
	if err != nil {
		return fmt.Errorf("reading the ledger's operations: %w", err)
	}
	var (
		id     uuid.UUID
		amount int64
		cur    string
		text   [36]byte
		i      int
	)
	if _, err := pgx.ForEachRow(rows, []any{&id, &amount, &cur}, func() error {
		key := keyText(&text, id)
		for i < len(entries) && entries[i].Key < key {
			diffs.onlyThere(entries[i])
			i++
		}
		if i == len(entries) || entries[i].Key != key {
			diffs.add(Difference{Kind: OnlyHere, Key: strings.Clone(key), OurState: outbox.StateSucceeded, OurAmount: amount, OurCurrency: cur}, id)
			return nil
		}
		e := entries[i]
		i++
		if e.Amount != amount || e.Currency != cur {
			diffs.add(Difference{Kind: AmountDiffers, Key: e.Key, OurState: outbox.StateSucceeded, ExternalRef: e.ExternalRef,
				OurAmount: amount, OurCurrency: cur, Amount: e.Amount, Currency: e.Currency}, id)
		}
		for i < len(entries) && entries[i].Key == key {
			e := entries[i]
			diffs.add(Difference{Kind: Duplicate, Key: e.Key, OurState: outbox.StateSucceeded, ExternalRef: e.ExternalRef,
				OurAmount: amount, OurCurrency: cur, Amount: e.Amount, Currency: e.Currency}, id)
			i++
		}
		return nil
	}); err != nil {
		return fmt.Errorf("reading the ledger's operations: %w", err)
	}
	for ; i < len(entries); i++ {
		diffs.onlyThere(entries[i])
	}
	return nil
}

// keyText writes id's canonical text (the idempotency key) into buf and returns it as a
// string sharing buf's memory: valid until the next call, compared without allocating.
func keyText(buf *[36]byte, id uuid.UUID) string {
	const hexDigits = "0123456789abcdef"
	j := 0
	for k, b := range id {
		if k == 4 || k == 6 || k == 8 || k == 10 {
			buf[j] = '-'
			j++
		}
		buf[j], buf[j+1] = hexDigits[b>>4], hexDigits[b&0x0f]
		j += 2
	}
	return unsafe.String(&buf[0], len(buf))
}

// differences collects what CompareTotals lists: at most limit of each kind, every one
// counted.
type differences struct {
	limit  int
	counts map[DifferenceKind]int
	byKind map[DifferenceKind][]Difference
	// ids of the listed differences the ledger holds, to read their business keys and
	// external references in one query; and of the listed "only there" keys, to say what the
	// ledger holds for each, if anything.
	ours, theirs []uuid.UUID
}

// add records d; id is the ledger's operation it concerns.
func (ds *differences) add(d Difference, id uuid.UUID) {
	ds.counts[d.Kind]++
	if len(ds.byKind[d.Kind]) >= ds.limit {
		return
	}
	ds.byKind[d.Kind] = append(ds.byKind[d.Kind], d)
	ds.ours = append(ds.ours, id)
}

// onlyThere records an entry the period's SUCCEEDED operations do not have. The ledger may
// still hold its key (not SUCCEEDED, or sent in another period): describe says so.
func (ds *differences) onlyThere(e StatementEntry) {
	ds.counts[OnlyThere]++
	if len(ds.byKind[OnlyThere]) >= ds.limit {
		return
	}
	ds.byKind[OnlyThere] = append(ds.byKind[OnlyThere], Difference{Kind: OnlyThere, Key: e.Key, ExternalRef: e.ExternalRef,
		Amount: e.Amount, Currency: e.Currency})
	if id, err := uuid.Parse(e.Key); err == nil {
		ds.theirs = append(ds.theirs, id)
	}
}

// describe reads what the ledger holds for the listed differences: business keys and
// references of ours, and, for each key only on the statement, the ledger's operation if any
// (an UNKNOWN_EXTERNAL operation the reconciler has yet to find is a different story from a
// payment nobody sent). At most 4 × limit rows.
func (ds *differences) describe(ctx context.Context, q stepwise.DBTX) error {
	ids := append(slices.Clone(ds.ours), ds.theirs...)
	if len(ids) == 0 {
		return nil
	}
	rows, err := q.Query(ctx, `SELECT operation_id, business_key, state, coalesce(external_ref, ''), coalesce(amount, 0), coalesce(currency, '')
		FROM stepwise_operation WHERE operation_id = ANY($1)`, ids)
	if err != nil {
		return fmt.Errorf("reading the ledger's side of the differences: %w", err)
	}
	type ours struct {
		businessKey, ref, currency string
		state                      outbox.State
		amount                     int64
	}
	found := map[string]ours{}
	var id uuid.UUID
	var o ours
	if _, err := pgx.ForEachRow(rows, []any{&id, &o.businessKey, &o.state, &o.ref, &o.amount, &o.currency}, func() error {
		found[id.String()] = o
		return nil
	}); err != nil {
		return fmt.Errorf("reading the ledger's side of the differences: %w", err)
	}
	for _, k := range differenceKinds {
		list := ds.byKind[k]
		for i := range list {
			d := &list[i]
			key := d.Key
			if k == OnlyThere {
				// A key of another spelling (upper case) still names our operation.
				if id, err := uuid.Parse(key); err == nil {
					key = id.String()
				}
			}
			o, ok := found[key]
			if !ok {
				continue
			}
			d.BusinessKey = o.businessKey
			switch k {
			case OnlyHere:
				d.ExternalRef = o.ref
			case OnlyThere:
				d.OurState, d.OurAmount, d.OurCurrency = o.state, o.amount, o.currency
			}
		}
	}
	return nil
}
