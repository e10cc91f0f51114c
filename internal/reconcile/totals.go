package reconcile

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"slices"
	"sort"
	"strings"
	"time"
	"unsafe"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/stepwise-go/stepwise/internal/outbox"
	"github.com/stepwise-go/stepwise/stepwisetype"
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
	// CompareTotals's to keep for the call: it reorders it in place.
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
	// result as large as the day. Default 1,000.
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
	// DifferenceOnlyHere: SUCCEEDED in the ledger, missing from the statement.
	DifferenceOnlyHere DifferenceKind = "only_here"
	// DifferenceOnlyThere: on the statement, not SUCCEEDED in the ledger (OurState says what the ledger
	// holds, if anything: UNKNOWN_EXTERNAL means the reconciler has yet to find it).
	DifferenceOnlyThere DifferenceKind = "only_there"
	// DifferenceAmountDiffers: on both, with different amounts or currencies.
	DifferenceAmountDiffers DifferenceKind = "amount_differs"
	// DifferenceDuplicate: on the statement again under a key it already lists: the external system
	// applied the effect more than once (OurState is the ledger's, "" when it has no such
	// operation).
	DifferenceDuplicate DifferenceKind = "duplicate"
)

// differenceKinds is the order Totals lists differences in.
var differenceKinds = []DifferenceKind{DifferenceAmountDiffers, DifferenceOnlyHere, DifferenceDuplicate, DifferenceOnlyThere}

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
	// Differences lists the differences by kind (amount differs, only here, duplicate, only
	// there) and, within a kind, by key. Beyond TotalsParams.MaxDifferences of a kind the rest
	// are only counted (Counts), so a long list is a sample, not the lowest keys: the first
	// found (the earliest sent of those the ledger holds, the first buckets' of the others).
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
		case DifferenceOnlyHere:
			fmt.Fprintf(&b, "  only here:      %s %q %d %s\n", d.Key, d.BusinessKey, d.OurAmount, d.OurCurrency)
		case DifferenceOnlyThere:
			state := string(d.OurState)
			if state == "" {
				state = "not in the ledger"
			}
			fmt.Fprintf(&b, "  only there:     %s ref %q %d %s (%s)\n", d.Key, d.ExternalRef, d.Amount, d.Currency, state)
		case DifferenceAmountDiffers:
			fmt.Fprintf(&b, "  amount differs: %s %q here %d %s, there %d %s\n", d.Key, d.BusinessKey, d.OurAmount, d.OurCurrency, d.Amount, d.Currency)
		case DifferenceDuplicate:
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
// migration 012's stepwise_operation_totals_idx is built on; keep them identical, or a day's
// totals read every SUCCEEDED operation of the kind.
const sentAt = `greatest(last_sent_at, claimed_at)`

// ledgerSQL reads a kind's SUCCEEDED operations sent in [$2, $3): key, amount and currency,
// in the order of the index range, from the index alone on a settled day.
const ledgerSQL = `SELECT operation_id, coalesce(amount, 0), coalesce(currency, '') FROM stepwise_operation
	WHERE kind = $1 AND state = 'SUCCEEDED' AND ` + sentAt + ` >= $2 AND ` + sentAt + ` < $3`

// CompareTotals compares the ledger's SUCCEEDED operations of a kind over a period with the
// external system's statement for it, effect by effect (matched by idempotency key), and
// returns the totals per currency and the differences. It reads only; what to do about a
// difference is a person's decision (Resolve).
//
// Its cost is bounded by the period, not by the ledger, and its memory by neither: the
// database selects the period with one range of an index (migration 012) and streams key,
// amount and currency of each operation once, never a payload; the totals are summed and each
// operation is looked up in the statement (reordered in place into buckets by a hash of the
// key, with a fixed-size index of them) as it streams, so memory holds the statement
// the caller returned, one bit per entry, and at most MaxDifferences differences of each kind.
func CompareTotals(ctx context.Context, q stepwisetype.DBTX, stmt Statement, params *TotalsParams) (*Totals, error) {
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
	idx := newKeyIndex(entries)
	diffs := &differences{limit: limit, counts: t.Counts, byKind: map[DifferenceKind][]Difference{}}
	if err := streamLedger(ctx, q, params, idx, t, diffs); err != nil {
		return nil, err
	}
	// What the ledger's operations had no match for, bucket by bucket; a key listed again
	// right after itself was applied more than once.
	for i, e := range idx.entries {
		switch {
		case i > 0 && e.Key == idx.entries[i-1].Key:
			diffs.add(Difference{Kind: DifferenceDuplicate, Key: e.Key, ExternalRef: e.ExternalRef, Amount: e.Amount, Currency: e.Currency})
		case !idx.isMatched(i):
			diffs.add(Difference{Kind: DifferenceOnlyThere, Key: e.Key, ExternalRef: e.ExternalRef, Amount: e.Amount, Currency: e.Currency})
		}
	}
	if err := diffs.describe(ctx, q); err != nil {
		return nil, err
	}
	for _, k := range differenceKinds {
		// Found in the ledger's order (when each was sent) or the index's (bucket by
		// bucket): listed by key, as Differences says.
		list := diffs.byKind[k]
		slices.SortStableFunc(list, func(a, b Difference) int { return strings.Compare(a.Key, b.Key) })
		t.Differences = append(t.Differences, list...)
	}
	return t, nil
}

// keyIndex finds a key in the statement, reordered in place into buckets: starts[p] is the
// first entry of bucket p, the keys whose hash (keyBucket) is p, sorted by key within the
// bucket. A lookup compares the one or two keys of its bucket on a day of a million.
//
// The bucket is a hash of the whole key, not a run of its digits: a dated operation id
// (outbox.DatedOperationID) begins with its date, so every key of a day shares its first twelve
// hex digits, and a caller's own ids (EnqueueParams.ID) may end alike (version 1 and 6 uuids end
// in the host's node id). An index of the first five digits put a whole day of dated ids in one
// bucket.
//
// Each comparison reads a key's bytes, wherever the statement's parser put them: on a day of a
// million that is a cache miss, and it was most of CompareTotals' time when a bucket held four
// keys. The index is 4 MiB whatever the day, and 4 MiB more while it is built.
type keyIndex struct {
	entries []StatementEntry
	starts  []int32 // the 1<<keyBits buckets, and the end of the last
	matched []uint64
}

// keyBits is the width of a bucket's number: 1,048,576 buckets.
const keyBits = 20

// newKeyIndex reorders entries in place and indexes them: each placed in its bucket in one
// pass (American flag sort), then each bucket sorted by key. A key applied twice keeps its
// entries next to each other, in the order applied.
func newKeyIndex(entries []StatementEntry) *keyIndex {
	n := 1 << keyBits
	// Two passes over the keys: count, then place.
	ends := make([]int32, n+1)
	for _, e := range entries {
		ends[keyBucket(e.Key)+1]++
	}
	for p := range n {
		ends[p+1] += ends[p]
	}
	// next[p] is where bucket p's next entry goes; ends[p+1] stays bucket p's end (and
	// bucket p+1's start), since placing an entry from an earlier bucket moves next[p+1].
	next := slices.Clone(ends[:n])
	for p := range n {
		for next[p] < ends[p+1] {
			i := next[p]
			q := keyBucket(entries[i].Key)
			if q == p {
				next[p]++
				continue
			}
			entries[i], entries[next[q]] = entries[next[q]], entries[i]
			next[q]++
		}
		if b := entries[ends[p]:ends[p+1]]; len(b) > 1 {
			slices.SortFunc(b, compareEntries)
		}
	}
	return &keyIndex{entries: entries, starts: ends, matched: make([]uint64, (len(entries)+63)/64)}
}

// keyBucket is key's bucket: a hash of all its bytes, eight at a time (multiply and fold,
// then MurmurHash3's finalizer, so that keys differing in a few digits anywhere, as the
// uuids of one host a moment apart do, land far apart), the same for the same key in every
// process: hash/maphash seeds at random, and the sample of differences listed beyond
// MaxDifferences would change from one comparison of a day to the next. Every key has one:
// a key of another spelling than the ledger's (upper case, short) lands in some bucket,
// where no ledger key matches it.
func keyBucket(key string) int {
	const m = 0x9e3779b97f4a7c15 // 2^64 / the golden ratio: odd, its bits well mixed
	h := uint64(len(key)) * m
	for ; len(key) >= 8; key = key[8:] {
		w := uint64(key[0]) | uint64(key[1])<<8 | uint64(key[2])<<16 | uint64(key[3])<<24 |
			uint64(key[4])<<32 | uint64(key[5])<<40 | uint64(key[6])<<48 | uint64(key[7])<<56
		h = bits.RotateLeft64((h^w)*m, 31)
	}
	for i := range len(key) {
		h = bits.RotateLeft64((h^uint64(key[i]))*m, 31)
	}
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	h *= 0xc4ceb9fe1a85ec53
	h ^= h >> 33
	return int(h >> (64 - keyBits))
}

func compareEntries(a, b StatementEntry) int {
	if c := strings.Compare(a.Key, b.Key); c != 0 {
		return c
	}
	return a.At.Compare(b.At)
}

// findFrom returns the index of the first entry under key in entries[lo:hi], sorted by key,
// or -1. A bucket holds a few keys, compared in order; more than 8 left to compare (keys
// chosen to share a bucket) are searched by halves, so that no statement can make a lookup
// cost all of it.
func (x *keyIndex) findFrom(key string, lo, hi int) int {
	if hi-lo > 8 {
		lo += sort.Search(hi-lo, func(j int) bool { return x.entries[lo+j].Key >= key })
		if lo < hi && x.entries[lo].Key == key {
			return lo
		}
		return -1
	}
	for i := lo; i < hi; i++ {
		switch c := strings.Compare(x.entries[i].Key, key); {
		case c == 0:
			return i
		case c > 0:
			return -1
		}
	}
	return -1
}

func (x *keyIndex) match(i int)          { x.matched[i/64] |= 1 << (i % 64) }
func (x *keyIndex) isMatched(i int) bool { return x.matched[i/64]&(1<<(i%64)) != 0 }

const hexDigits = "0123456789abcdef"

// lookupBatch is how many of the ledger's rows are looked up in the statement together.
const lookupBatch = 256

// streamLedger reads the period's SUCCEEDED operations once, in index order (key, amount
// and currency only), sums them per currency into t.Here and looks each up in the statement,
// recording every difference in diffs. lookupBatch rows at a time: memory does not grow with
// the period.
//
// A lookup is a chain of reads the CPU cannot guess: the bucket's start, the entry there, the
// bytes of its key. On a day of a million each is a cache miss, and one row's chain cannot
// begin before the last one's ended when each row is looked up as it arrives. Looked up a batch
// at a time, one step for every row of the batch before the next step, the reads of a step are
// independent of each other and the CPU has many in flight at once.
func streamLedger(ctx context.Context, q stepwisetype.DBTX, params *TotalsParams, idx *keyIndex, t *Totals, diffs *differences) error {
	rows, err := q.Query(ctx, ledgerSQL, params.Kind, params.From, params.To)
	if err != nil {
		return fmt.Errorf("reading the ledger's operations: %w", err)
	}
	defer rows.Close()
	// Per-currency sums, found by the currency's bytes: no string per row.
	type sum struct {
		currency string
		Sum
	}
	var sums []sum
	var (
		id     uuid.UUID
		amount int64
		cur    []byte
	)
	// The batch: each row's key text, amount, currency (as an index into sums) and, as the
	// lookup goes, the bounds of its bucket and the first key there.
	var (
		keys     [lookupBatch][36]byte
		amounts  [lookupBatch]int64
		currency [lookupBatch]int
		lo, hi   [lookupBatch]int32
		first    [lookupBatch]string
	)
	n := 0
	lookUp := func() {
		for j := range n {
			p := keyBucket(unsafe.String(&keys[j][0], 36))
			lo[j], hi[j] = idx.starts[p], idx.starts[p+1]
		}
		for j := range n {
			if lo[j] < hi[j] {
				first[j] = idx.entries[lo[j]].Key
			}
		}
		for j := range n {
			key := unsafe.String(&keys[j][0], 36)
			i := -1
			switch {
			case lo[j] == hi[j]:
			case first[j] == key:
				i = int(lo[j])
			case first[j] < key:
				i = idx.findFrom(key, int(lo[j])+1, int(hi[j]))
			}
			c := sums[currency[j]].currency
			if i < 0 {
				diffs.add(Difference{Kind: DifferenceOnlyHere, Key: strings.Clone(key), OurState: outbox.StateSucceeded, OurAmount: amounts[j], OurCurrency: c})
				continue
			}
			idx.match(i)
			if e := idx.entries[i]; e.Amount != amounts[j] || e.Currency != c {
				diffs.add(Difference{Kind: DifferenceAmountDiffers, Key: e.Key, OurState: outbox.StateSucceeded, ExternalRef: e.ExternalRef,
					OurAmount: amounts[j], OurCurrency: c, Amount: e.Amount, Currency: e.Currency})
			}
		}
		n = 0
	}
	raw := false
	if fd := rows.FieldDescriptions(); len(fd) == 3 && fd[0].Format == pgx.BinaryFormatCode && fd[1].Format == pgx.BinaryFormatCode {
		// The usual extended protocol: uuid and bigint in binary, read without a scan per row.
		raw = true
	}
	for rows.Next() {
		if raw {
			v := rows.RawValues()
			if len(v[0]) != 16 || len(v[1]) != 8 {
				return fmt.Errorf("reading the ledger's operations: unexpected row encoding (%d, %d bytes)", len(v[0]), len(v[1]))
			}
			copy(id[:], v[0])
			amount = int64(binary.BigEndian.Uint64(v[1]))
			cur = v[2]
		} else {
			var c string
			if err := rows.Scan(&id, &amount, &c); err != nil {
				return fmt.Errorf("reading the ledger's operations: %w", err)
			}
			cur = []byte(c)
		}
		k := -1
		for j := range sums {
			if sums[j].currency == string(cur) {
				k = j
				break
			}
		}
		if k < 0 {
			sums = append(sums, sum{currency: string(cur)})
			k = len(sums) - 1
		}
		sums[k].Count++
		sums[k].Amount += amount

		keyText(&keys[n], id)
		amounts[n], currency[n] = amount, k
		if n++; n == lookupBatch {
			lookUp()
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("reading the ledger's operations: %w", err)
	}
	lookUp()
	for _, s := range sums {
		t.Here[s.currency] = s.Sum
	}
	return nil
}

// keyText writes id's canonical text (the idempotency key) into buf, without allocating.
func keyText(buf *[36]byte, id uuid.UUID) {
	j := 0
	for k, b := range id {
		if k == 4 || k == 6 || k == 8 || k == 10 {
			buf[j] = '-'
			j++
		}
		buf[j], buf[j+1] = hexDigits[b>>4], hexDigits[b&0x0f]
		j += 2
	}
}

// differences collects what CompareTotals lists: at most limit of each kind, every one
// counted.
type differences struct {
	limit  int
	counts map[DifferenceKind]int
	byKind map[DifferenceKind][]Difference
}

func (ds *differences) add(d Difference) {
	ds.counts[d.Kind]++
	if len(ds.byKind[d.Kind]) < ds.limit {
		ds.byKind[d.Kind] = append(ds.byKind[d.Kind], d)
	}
}

// describe reads what the ledger holds for the listed differences, in one query of at most
// 4 × limit keys: business keys and references of ours and, for a key on the statement
// only, the ledger's operation if any (an UNKNOWN_EXTERNAL operation the reconciler has yet
// to find is a different story from a payment nobody sent; a SUCCEEDED one sent on another
// day is a boundary, not a loss).
func (ds *differences) describe(ctx context.Context, q stepwisetype.DBTX) error {
	var ids []uuid.UUID
	for _, list := range ds.byKind {
		for _, d := range list {
			if id, err := uuid.Parse(d.Key); err == nil {
				ids = append(ids, id)
			}
		}
	}
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
	found := map[uuid.UUID]ours{}
	var id uuid.UUID
	var o ours
	if _, err := pgx.ForEachRow(rows, []any{&id, &o.businessKey, &o.state, &o.ref, &o.amount, &o.currency}, func() error {
		found[id] = o
		return nil
	}); err != nil {
		return fmt.Errorf("reading the ledger's side of the differences: %w", err)
	}
	for k, list := range ds.byKind {
		for i := range list {
			d := &list[i]
			id, err := uuid.Parse(d.Key) // a key of another spelling (upper case) still names our operation
			if err != nil {
				continue
			}
			o, ok := found[id]
			if !ok {
				continue
			}
			d.BusinessKey = o.businessKey
			switch k {
			case DifferenceOnlyHere:
				d.ExternalRef = o.ref
			case DifferenceOnlyThere, DifferenceDuplicate:
				d.OurState, d.OurAmount, d.OurCurrency = o.state, o.amount, o.currency
			}
		}
	}
	return nil
}
